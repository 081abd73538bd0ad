package storage

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/faultfs"
	"github.com/norn-dev/norn/testhooks"
)

// crashImage copies the files of dir as they are on disk (what a power
// loss leaves of a database run on faultfs) to a new directory.
func crashImage(t *testing.T, dir string) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "db")
	if err := os.CopyFS(img, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestPowerLossOnFaultFS runs a Store on faultfs over the OS filesystem,
// acks 20 synced merges, then 20 more as configured (synced, or acked
// before their sync with the seeded bug AckBeforeSync); then it takes the
// files on disk as a power loss would leave them and opens them on the
// plain OS filesystem: the store opens cleanly with consistent indexes,
// every synced task is there, and with the bug the unsynced ones are gone.
func TestPowerLossOnFaultFS(t *testing.T) {
	for _, bug := range testhooks.BugCases() {
		t.Run(map[bool]string{false: "synced", true: "ack-before-sync"}[bug], func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "db")
			fs := faultfs.New(vfs.Default)
			s, err := Open(Config{Dir: dir, FS: fs, Clock: &testClock{ms: t0}, CacheBytes: 8 << 20, AckBeforeSync: bug})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close() // after the crash image is taken
			if s.noSync != bug {
				t.Fatal("Config.AckBeforeSync not applied")
			}
			acked := map[uint64]uint64{}
			for id := uint64(1); id <= 40; id++ {
				s.noSync = bug && id > 20
				res := mustMerge(t, s, uint16(id%4), newTask(id, "q", 0))
				acked[id] = res[0].NewDigest
			}
			for _, id := range []uint64{1, 2, 3} { // read your writes
				if _, err := s.GetTask(uint16(id%4), id); err != nil {
					t.Fatalf("task %d unreadable before the crash: %v", id, err)
				}
			}
			img := crashImage(t, dir)
			after, err := Open(Config{Dir: img, Clock: &testClock{ms: t0}, CacheBytes: 8 << 20})
			if err != nil {
				t.Fatalf("the crashed store does not open: %v", err)
			}
			defer after.Close()
			lost := 0
			for id, dig := range acked {
				st, err := after.GetTask(uint16(id%4), id)
				switch {
				case errors.Is(err, ErrNotFound) && id <= 20:
					t.Fatalf("synced task %d lost", id)
				case errors.Is(err, ErrNotFound):
					lost++
				case err != nil:
					t.Fatal(err)
				case st.Digest != dig:
					t.Fatalf("task %d digest %x, acked %x", id, st.Digest, dig)
				}
			}
			for p := range uint16(4) {
				checkIndexes(t, after, p)
			}
			if want := map[bool]int{false: 0, true: 20}[bug]; lost != want {
				t.Fatalf("%d acked tasks lost, want %d", lost, want)
			}
		})
	}
}

// TestPowerLossAfterFlushes writes 16 MB through faultfs with memtable
// flushes (sstables written, synced and read back through the wrapper, the
// WAL rotated), then crashes: every acked task is there.
func TestPowerLossAfterFlushes(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 16 MB")
	}
	dir := filepath.Join(t.TempDir(), "db")
	s, err := Open(Config{Dir: dir, FS: faultfs.New(vfs.Default), Clock: &testClock{ms: t0}, CacheBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	payload := make([]byte, 8<<10)
	acked := map[uint64]uint64{}
	for b := range 20 {
		if b == 10 {
			// At least one flush, whatever Pebble did by itself: the
			// tasks after it are in a new WAL.
			if err := s.db.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		items := make([]MergeItem, 100)
		for i := range items {
			id := uint64(b*100 + i + 1)
			x := newTask(id, "q", 0)
			x.Spec.Payload = payload
			items[i] = MergeItem{Partition: uint16(id % 4), Task: x}
		}
		res, err := s.MergeTasks(items)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			acked[items[i].Task.ID] = r.NewDigest
		}
	}
	checkCrashed(t, vfs.Default, crashImage(t, dir), acked, nil)
}
