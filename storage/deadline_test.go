package storage

import (
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// The deadline index holds the tasks with a deadline that are ready,
// delayed or claimed here, by deadline; a terminal task leaves it (a
// claimed one when its claim ends), and a reopened store rebuilds it
// (claimed tasks included).
func TestDeadlineIndex(t *testing.T) {
	fs := vfs.NewMem()
	s, _ := openTestStore(t, fs, "db")
	ready, delayed, claimed, cancelled, none := newTask(1, "q", 0), newTask(2, "q", 0), newTask(3, "q", 0), newTask(4, "q", 0), newTask(5, "q", 0)
	ready.Spec.DeadlineMs = t0 + 300
	delayed.Spec.NotBeforeMs, delayed.Spec.DeadlineMs = t0+100, t0+200
	claimed.Spec.DeadlineMs = t0 + 100
	cancelled.Spec.DeadlineMs = t0 + 50
	mustMerge(t, s, 0, ready, delayed, claimed, cancelled, none)
	if err := s.MarkClaimed(0, []ClaimMark{{ID: 3, ExpiryMs: t0 + 1000}}); err != nil {
		t.Fatal(err)
	}
	mustMerge(t, s, 0, cancelOf(4, t0+10))
	ids := func(s *Store, ms int64) []uint64 {
		t.Helper()
		due, err := s.DeadlinesDue(0, ms, 10)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, e := range due {
			out = append(out, e.ID)
		}
		return out
	}
	if got := ids(s, t0+99); len(got) != 0 {
		t.Fatalf("due before any deadline: %v", got)
	}
	if got := ids(s, t0+1000); !slices.Equal(got, []uint64{3, 2, 1}) {
		t.Fatalf("deadlines due %v, want the claimed, delayed and ready tasks by deadline (3, 2, 1)", got)
	}
	checkIndexes(t, s, 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.db = nil
	s2, _ := openTestStore(t, fs, "db")
	if got := ids(s2, t0+1000); !slices.Equal(got, []uint64{3, 2, 1}) {
		t.Fatalf("after reopening: deadlines due %v, want 3, 2, 1", got)
	}
	// A claimed task cancelled stays claimed here until its claim ends
	// (the claimed index is the FSM's), and in the deadline index with it.
	mustMerge(t, s2, 0, cancelOf(3, t0+20))
	if got := ids(s2, t0+1000); !slices.Equal(got, []uint64{3, 2, 1}) {
		t.Fatalf("after the claimed task's cancel: %v, want 3, 2, 1", got)
	}
	if err := s2.ApplyClaimFSM(0, ClaimFSMUpdate{AppliedIndex: 1, Moves: []IndexMove{{ID: 3}}}, false); err != nil {
		t.Fatal(err)
	}
	if got := ids(s2, t0+1000); !slices.Equal(got, []uint64{2, 1}) {
		t.Fatalf("after the cancelled task's claim ended: %v, want 2, 1", got)
	}
	checkIndexes(t, s2, 0)
}
