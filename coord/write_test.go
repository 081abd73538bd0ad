package coord

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

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

// A replica refuses a write of a partition from a ring older than the
// partition's move under way or its cohort's last change, and the
// refusal is one the coordinator recognizes (it pulls the replica's ring
// and writes again).
func TestCheckEpoch(t *testing.T) {
	r := &cluster.Ring{Epoch: 12, Partitions: 4, CohortEpochs: []uint64{0, 10, 0, 0}}
	moving := map[int]*cluster.Move{2: {Partition: 2, From: "a", To: "d", State: cluster.MoveFilling, Epoch: 11}}
	c := &Coordinator{}
	for _, tc := range []struct {
		name   string
		p      uint16
		epoch  uint64
		refuse string // "" when taken
	}{
		{"cohort never changed", 0, 1, ""},
		{"cohort changed after the writer's ring", 1, 9, "partition 1's cohort changed at ring epoch 10"},
		{"cohort changed at the writer's ring", 1, 10, ""},
		{"writer ahead", 1, 13, ""},
		{"no epoch at all", 1, 0, "partition 1's cohort changed at ring epoch 10"},
		{"moving since after the writer's ring", 2, 10, "partition 2 is moving since ring epoch 11"},
		{"moving since the writer's ring", 2, 11, ""},
		{"partition without a record", 3, 1, ""},
	} {
		err := c.checkEpoch(tc.epoch, r, moving, tc.p)
		switch {
		case tc.refuse == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.refuse != "" && err == nil:
			t.Errorf("%s: taken, want a refusal", tc.name)
		case tc.refuse != "":
			msg := err.Error()
			if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(msg, tc.refuse) ||
				!strings.Contains(msg, staleRingRefusal) || !strings.Contains(msg, fmt.Sprintf("(epoch %d)", tc.epoch)) {
				t.Errorf("%s: refusal %v, want UNAVAILABLE naming %q and the writer's epoch", tc.name, err, tc.refuse)
			}
		}
	}
	// A ring from before cohort epochs were recorded refuses nothing for
	// them.
	if err := c.checkEpoch(1, &cluster.Ring{Epoch: 12, Partitions: 4}, nil, 1); err != nil {
		t.Errorf("a ring without cohort epochs refused: %v", err)
	}
}
