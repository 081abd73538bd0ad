package ring

import (
	"cmp"
	"slices"
)

// NodeID names a node. It is stable for the node's lifetime and never empty.
type NodeID string

// Node is one node offered to Plan.
type Node struct {
	// ID identifies the node; it must be non-empty and unique.
	ID NodeID

	// Zone is the failure domain (rack, availability zone) of the node.
	// "" means none: the node is then a failure domain of its own.
	Zone string

	// Weight is the node's relative capacity: a node of weight 2 is meant to
	// hold twice the replicas of a node of weight 1. 0 means 1; negative
	// weights are rejected.
	Weight int
}

// Placement assigns each partition its cohort: the nodes holding its
// replicas. The zero Placement is empty (no partitions yet).
//
// A Placement is a plain value: Plan never modifies the one it is given and
// always returns freshly allocated slices.
type Placement struct {
	// Cohorts[i] is the cohort of partition i; len(Cohorts) is P. A
	// placement made by Plan has exactly N distinct nodes in every cohort.
	//
	// Order within a cohort: members kept from the previous placement come
	// first, in their previous order; members added by this plan follow, in
	// the order they were chosen. So Cohorts[i][0] is the longest-standing
	// member that survived (for a new cluster, the first one chosen), which
	// makes it the natural member to bootstrap partition i's Raft group.
	// Plan does not balance first members across nodes; nothing else may be
	// read into the order.
	Cohorts [][]NodeID
}

// P returns the partition count: 0 for an empty placement.
func (pl Placement) P() int { return len(pl.Cohorts) }

// N returns the replication factor: the size of partition 0's cohort, 0 for
// an empty placement.
func (pl Placement) N() int {
	if len(pl.Cohorts) == 0 {
		return 0
	}
	return len(pl.Cohorts[0])
}

// Owners returns the cohort of the partition that owns task id. The slice
// belongs to the placement: do not modify it. The placement must not be
// empty.
func (pl Placement) Owners(id uint64) []NodeID {
	return pl.Cohorts[Partition(id, pl.P())]
}

// Loads returns the number of replicas each node holds.
func (pl Placement) Loads() map[NodeID]int {
	loads := make(map[NodeID]int)
	for _, cohort := range pl.Cohorts {
		for _, id := range cohort {
			loads[id]++
		}
	}
	return loads
}

// Clone returns a deep copy of pl.
func (pl Placement) Clone() Placement {
	if pl.Cohorts == nil {
		return Placement{}
	}
	out := Placement{Cohorts: make([][]NodeID, len(pl.Cohorts))}
	for i, c := range pl.Cohorts {
		out.Cohorts[i] = slices.Clone(c)
	}
	return out
}

// Move is one replica change of one partition: From hands its replica of
// Partition over to To (the epoch handoff of DESIGN §4). From is "" when a
// replica is only added (the cohort grows), To is "" when one is only
// removed (the cohort shrinks).
type Move struct {
	Partition int
	From, To  NodeID
}

// Diff returns the moves that turn old into new, sorted by Partition, then
// From, then To ("" first). Per partition, the nodes leaving (in old, not in
// new) and the nodes joining (in new, not in old) are each sorted by id and
// paired in that order; what is left over of either becomes a pure removal
// or a pure addition. Only membership counts: order within a cohort,
// repeated members and empty ids are ignored. A partition that exists in
// only one of the two placements counts as an empty cohort in the other.
// Diff(a, a) is empty.
func Diff(old, new Placement) []Move {
	var moves []Move
	for part := range max(old.P(), new.P()) {
		var was, is []NodeID
		if part < old.P() {
			was = old.Cohorts[part]
		}
		if part < new.P() {
			is = new.Cohorts[part]
		}
		leaving := minus(was, is)
		joining := minus(is, was)
		start := len(moves)
		for i := range max(len(leaving), len(joining)) {
			m := Move{Partition: part}
			if i < len(leaving) {
				m.From = leaving[i]
			}
			if i < len(joining) {
				m.To = joining[i]
			}
			moves = append(moves, m)
		}
		slices.SortFunc(moves[start:], func(a, b Move) int {
			return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To))
		})
	}
	return moves
}

// minus returns the distinct non-empty members of a that are not in b,
// sorted.
func minus(a, b []NodeID) []NodeID {
	var out []NodeID
	for _, id := range a {
		if id != "" && !slices.Contains(b, id) && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}
