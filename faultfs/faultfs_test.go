package faultfs

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// onDisk reads name from the OS, as the process after a power loss would.
func onDisk(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return b
}

func create(t *testing.T, fs *FS, name string) vfs.File {
	t.Helper()
	f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func write(t *testing.T, f vfs.File, s string) {
	t.Helper()
	if _, err := f.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

// createSynced creates name holding s, synced, and closes it.
func createSynced(t *testing.T, fs *FS, name, s string) {
	t.Helper()
	f := create(t, fs, name)
	defer f.Close()
	write(t, f, s)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readAll(t *testing.T, fs vfs.FS, name string) []byte {
	t.Helper()
	f, err := fs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestUnsyncedWritesAreLost(t *testing.T) {
	name := filepath.Join(t.TempDir(), "f")
	fs := New(vfs.Default)
	f := create(t, fs, name)
	write(t, f, "hello")
	if err := f.Close(); err != nil { // closing does not sync
		t.Fatal(err)
	}
	if got := readAll(t, fs, name); string(got) != "hello" {
		t.Fatalf("read before the crash: %q", got)
	}
	if !fs.Unsynced(name) {
		t.Fatal("Unsynced = false before any sync")
	}
	// The crash: the wrapper is dropped; the OS file is what survives.
	if got := onDisk(t, name); len(got) != 0 {
		t.Fatalf("unsynced bytes on disk: %q", got)
	}
}

func TestSyncedWritesSurvive(t *testing.T) {
	for _, sync := range []struct {
		name string
		do   func(vfs.File) error
	}{
		{"Sync", vfs.File.Sync},
		{"SyncData", vfs.File.SyncData},
		{"SyncTo", func(f vfs.File) error {
			full, err := f.SyncTo(3)
			if err == nil && !full {
				panic("SyncTo: not a full sync")
			}
			return err
		}},
	} {
		t.Run(sync.name, func(t *testing.T) {
			name := filepath.Join(t.TempDir(), "f")
			fs := New(vfs.Default)
			f := create(t, fs, name)
			write(t, f, "synced")
			if err := sync.do(f); err != nil {
				t.Fatal(err)
			}
			write(t, f, "+lost")
			if got := readAll(t, fs, name); string(got) != "synced+lost" {
				t.Fatalf("read before the crash: %q", got)
			}
			f.Close()
			if got := onDisk(t, name); string(got) != "synced" {
				t.Fatalf("on disk after the crash: %q, want %q", got, "synced")
			}
		})
	}
}

func TestReadYourWritesAndOverlays(t *testing.T) {
	name := filepath.Join(t.TempDir(), "f")
	fs := New(vfs.Default)
	createSynced(t, fs, name, "0123456789")
	f, err := fs.OpenReadWrite(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Overlays inside the synced bytes, past them, and over each other.
	for _, w := range []struct {
		s   string
		off int64
	}{{"ab", 2}, {"XYZ", 12}, {"c", 3}, {"W", 11}} {
		if _, err := f.WriteAt([]byte(w.s), w.off); err != nil {
			t.Fatal(err)
		}
	}
	want := []byte("01ac456789\x00WXYZ")
	if fi, err := f.Stat(); err != nil || fi.Size() != int64(len(want)) {
		t.Fatalf("File.Stat: %v, %v; want size %d", fi, err, len(want))
	}
	if fi, err := fs.Stat(name); err != nil || fi.Size() != int64(len(want)) {
		t.Fatalf("FS.Stat: %v, %v; want size %d", fi, err, len(want))
	}
	if got := readAll(t, fs, name); !bytes.Equal(got, want) {
		t.Fatalf("read %q, want %q", got, want)
	}
	buf := make([]byte, 6)
	if n, err := f.ReadAt(buf, 1); n != 6 || err != nil || string(buf) != "1ac456" {
		t.Fatalf("ReadAt(1) = %d %v %q", n, err, buf)
	}
	if n, err := f.ReadAt(buf, 12); n != 3 || err != io.EOF || string(buf[:n]) != "XYZ" {
		t.Fatalf("ReadAt(12) = %d %v %q: want 3 bytes and EOF", n, err, buf[:n])
	}
	if got := onDisk(t, name); string(got) != "0123456789" {
		t.Fatalf("on disk before the sync: %q", got)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := onDisk(t, name); !bytes.Equal(got, want) {
		t.Fatalf("on disk after the sync: %q, want %q", got, want)
	}
	if fs.Unsynced(name) {
		t.Fatal("Unsynced after the sync")
	}
}

func TestOverlayFollowsRenameAndLink(t *testing.T) {
	dir := t.TempDir()
	a, b, c := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")
	fs := New(vfs.Default)
	f := create(t, fs, a)
	write(t, f, "data")
	f.Close()
	if err := fs.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, fs, b); string(got) != "data" {
		t.Fatalf("renamed file reads %q", got)
	}
	if err := fs.Link(b, c); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, fs, c); string(got) != "data" {
		t.Fatalf("linked file reads %q", got)
	}
	if err := fs.Remove(b); err != nil {
		t.Fatal(err)
	}
	if fs.Unsynced(b) || !fs.Unsynced(c) {
		t.Fatal("Remove dropped the wrong overlay")
	}
	// A truncating Create drops the overlay.
	f = create(t, fs, c)
	f.Close()
	if got := readAll(t, fs, c); len(got) != 0 {
		t.Fatalf("recreated file reads %q", got)
	}
}

func TestConcurrentWritersAndReaders(t *testing.T) {
	name := filepath.Join(t.TempDir(), "f")
	fs := New(vfs.Default)
	f := create(t, fs, name)
	defer f.Close()
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 200 {
			if _, err := f.Write([]byte("x")); err != nil {
				t.Error(err)
				return
			}
		}
		if err := f.Sync(); err != nil {
			t.Error(err)
		}
	})
	wg.Go(func() {
		r, err := fs.Open(name)
		if err != nil {
			t.Error(err)
			return
		}
		defer r.Close()
		buf := make([]byte, 64)
		for range 200 {
			n, _ := r.ReadAt(buf, 0)
			if bytes.Count(buf[:n], []byte("x")) != n {
				t.Errorf("read %q", buf[:n])
				return
			}
		}
	})
	wg.Wait()
	if got := onDisk(t, name); len(got) != 200 {
		t.Fatalf("%d bytes on disk, want 200", len(got))
	}
}

// TestReuseForWrite: a recycled file (Pebble's WAL recycling) keeps its
// old synced bytes on disk under the new name; unsynced writes over them
// are read back but lost in a crash.
func TestReuseForWrite(t *testing.T) {
	dir := t.TempDir()
	old, recycled := filepath.Join(dir, "000001.log"), filepath.Join(dir, "000002.log")
	fs := New(vfs.Default)
	createSynced(t, fs, old, "OLDOLDOLD")
	f, err := fs.ReuseForWrite(old, recycled, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write(t, f, "new")
	if got := readAll(t, fs, recycled); string(got) != "newOLDOLD" {
		t.Fatalf("recycled file reads %q", got)
	}
	if _, err := fs.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("old name after ReuseForWrite: %v", err)
	}
	if got := onDisk(t, recycled); string(got) != "OLDOLDOLD" {
		t.Fatalf("on disk after the crash: %q", got)
	}
	if err := fs.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if fs.Unsynced(recycled) {
		t.Fatal("RemoveAll left the overlay")
	}
}
