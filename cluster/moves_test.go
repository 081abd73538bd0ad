package cluster

import (
	"encoding/json"
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
	if got := r.CohortEpoch(p); got != 0 {
		t.Fatalf("partition %d's cohort epoch %d before its move finished", p, got)
	}
	r = r.Next()
	if err := r.FinishMove(p); err != nil {
		t.Fatal(err)
	}
	if r.Moves[0].State != MoveDone || r.Hosts(p, from) || !r.Hosts(p, "d") || r.ActiveMove(p) != nil {
		t.Fatalf("after FinishMove: move %+v, cohort %v", r.Moves[0], r.Cohort(p))
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	// The ring records the epoch the cohort changed at, for this
	// partition only, and the next rings keep it.
	done := r.Epoch
	r = r.Next()
	for q := range r.Partitions {
		want := uint64(0)
		if q == p {
			want = done
		}
		if got := r.CohortEpoch(q); got != want {
			t.Errorf("partition %d's cohort epoch %d, want %d", q, got, want)
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Ring
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.CohortEpoch(p) != done {
		t.Fatalf("cohort epoch %d after a JSON round trip, want %d", back.CohortEpoch(p), done)
	}
	// A cohort epoch past the ring's own, or a list of the wrong length,
	// is a bad ring.
	for _, bad := range []func(*Ring){
		func(r *Ring) { r.CohortEpochs[p] = r.Epoch + 1 },
		func(r *Ring) { r.CohortEpochs = r.CohortEpochs[:1] },
	} {
		c := r.Clone()
		bad(c)
		if err := c.Validate(); !errors.Is(err, ErrBadRing) {
			t.Errorf("cohort epochs %v at epoch %d: %v, want ErrBadRing", c.CohortEpochs, c.Epoch, err)
		}
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

func TestCancelAndRollBack(t *testing.T) {
	r := movesRing(t)
	moves, _, err := r.PlanMoves()
	if err != nil || len(moves) < 3 {
		t.Fatalf("plan: %d moves, %v", len(moves), err)
	}
	r = r.Next()
	r.Moves = moves
	// Move 0 is filling, move 1 promoted, the rest queued.
	r.Moves[0].State, r.Moves[0].Epoch = MoveFilling, r.Epoch
	r.Moves[1].State, r.Moves[1].Epoch = MovePromoted, r.Epoch
	p0, p1 := r.Moves[0].Partition, r.Moves[1].Partition
	cohort0 := slices.Clone(r.Cohort(p0))
	if r.RollBack(p1, "x") {
		t.Fatal("a promoted move rolled back")
	}
	if got := r.CancelMoves("cancelled"); got != len(moves)-1 {
		t.Fatalf("cancelled %d moves, want %d", got, len(moves)-1)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	m0 := r.ActiveMove(p0)
	if m0 == nil || m0.State != MoveRollingBack || m0.Rollback != "cancelled" {
		t.Fatalf("filling move after cancel: %+v", m0)
	}
	// Rolling back, the target still receives writes.
	if !r.HostsReplica(p0, m0.To) {
		t.Fatal("a move rolling back must keep its target a replica until it failed")
	}
	if _, _, err := r.PlanMoves(); !errors.Is(err, ErrMovesUnderway) {
		t.Fatalf("planning while a move rolls back: %v", err)
	}
	if m := r.ActiveMove(p1); m == nil || m.State != MovePromoted {
		t.Fatalf("promoted move after cancel: %+v", m)
	}
	for _, m := range r.Moves[2:] {
		if m.State != MoveFailed || m.Error != "cancelled" {
			t.Fatalf("queued move after cancel: %+v", m)
		}
	}
	to := m0.To
	if err := r.FailRollback(p0); err != nil {
		t.Fatal(err)
	}
	if r.Moves[0].State != MoveFailed || r.Moves[0].Error != "rolled back: cancelled" {
		t.Fatalf("after FailRollback: %+v", r.Moves[0])
	}
	if r.HostsReplica(p0, to) || !slices.Equal(r.Cohort(p0), cohort0) {
		t.Fatalf("after the rollback: %s hosts p%d (cohort %v, was %v)", to, p0, r.Cohort(p0), cohort0)
	}
	if err := r.FailRollback(p0); err == nil {
		t.Fatal("FailRollback of a failed move")
	}
	if err := r.FinishMove(p1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.PlanMoves(); err != nil {
		t.Fatalf("planning after the moves ended: %v", err)
	}
}
