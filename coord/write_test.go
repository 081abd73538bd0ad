package coord

import (
	"errors"
	"testing"

	"github.com/norn-dev/norn/cluster"
)

// A write of a moving partition (cohort a, b, c; c hands over to d) needs
// w acks of the old cohort and w of the new one.
func TestAckTrackerJointQuorum(t *testing.T) {
	for _, tc := range []struct {
		name    string
		acks    []string
		reached bool
	}{
		{"old quorum only", []string{"a", "c"}, false},
		{"new quorum only", []string{"a", "d"}, false},
		{"both", []string{"a", "b"}, true},
		{"both through c and d", []string{"a", "c", "d"}, true},
		{"target alone", []string{"d"}, false},
	} {
		tr := &ackTracker{acks: make([]uint32, 2), w: 2, left: 2, pending: 4, done: make(chan struct{})}
		tr.addMove(0, &cluster.Move{From: "c", To: "d"})
		for _, dest := range tc.acks {
			// Task 1 does not move: it lives on the same cohort (a, b, c).
			idx := []int{0}
			if dest != "d" {
				idx = append(idx, 1)
			}
			tr.answer(dest, idx, nil)
		}
		acks, _ := tr.result()
		if got := acks[0] >= 2; got != tc.reached {
			t.Errorf("%s: moving task reached quorum = %v (acks %d), want %v", tc.name, got, acks[0], tc.reached)
		}
		if tc.reached && !(acks[1] >= 2) {
			t.Errorf("%s: the task that does not move has %d acks", tc.name, acks[1])
		}
	}
	// A refusal for a stale ring names its replica.
	tr := &ackTracker{acks: make([]uint32, 1), w: 2, left: 1, pending: 1, done: make(chan struct{})}
	tr.answer("b", []int{0}, errors.New("unavailable: partition 3 is moving since ring epoch 9 and "+staleRingRefusal+" (epoch 8)"))
	if tr.staleFrom() != "b" {
		t.Fatalf("stale refusal from %q, want b", tr.staleFrom())
	}
}
