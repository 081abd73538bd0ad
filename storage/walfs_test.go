package storage

import (
	"bytes"
	"io"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// syncCounter counts the SyncData calls of the files it opens.
type syncCounter struct {
	vfs.FS
	syncs *int
}

func (fs syncCounter) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	return countedFile{File: f, syncs: fs.syncs}, err
}

func (fs syncCounter) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	return countedFile{File: f, syncs: fs.syncs}, err
}

type countedFile struct {
	vfs.File
	syncs *int
}

func (f countedFile) SyncData() error {
	*f.syncs++
	return f.File.SyncData()
}

func fileBytes(t *testing.T, fs vfs.FS, name string) []byte {
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

// TestPrewrittenWAL: a log is written over zeros written (and synced)
// ahead of it, in steps that double up to zeroStepMax, so that its
// writes overwrite and do not grow the file; what was written reads
// back, with zeros after it. Other files, and Preallocate, are left
// alone; a recycled log is written over without zeros while it fits.
func TestPrewrittenWAL(t *testing.T) {
	dir := t.TempDir()
	syncs := 0
	fs := prewrittenWALs{syncCounter{FS: vfs.Default, syncs: &syncs}}

	name := filepath.Join(dir, "000001.log")
	f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := f.(*prewrittenFile); !ok {
		t.Fatalf("a log is a %T, want a *prewrittenFile", f)
	}
	if err := f.Preallocate(0, 64<<20); err != nil {
		t.Fatal(err)
	}
	size := func() int64 {
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	if got := size(); got != 0 {
		t.Fatalf("size %d after Preallocate, want 0 (it reserves nothing)", got)
	}

	var written bytes.Buffer
	chunk := bytes.Repeat([]byte{0xab}, 4096)
	write := func(n int) {
		for range n {
			if _, err := f.Write(chunk); err != nil {
				t.Fatal(err)
			}
			written.Write(chunk)
		}
	}
	write(1)
	if got, want := size(), int64(4096+zeroStepMin); got != want {
		t.Fatalf("size %d after the first write, want %d (zeros a step ahead)", got, want)
	}
	if syncs != 1 {
		t.Fatalf("%d syncs after the first step, want 1", syncs)
	}
	// Up to the zeros' end: no more steps, the size stays.
	write(zeroStepMin / 4096)
	if got, want := size(), int64(4096+zeroStepMin); got != want || syncs != 1 {
		t.Fatalf("size %d with %d syncs after writing within the zeros, want %d and 1", got, syncs, want)
	}
	// 40 MiB in all: the steps double (1, 2, 4, 8 MiB...) and stop at
	// zeroStepMax, so a few syncs grew the file, not one per write.
	write((40<<20)/4096 - written.Len()/4096)
	if syncs > 12 {
		t.Fatalf("%d syncs grew the file for 40 MiB written", syncs)
	}
	end := size()
	if end < int64(written.Len()) || end > int64(written.Len())+zeroStepMax+zeroStepMin {
		t.Fatalf("size %d after writing %d", end, written.Len())
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got := fileBytes(t, vfs.Default, name)
	if !bytes.Equal(got[:written.Len()], written.Bytes()) {
		t.Fatal("the log does not read back as written")
	}
	if tail := got[written.Len():]; !bytes.Equal(tail, make([]byte, len(tail))) {
		t.Fatal("the log's tail is not zeros")
	}

	// A recycled log: written over from its start, no zeros while the
	// writes fit in its old size.
	syncs = 0
	g, err := fs.ReuseForWrite(name, filepath.Join(dir, "000002.log"), vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Write(bytes.Repeat([]byte{0xcd}, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if fi, err := g.Stat(); err != nil || fi.Size() != end || syncs != 0 {
		t.Fatalf("recycled log: size %v (%v) and %d syncs, want %d and 0", fi.Size(), err, syncs, end)
	}
	g.Close()

	// Not a log: no wrapper.
	h, err := fs.Create(filepath.Join(dir, "000003.sst"), vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, ok := h.(*prewrittenFile); ok {
		t.Fatal("an sstable got the log wrapper")
	}
}
