package claims

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestGroupOnProposed: each proposal that took effect reports how long
// it waited; a refused one reports nothing.
func TestGroupOnProposed(t *testing.T) {
	var calls atomic.Int64
	var last atomic.Int64
	n := startTestNode(t, t.TempDir(), 8192, func(c *GroupConfig) {
		c.OnProposed = func(d time.Duration) {
			calls.Add(1)
			last.Store(int64(d))
		}
	})
	defer n.stop(t)
	enqueue(t, n.store, 1)
	start := time.Now()
	n.propose(t, Command{Op: OpClaim, NowMs: 1000, Worker: "w", LeaseMs: 1000, Candidates: []Candidate{{ID: 1}}})
	took := time.Since(start)
	if calls.Load() != 1 || last.Load() <= 0 || time.Duration(last.Load()) > took {
		t.Fatalf("after one proposal: %d reports, last %v (the proposal took %v)", calls.Load(), time.Duration(last.Load()), took)
	}
	n.group.mayLead = func() error { return ErrNotLeader }
	if _, err := n.group.Propose(&Command{Op: OpRenew, NowMs: 1000, ID: 1, Token: 1, LeaseMs: 1000}, time.Second); err == nil {
		t.Fatal("a refused proposal succeeded")
	}
	if calls.Load() != 1 {
		t.Fatalf("a refused proposal was reported: %d reports", calls.Load())
	}
}
