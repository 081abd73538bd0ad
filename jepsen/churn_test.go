package jepsen

import (
	"testing"
)

// TestActive: Active starts with the initial nodes; spares join it once
// activated, in slot order; a retired node leaves it.
func TestActive(t *testing.T) {
	c := &Cluster{Cfg: ClusterConfig{Nodes: 5, Initial: 3}, Nodes: testNodes(5)}
	c.active = append([]*Node(nil), c.Nodes[:3]...)
	if got := ids(c.Active()); got != "n1,n2,n3" {
		t.Fatalf("active %s", got)
	}
	if got := ids(c.Spares()); got != "n4,n5" {
		t.Fatalf("spares %s", got)
	}
	c.Activate(c.Nodes[4])
	c.Activate(c.Nodes[3])
	c.Activate(c.Nodes[3])
	c.Retire(c.Nodes[1])
	if got := ids(c.Active()); got != "n1,n3,n4,n5" {
		t.Fatalf("active %s", got)
	}
	if c.IsActive(c.Nodes[1]) || !c.IsActive(c.Nodes[4]) {
		t.Fatal("IsActive")
	}
}

// TestChurnPicks: the drained and the decommissioned node are two
// different initial nodes, and every ordered pair comes up over a few
// seeds.
func TestChurnPicks(t *testing.T) {
	seen := map[[2]int]bool{}
	for seed := uint64(1); seed <= 60; seed++ {
		i, j := churnPicks(seed, 3)
		if i == j || i < 0 || j < 0 || i > 2 || j > 2 {
			t.Fatalf("seed %d drains and decommissions node %d", seed, i+1)
		}
		seen[[2]int{i, j}] = true
	}
	if len(seen) != 6 {
		t.Fatalf("only %d of the 6 (drain, decommission) pairs over 60 seeds: %v", len(seen), seen)
	}
}
