package cluster

import (
	"errors"
	"slices"
	"testing"

	"github.com/norn-dev/norn/ring"
)

func movesRing(t *testing.T) *Ring {
	t.Helper()
	var nodes []RingNode
	for _, id := range []string{"a", "b", "c", "d"} {
		nodes = append(nodes, RingNode{ID: id, APIAddr: id + ":1", RaftAddr: id + ":2"})
	}
	r, err := NewRing(nodes[:3], 8, 3)
	if err != nil {
		t.Fatal(err)
	}
	r.Nodes = nodes // d gossips in and joins: a member holding nothing
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestPlanMovesAndHandoff(t *testing.T) {
	r := movesRing(t)
	moves, target, err := r.PlanMoves()
	if err != nil {
		t.Fatal(err)
	}
	if len(moves) != target.Loads()["d"] || len(moves) == 0 {
		t.Fatalf("%d moves for a new node given %d replicas", len(moves), target.Loads()["d"])
	}
	for _, m := range moves {
		if m.To != "d" || m.State != MoveQueued {
			t.Fatalf("move %+v: want a queued move to d", m)
		}
	}
	r = r.Next()
	r.Moves = moves
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	// Start the first move: the ring names d a replica of its partition.
	m := &r.Moves[0]
	p := m.Partition
	r = r.Next()
	r.Moves[0].State, r.Moves[0].Epoch = MoveFilling, r.Epoch
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if !r.HostsReplica(p, "d") || r.Hosts(p, "d") {
		t.Fatal("the move's target must hold a replica without being in the cohort")
	}
	if got := r.Replicas(p); len(got) != 4 || !slices.Contains(got, "d") {
		t.Fatalf("replicas of a moving partition: %v", got)
	}
	next := r.NextCohort(p)
	if slices.Contains(next, ring.NodeID(r.Moves[0].From)) || !slices.Contains(next, "d") {
		t.Fatalf("next cohort %v of move %+v", next, r.Moves[0])
	}
	if _, _, err := r.PlanMoves(); !errors.Is(err, ErrMovesUnderway) {
		t.Fatalf("planning while a move runs: %v, want ErrMovesUnderway", err)
	}
	if r.Pending("d") != true || r.Holds("d") != 1 {
		t.Fatalf("d: pending %v, holds %d", r.Pending("d"), r.Holds("d"))
	}
	// Two moves of one partition under way at once are refused.
	bad := r.Clone()
	bad.Moves = append(bad.Moves, Move{Partition: p, From: string(r.Cohort(p)[1]), To: "d", State: MoveFilling, Epoch: r.Epoch})
	if err := bad.Validate(); !errors.Is(err, ErrBadRing) {
		t.Fatalf("two moves under way: %v", err)
	}
	from := r.Moves[0].From
	if err := r.FinishMove(p); err != nil {
		t.Fatal(err)
	}
	if r.Moves[0].State != MoveDone || r.Hosts(p, from) || !r.Hosts(p, "d") || r.ActiveMove(p) != nil {
		t.Fatalf("after FinishMove: move %+v, cohort %v", r.Moves[0], r.Cohort(p))
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateMoves(t *testing.T) {
	base := movesRing(t)
	p := 0
	in, out := string(base.Cohort(p)[0]), "d"
	for _, tc := range []struct {
		name string
		m    Move
	}{
		{"unknown state", Move{Partition: p, From: in, To: out, State: "moving"}},
		{"partition out of range", Move{Partition: 8, From: in, To: out, State: MoveQueued}},
		{"from equals to", Move{Partition: p, From: in, To: in, State: MoveQueued}},
		{"target in the cohort", Move{Partition: p, From: in, To: string(base.Cohort(p)[1]), State: MoveFilling, Epoch: 1}},
		{"source not in the cohort", Move{Partition: p, From: out, To: "e", State: MoveFilling, Epoch: 1}},
		{"no start epoch", Move{Partition: p, From: in, To: out, State: MoveFilling}},
		{"start epoch ahead", Move{Partition: p, From: in, To: out, State: MoveFilling, Epoch: 99}},
	} {
		r := base.Clone()
		r.Moves = []Move{tc.m}
		if err := r.Validate(); !errors.Is(err, ErrBadRing) {
			t.Errorf("%s: %v, want ErrBadRing", tc.name, err)
		}
	}
	r := base.Clone()
	r.Nodes[3].Role = "gone"
	if err := r.Validate(); !errors.Is(err, ErrBadRing) {
		t.Errorf("unknown role: %v", err)
	}
}

func TestPlanMovesDrain(t *testing.T) {
	r := movesRing(t)
	r.Nodes[0].Role = RoleDraining // a
	moves, target, err := r.PlanMoves()
	if err != nil {
		t.Fatal(err)
	}
	if target.Loads()["a"] != 0 || len(moves) != 8 {
		t.Fatalf("drain of a: %d moves, a keeps %d", len(moves), target.Loads()["a"])
	}
	for _, m := range moves {
		if m.From != "a" || m.To != "d" {
			t.Fatalf("move %+v: want a -> d", m)
		}
	}
}
