package ring

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func nodesNamed(ids ...string) []Node {
	var out []Node
	for _, id := range ids {
		out = append(out, Node{ID: NodeID(id)})
	}
	return out
}

func TestPlanErrors(t *testing.T) {
	abc := nodesNamed("a", "b", "c")
	four := Placement{Cohorts: [][]NodeID{{"a"}, {"b"}, {"c"}, {"a"}}}
	for _, tc := range []struct {
		name  string
		cur   Placement
		nodes []Node
		p, n  int
		want  error
	}{
		{"P zero", Placement{}, abc, 0, 1, ErrBadPartitionCount},
		{"P negative", Placement{}, abc, -8, 1, ErrBadPartitionCount},
		{"P not a power of two", Placement{}, abc, 48, 1, ErrBadPartitionCount},
		{"P too large", Placement{}, abc, 2 * MaxPartitions, 1, ErrBadPartitionCount},
		{"N zero", Placement{}, abc, 8, 0, ErrBadReplication},
		{"N negative", Placement{}, abc, 8, -1, ErrBadReplication},
		{"N above node count", Placement{}, abc, 8, 4, ErrTooFewNodes},
		{"no nodes", Placement{}, nil, 8, 1, ErrTooFewNodes},
		{"duplicate id", Placement{}, nodesNamed("a", "b", "a"), 8, 1, ErrDuplicateNode},
		{"empty id", Placement{}, nodesNamed("a", ""), 8, 1, ErrBadNode},
		{"negative weight", Placement{}, []Node{{ID: "a"}, {ID: "b", Weight: -1}}, 8, 1, ErrBadNode},
		{"current has other P", four, abc, 8, 1, ErrPartitionMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl, err := Plan(tc.cur, tc.nodes, tc.p, tc.n)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Plan: err = %v, want %v", err, tc.want)
			}
			if pl.Cohorts != nil {
				t.Errorf("Plan returned a placement with its error: %v", pl)
			}
		})
	}
}

func TestPlanAccepts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cur   Placement
		nodes []Node
		p, n  int
	}{
		{"one partition, one node", Placement{}, nodesNamed("a"), 1, 1},
		{"N equal to node count", Placement{}, nodesNamed("a", "b", "c"), 8, 3},
		{"max partitions", Placement{}, nodesNamed("a", "b", "c"), MaxPartitions, 2},
		{"zero weight means one", Placement{}, []Node{{ID: "a"}, {ID: "b", Weight: 0}}, 4, 1},
		{"current of other N", Placement{Cohorts: [][]NodeID{{"a"}, {"b"}}}, nodesNamed("a", "b"), 2, 2},
		{"current with gone, empty and repeated members", Placement{Cohorts: [][]NodeID{{"x", "a", "a"}, {""}}}, nodesNamed("a", "b"), 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl, err := Plan(tc.cur, tc.nodes, tc.p, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			checkValid(t, pl, cluster{nodes: tc.nodes, p: tc.p, n: tc.n})
		})
	}
}

// TestPlanDoesNotModifyInput: Plan copies what it is given.
func TestPlanDoesNotModifyInput(t *testing.T) {
	nodes := nodesNamed("c", "a", "b", "d")
	cur, err := Plan(Placement{}, nodes[:3], 16, 2)
	if err != nil {
		t.Fatal(err)
	}
	curCopy, nodesCopy := cur.Clone(), slices.Clone(nodes)
	next, err := Plan(cur, nodes, 16, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(cur.Cohorts, curCopy.Cohorts, slices.Equal) || !slices.Equal(nodes, nodesCopy) {
		t.Fatal("Plan modified its input")
	}
	next.Cohorts[0][0] = "zz"
	if cur.Cohorts[0][0] == "zz" {
		t.Fatal("Plan's result shares memory with its input")
	}
}

// TestPlanZonePrecedence: zones win over balance. With N=3 and three zones,
// every cohort has one node of each zone, so a lone node in its zone holds
// a replica of every partition, whatever its weight, and the nodes of a
// crowded zone share their zone's P replicas.
func TestPlanZonePrecedence(t *testing.T) {
	nodes := []Node{
		{ID: "lone", Zone: "a", Weight: 1},
		{ID: "b1", Zone: "b", Weight: 5}, {ID: "b2", Zone: "b", Weight: 5},
		{ID: "c1", Zone: "c"}, {ID: "c2", Zone: "c"}, {ID: "c3", Zone: "c"}, {ID: "c4", Zone: "c"},
	}
	pl, err := Plan(Placement{}, nodes, 64, 3)
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, pl, cluster{nodes: nodes, p: 64, n: 3})
	want := map[NodeID]int{"lone": 64, "b1": 32, "b2": 32, "c1": 16, "c2": 16, "c3": 16, "c4": 16}
	if got := pl.Loads(); !mapsEqual(got, want) {
		t.Errorf("loads = %v, want %v", got, want)
	}
}

