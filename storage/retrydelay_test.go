package storage

import (
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/crdt"
)

// A claim ended by a retry's backoff puts its task in the delayed index
// until the backoff ends, through a merge and a reopen; the promotion
// waits for it; DelayTasks catches a ready task up with the FSM.
func TestRetryBackoffDelaysTask(t *testing.T) {
	fs := vfs.NewMem()
	s, clk := openTestStore(t, fs, "db")
	mustMerge(t, s, 0, newTask(1, "q", 0), newTask(2, "q", 0))
	claim := func(idx uint64, moves ...IndexMove) {
		t.Helper()
		if err := s.ApplyClaimFSM(0, ClaimFSMUpdate{AppliedIndex: idx, Moves: moves}, false); err != nil {
			t.Fatal(err)
		}
	}
	claim(1, IndexMove{ID: 1, Claimed: true, ExpiryMs: t0 + 100})
	claim(2, IndexMove{ID: 1, DelayUntilMs: t0 + 5000})
	st, err := s.GetTask(0, 1)
	if err != nil || st.Index != IndexDelayed || st.DueMs != t0+5000 {
		t.Fatalf("after the retry's release: %+v, %v", st, err)
	}
	if got := headIDs(t, s, 0, "q", 10); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("ready = %v, want [2]", got)
	}
	// A progress update merged meanwhile keeps the backoff.
	mustMerge(t, s, 0, &crdt.Task{ID: 1, Updates: []crdt.Update{{Claim: 1, Seq: 1, At: crdt.Timestamp{WallMs: t0 + 1}, Progress: 0.5}}})
	if st, _ := s.GetTask(0, 1); st.Index != IndexDelayed || st.DueMs != t0+5000 {
		t.Fatalf("after a merge: %+v", st)
	}
	// A release whose backoff is already over is a plain release.
	claim(3, IndexMove{ID: 2, Claimed: true, ExpiryMs: t0 + 100})
	claim(4, IndexMove{ID: 2, DelayUntilMs: t0 - 1})
	if st, _ := s.GetTask(0, 2); st.Index != IndexReady {
		t.Fatalf("task 2 after a past backoff: %+v", st)
	}
	checkIndexes(t, s, 0)

	clk.set(t0 + 4999)
	if n, err := s.PromoteDelayed(0, 10); n != 0 || err != nil {
		t.Fatalf("promoted %d, %v before the backoff ends", n, err)
	}
	// The backoff survives a restart (the indexes are rebuilt from the
	// meta keys).
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, clk = openTestStore(t, fs, "db")
	clk.set(t0 + 4999)
	if due, _ := s.DelayedDue(0, t0+4999, 10); len(due) != 0 {
		t.Fatalf("due before the backoff ends after reopen: %v", due)
	}
	if due, _ := s.DelayedDue(0, t0+5000, 10); len(due) != 1 || due[0].ID != 1 {
		t.Fatalf("due at the backoff's end after reopen: %v", due)
	}
	clk.set(t0 + 5000)
	if n, err := s.PromoteDelayed(0, 10); n != 1 || err != nil {
		t.Fatalf("promoted %d, %v at the backoff's end", n, err)
	}
	if got := headIDs(t, s, 0, "q", 10); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("ready = %v, want [1 2]", got)
	}
	// DelayTasks moves a ready task (the FSM's backoff found by the
	// leader), and leaves claimed and terminal ones alone.
	mustMerge(t, s, 0, newTask(3, "q", 0), cancelOf(3, t0))
	if err := s.ApplyClaimFSM(0, ClaimFSMUpdate{AppliedIndex: 5, Moves: []IndexMove{{ID: 2, Claimed: true, ExpiryMs: t0 + 9000}}}, false); err != nil {
		t.Fatal(err)
	}
	if err := s.DelayTasks(0, []ClaimMark{{ID: 1, ExpiryMs: t0 + 7000}, {ID: 2, ExpiryMs: t0 + 7000}, {ID: 3, ExpiryMs: t0 + 7000}}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[uint64]IndexState{1: IndexDelayed, 2: IndexClaimed, 3: IndexNone} {
		if st, _ := s.GetTask(0, id); st.Index != want {
			t.Fatalf("task %d after DelayTasks: %v, want %v", id, st.Index, want)
		}
	}
	if got := headIDs(t, s, 0, "q", 10); len(got) != 0 {
		t.Fatalf("ready = %v, want none", got)
	}
	checkIndexes(t, s, 0)
}
