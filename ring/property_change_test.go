package ring

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPlanAddNode: adding one node to n equal nodes without zones moves at
// most 1.25*P*N/(n+1) replicas (rounded up), from a fresh placement and
// from one that went through a few changes.
func TestPlanAddNode(t *testing.T) {
	forSeeds(t, 150, func(t *testing.T, rng *rand.Rand) {
		c := randCluster(rng, plain)
		cur := mustPlan(t, Placement{}, c)
		for step := range 3 {
			grown := c
			grown.nodes = append(slices.Clone(c.nodes), Node{ID: randID(rng, 100+step)})
			grown.nodes = dedupe(grown.nodes)
			if len(grown.nodes) == len(c.nodes) {
				continue
			}
			next := mustPlan(t, cur, grown)
			checkValid(t, next, grown)
			diff := Diff(cur, next)
			moves := len(diff)
			for _, m := range diff {
				if m.To != grown.nodes[len(grown.nodes)-1].ID || m.From == "" {
					t.Fatalf("step %d: adding %q made move %+v; want moves to it only", step, grown.nodes[len(grown.nodes)-1].ID, m)
				}
			}
			limit := int(math.Ceil(1.25 * float64(c.p*c.n) / float64(len(grown.nodes))))
			if moves > limit {
				t.Fatalf("step %d: adding a node to %d (P=%d N=%d) moved %d replicas, limit %d",
					step, len(c.nodes), c.p, c.n, moves, limit)
			}
			c, cur = grown, next
		}
	})
}

// TestPlanRemoveNode: removing a node moves that node's replicas and no
// other, whenever a placement that meets the rules and does so exists (the
// reference decides). When none does (say a node must reach a partition
// where no hole is, to meet its load bound), balance wins and other
// replicas move too.
func TestPlanRemoveNode(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			forced, total := 0, 0
			forSeeds(t, 60, func(t *testing.T, rng *rand.Rand) {
				c := randCluster(rng, kind)
				cur := mustPlan(t, Placement{}, c)
				for range 3 {
					if len(c.nodes) <= c.n {
						break
					}
					k := rng.IntN(len(c.nodes))
					if kind == balanced {
						if zoneCount(c.nodes) == c.n && !smallestZoneRemovable(c.nodes) {
							break
						}
						k = largestZoneMember(c.nodes, rng)
					}
					gone := c.nodes[k].ID
					shrunk := c
					shrunk.nodes = slices.Delete(slices.Clone(c.nodes), k, k+1)
					next := mustPlan(t, cur, shrunk)
					checkValid(t, next, shrunk)
					moves := Diff(cur, next)
					total++
					if !onlyGoneCanMove(cur, shrunk, gone) {
						forced++
					} else {
						for _, m := range moves {
							if m.From != gone || m.To == "" {
								t.Fatalf("removing %q made move %+v; want only %q's replicas to move", gone, m, gone)
							}
						}
						if len(moves) != cur.Loads()[gone] {
							t.Fatalf("removing %q moved %d replicas, it held %d", gone, len(moves), cur.Loads()[gone])
						}
					}
					c, cur = shrunk, next
				}
			})
			t.Logf("%d of %d removals had to move other replicas too", forced, total)
		})
	}
}

// refBounds returns each node's load bounds per the reference ideal, by
// index in c.nodes.
func refBounds(c cluster) (lo, hi []int) {
	ideal := refIdeal(c.nodes, c.p, c.n)
	for _, nd := range c.nodes {
		l, h := bounds(ideal[nd.ID])
		lo, hi = append(lo, l), append(hi, h)
	}
	return lo, hi
}

// onlyGoneCanMove reports whether a placement for shrunk exists that keeps
// every replica of cur but gone's.
func onlyGoneCanMove(cur Placement, shrunk cluster, gone NodeID) bool {
	lo, hi := refBounds(shrunk)
	index := map[NodeID]int{}
	var zoneOf []string
	for i, nd := range shrunk.nodes {
		index[nd.ID] = i
		zoneOf = append(zoneOf, zoneKey(nd))
	}
	limit := perZoneLimit(shrunk.nodes, shrunk.n)
	need := make([]int, cur.P())
	cands := make([][]int, cur.P())
	room := make([]map[string]int, cur.P())
	for k, cohort := range cur.Cohorts {
		room[k] = map[string]int{}
		for _, z := range zoneOf {
			room[k][z] = limit
		}
		for _, id := range cohort {
			if id == gone {
				need[k]++
				continue
			}
			lo[index[id]]--
			hi[index[id]]--
			room[k][zoneOf[index[id]]]--
		}
		if need[k] == 0 {
			continue
		}
		for i, nd := range shrunk.nodes {
			if !slices.Contains(cohort, nd.ID) && room[k][zoneOf[i]] > 0 {
				cands[k] = append(cands[k], i)
			}
		}
	}
	return assignable(need, cands, lo, hi, zoneOf, room)
}

