package storage

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/crdt"
)

// TestReadyTaskWithoutMeta: a new ready task is stored without a meta key
// (three keys, not four) and reads as ready, from the row cache and from
// disk after a restart; a delayed task, a claimed one and one released
// after a claim keep an explicit meta; the indexes agree throughout.
func TestReadyTaskWithoutMeta(t *testing.T) {
	fs := vfs.NewMem()
	s, _ := openTestStore(t, fs, "db")
	delayed := newTask(2, "q", 0)
	delayed.Spec = &crdt.Spec{Queue: "q", NotBeforeMs: t0 + 60_000}
	mustMerge(t, s, 0, newTask(1, "q", 0), delayed, newTask(3, "q", 0))
	metaStored := func(id uint64) bool {
		t.Helper()
		_, err := s.get(metaKey(0, id))
		if err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	wantIndex := func(id uint64, want IndexState) {
		t.Helper()
		st, err := s.GetTask(0, id)
		if err != nil || st.Index != want {
			t.Fatalf("task %d: %+v, %v; want index %v", id, st, err, want)
		}
	}
	if metaStored(1) || !metaStored(2) {
		t.Fatalf("meta keys: ready task %v, delayed task %v; want none and one", metaStored(1), metaStored(2))
	}
	wantIndex(1, IndexReady)
	wantIndex(2, IndexDelayed)
	if err := s.MarkClaimed(0, []ClaimMark{{3, t0 + 5000}}); err != nil {
		t.Fatal(err)
	}
	wantIndex(3, IndexClaimed)
	if err := s.ReleaseClaims(0, []uint64{3}); err != nil {
		t.Fatal(err)
	}
	wantIndex(3, IndexReady)
	checkIndexes(t, s, 0)

	s.Close()
	s.db = nil
	s, _ = openTestStore(t, fs, "db")
	wantIndex(1, IndexReady) // from disk: the cache is new
	wantIndex(3, IndexReady)
	checkIndexes(t, s, 0)
	// A completion moves the meta-less task out of the ready index.
	done := newTask(1, "q", 0)
	done.Terminals = []crdt.Terminal{{Kind: crdt.Completed, At: crdt.Timestamp{WallMs: t0, Node: 1}, Claim: 9}}
	mustMerge(t, s, 0, done)
	wantIndex(1, IndexNone)
	checkIndexes(t, s, 0)
}