// TestPlanFewerZonesThanN: with two zones and N=3, every cohort spans both
// zones and holds at most two nodes of one.
func TestPlanFewerZonesThanN(t *testing.T) {
	nodes := []Node{
		{ID: "a1", Zone: "a"}, {ID: "a2", Zone: "a"}, {ID: "a3", Zone: "a"},
		{ID: "b1", Zone: "b"}, {ID: "b2", Zone: "b"}, {ID: "b3", Zone: "b"},
	}
	pl, err := Plan(Placement{}, nodes, 64, 3)
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, pl, cluster{nodes: nodes, p: 64, n: 3})
	for part, c := range pl.Cohorts {
		zones := map[byte]int{}
		for _, id := range c {
			zones[id[0]]++
		}
		if len(zones) != 2 {
			t.Errorf("partition %d: cohort %v does not span both zones", part, c)
		}
	}
}

// TestPlanWeights: load follows weight, capped at one replica per partition.
func TestPlanWeights(t *testing.T) {
	nodes := []Node{{ID: "big", Weight: 100}, {ID: "m1", Weight: 2}, {ID: "m2", Weight: 2}, {ID: "s", Weight: 1}}
	pl, err := Plan(Placement{}, nodes, 64, 2)
	if err != nil {
		t.Fatal(err)
	}
	// big is capped at 64; the other 64 replicas go 2:2:1.
	want := map[NodeID][2]int{"big": {64, 64}, "m1": {25, 26}, "m2": {25, 26}, "s": {12, 13}}
	for id, l := range pl.Loads() {
		if l < want[id][0] || l > want[id][1] {
			t.Errorf("node %s holds %d replicas, want in %v", id, l, want[id])
		}
	}
}

// TestPlanCohortOrder: kept members keep their order at the front, new
// members follow.
func TestPlanCohortOrder(t *testing.T) {
	cur := Placement{Cohorts: [][]NodeID{{"c", "gone", "a"}, {"a", "b", "c"}}}
	pl, err := Plan(cur, nodesNamed("a", "b", "c", "d"), 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := pl.Cohorts[0][:2]; !slices.Equal(got, []NodeID{"c", "a"}) {
		t.Errorf("partition 0 starts with %v, want the kept members [c a] in order", got)
	}
}

func TestPlacementOwners(t *testing.T) {
	pl, err := Plan(Placement{}, nodesNamed("a", "b", "c", "d"), 64, 3)
	if err != nil {
		t.Fatal(err)
	}
	for id := range uint64(100) {
		if got, want := pl.Owners(id), pl.Cohorts[Partition(id, 64)]; !slices.Equal(got, want) {
			t.Fatalf("Owners(%d) = %v, want cohort of partition %d %v", id, got, Partition(id, 64), want)
		}
	}
	if pl.P() != 64 || pl.N() != 3 {
		t.Errorf("P, N = %d, %d, want 64, 3", pl.P(), pl.N())
	}
	if (Placement{}).P() != 0 || (Placement{}).N() != 0 {
		t.Error("empty placement has non-zero P or N")
	}
}

func mapsEqual(a, b map[NodeID]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func benchNodes(count int) []Node {
	var nodes []Node
	for i := range count {
		nodes = append(nodes, Node{ID: NodeID(fmt.Sprintf("node-%03d", i))})
	}
	return nodes
}

// BenchmarkPlan: P=1024, N=3, one node joins 64.
func BenchmarkPlan(b *testing.B) {
	nodes := benchNodes(65)
	cur, err := Plan(Placement{}, nodes[:64], 1024, 3)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Plan(cur, nodes, 1024, 3); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlanFresh(b *testing.B) {
	for _, p := range []int{64, 1024, MaxPartitions} {
		b.Run(fmt.Sprintf("P=%d", p), func(b *testing.B) {
			nodes := benchNodes(64)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Plan(Placement{}, nodes, p, 3); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPlanRemove: P=1024, N=3, one node of 64 leaves.
func BenchmarkPlanRemove(b *testing.B) {
	nodes := benchNodes(64)
	cur, err := Plan(Placement{}, nodes, 1024, 3)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Plan(cur, nodes[1:], 1024, 3); err != nil {
			b.Fatal(err)
		}
	}
}
