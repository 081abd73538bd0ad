package ring

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

func TestDiff(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, new Placement
		want     []Move
	}{
		{"both empty", Placement{}, Placement{}, nil},
		{"same", Placement{Cohorts: [][]NodeID{{"a", "b"}}}, Placement{Cohorts: [][]NodeID{{"a", "b"}}}, nil},
		{"order ignored", Placement{Cohorts: [][]NodeID{{"a", "b"}}}, Placement{Cohorts: [][]NodeID{{"b", "a"}}}, nil},
		{"from empty", Placement{}, Placement{Cohorts: [][]NodeID{{"b", "a"}, {"c"}}},
			[]Move{{0, "", "a"}, {0, "", "b"}, {1, "", "c"}}},
		{"to empty", Placement{Cohorts: [][]NodeID{{"a"}}}, Placement{},
			[]Move{{0, "a", ""}}},
		{"replace", Placement{Cohorts: [][]NodeID{{"a", "b", "c"}, {"a", "b", "c"}}}, Placement{Cohorts: [][]NodeID{{"a", "d", "c"}, {"e", "f", "c"}}},
			[]Move{{0, "b", "d"}, {1, "a", "e"}, {1, "b", "f"}}},
		{"grow", Placement{Cohorts: [][]NodeID{{"a", "b"}}}, Placement{Cohorts: [][]NodeID{{"c", "a", "d"}}},
			[]Move{{0, "", "d"}, {0, "b", "c"}}},
		{"shrink", Placement{Cohorts: [][]NodeID{{"a", "b", "c"}}}, Placement{Cohorts: [][]NodeID{{"b"}}},
			[]Move{{0, "a", ""}, {0, "c", ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Diff(tc.old, tc.new); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Diff = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDiffProperties: Diff(a, a) is empty, Diff's moves turn old's replica
// sets into new's, and they come sorted.
func TestDiffProperties(t *testing.T) {
	forSeeds(t, 200, func(t *testing.T, rng *rand.Rand) {
		c := randCluster(rng, kinds[rng.IntN(len(kinds))])
		a := garbagePlacement(rng, c)
		b := mustPlan(t, a, c)
		if rng.IntN(2) == 0 {
			b = garbagePlacement(rng, c)
		}
		if d := Diff(a, a); len(d) != 0 {
			t.Fatalf("Diff(a, a) = %v, want empty", d)
		}
		if d := Diff(b, b); len(d) != 0 {
			t.Fatalf("Diff(b, b) = %v, want empty", d)
		}
		moves := Diff(a, b)
		if !slices.IsSortedFunc(moves, func(x, y Move) int {
			if x.Partition != y.Partition {
				return x.Partition - y.Partition
			}
			if x.From != y.From {
				return compareIDs(x.From, y.From)
			}
			return compareIDs(x.To, y.To)
		}) {
			t.Fatalf("moves not sorted: %v", moves)
		}
		got := apply(a, moves)
		for part := range got {
			if want := replicaSet(b.Cohorts[part]); !reflect.DeepEqual(got[part], want) {
				t.Fatalf("partition %d: applying moves to %v gives %v, want %v", part, a.Cohorts[part], got[part], want)
			}
		}
	})
}

func compareIDs(a, b NodeID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func replicaSet(c []NodeID) map[NodeID]bool {
	set := map[NodeID]bool{}
	for _, id := range c {
		if id != "" {
			set[id] = true
		}
	}
	return set
}

// apply returns old's replica sets after moves. It fails on a move that
// removes a replica that is not there or adds one that is.
func apply(old Placement, moves []Move) []map[NodeID]bool {
	sets := make([]map[NodeID]bool, old.P())
	for part, c := range old.Cohorts {
		sets[part] = replicaSet(c)
	}
	for _, m := range moves {
		set := sets[m.Partition]
		if m.From != "" {
			if !set[m.From] {
				panic("move from a node without the replica")
			}
			delete(set, m.From)
		}
		if m.To != "" {
			if set[m.To] {
				panic("move to a node with the replica")
			}
			set[m.To] = true
		}
	}
	return sets
}