func zoneCount(nodes []Node) int {
	zones := map[string]bool{}
	for _, nd := range nodes {
		zones[zoneKey(nd)] = true
	}
	return len(zones)
}

// smallestZoneRemovable reports whether every zone has two nodes or more, so
// removing one keeps the zone count.
func smallestZoneRemovable(nodes []Node) bool {
	size := map[string]int{}
	for _, nd := range nodes {
		size[zoneKey(nd)]++
	}
	for _, s := range size {
		if s < 2 {
			return false
		}
	}
	return true
}

// largestZoneMember picks a node of a largest zone, keeping the zones as
// equal as they can be.
func largestZoneMember(nodes []Node, rng *rand.Rand) int {
	size := map[string]int{}
	most := 0
	for _, nd := range nodes {
		size[zoneKey(nd)]++
		most = max(most, size[zoneKey(nd)])
	}
	var cands []int
	for i, nd := range nodes {
		if size[zoneKey(nd)] == most {
			cands = append(cands, i)
		}
	}
	return cands[rng.IntN(len(cands))]
}

// TestPlanReplicationChange: raising N only adds replicas and lowering it
// only removes replicas, whenever a placement that meets the rules and does
// so exists (the reference decides).
func TestPlanReplicationChange(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			forced, total := 0, 0
			forSeeds(t, 60, func(t *testing.T, rng *rand.Rand) {
				c := randCluster(rng, kind)
				cur := mustPlan(t, Placement{}, c)
				other := c
				other.n = 1 + rng.IntN(min(5, len(c.nodes)))
				next := mustPlan(t, cur, other)
				checkValid(t, next, other)
				moves := Diff(cur, next)
				if other.n == c.n {
					if len(moves) > 0 {
						t.Fatalf("planning again with the same N made moves %v", moves)
					}
					return
				}
				total++
				if !onlyResize(cur, other) {
					forced++
					return
				}
				for _, m := range moves {
					if other.n > c.n && m.From != "" || other.n < c.n && m.To != "" {
						t.Fatalf("changing N from %d to %d made move %+v", c.n, other.n, m)
					}
				}
			})
			t.Logf("%d of %d changes of N had to move replicas", forced, total)
		})
	}
}

// onlyResize reports whether a placement for c exists whose cohorts contain
// (N raised) or are contained in (N lowered) those of cur.
func onlyResize(cur Placement, c cluster) bool {
	lo, hi := refBounds(c)
	index := map[NodeID]int{}
	var zoneOf []string
	for i, nd := range c.nodes {
		index[nd.ID] = i
		zoneOf = append(zoneOf, zoneKey(nd))
	}
	limit := perZoneLimit(c.nodes, c.n)
	need := make([]int, cur.P())
	cands := make([][]int, cur.P())
	room := make([]map[string]int, cur.P())
	for k, cohort := range cur.Cohorts {
		room[k] = map[string]int{}
		for _, z := range zoneOf {
			room[k][z] = limit
		}
		if c.n < len(cohort) { // choose c.n of the cohort
			need[k] = c.n
			for _, id := range cohort {
				cands[k] = append(cands[k], index[id])
			}
			continue
		}
		need[k] = c.n - len(cohort)
		for _, id := range cohort {
			lo[index[id]]--
			hi[index[id]]--
			room[k][zoneOf[index[id]]]--
		}
		for i, nd := range c.nodes {
			if !slices.Contains(cohort, nd.ID) && room[k][zoneOf[i]] > 0 {
				cands[k] = append(cands[k], i)
			}
		}
	}
	return assignable(need, cands, lo, hi, zoneOf, room)
}
