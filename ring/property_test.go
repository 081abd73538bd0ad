package ring

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// Property tests of Plan over random clusters. Each case runs from its own
// seed, printed on failure; rerun one with -ring.seed=SEED.

var seedFlag = flag.Uint64("ring.seed", 0, "run the ring property tests from this seed only")

// iterations returns how many random cases a property test runs.
func iterations(full int) int {
	switch {
	case *seedFlag != 0:
		return 1
	case testing.Short():
		return max(full/8, 1)
	case raceEnabled:
		return max(full/4, 1)
	}
	return full
}

// forSeeds runs f once per seed, each from its own generator.
func forSeeds(t *testing.T, full int, f func(t *testing.T, rng *rand.Rand)) {
	t.Helper()
	base := uint64(time.Now().UnixNano())
	for k := range iterations(full) {
		seed := base + uint64(k)*0x9e3779b97f4a7c15
		if *seedFlag != 0 {
			seed = *seedFlag
		}
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			f(t, rand.New(rand.NewPCG(seed, seed^0x5eed)))
		})
		if !ok {
			t.Fatalf("failed with seed %d; rerun with -run '%s' -ring.seed=%d", seed, t.Name(), seed)
		}
	}
}

// cluster is a random planning problem.
type cluster struct {
	nodes []Node
	p, n  int
}

func (c cluster) String() string {
	return fmt.Sprintf("P=%d N=%d nodes=%v", c.p, c.n, c.nodes)
}

type clusterKind int

const (
	plain    clusterKind = iota // equal weights, no zones
	weighted                    // random weights, no zones
	zoned                       // random zones (some nodes unzoned), random weights
	balanced                    // equal-size zones, at least N of them, equal weights
)

func (k clusterKind) String() string {
	return [...]string{"plain", "weighted", "zoned", "balanced"}[k]
}

var kinds = []clusterKind{plain, weighted, zoned, balanced}

func randCluster(rng *rand.Rand, kind clusterKind) cluster {
	c := cluster{p: 16 << rng.IntN(7)} // 16 .. 1024
	count := 1 + rng.IntN(64)
	zones := 0
	if kind == balanced {
		zones = 1 + rng.IntN(8)
		count = zones * (1 + rng.IntN(8))
	}
	c.n = 1 + rng.IntN(min(5, count))
	if kind == balanced {
		c.n = 1 + rng.IntN(min(5, zones))
	}
	if kind == zoned {
		zones = 1 + rng.IntN(8)
	}
	for i := range count {
		nd := Node{ID: randID(rng, i)}
		switch kind {
		case weighted, zoned:
			nd.Weight = rng.IntN(5) // 0 means 1
		}
		switch kind {
		case zoned:
			if rng.IntN(6) > 0 {
				nd.Zone = fmt.Sprintf("z%d", rng.IntN(zones))
			}
		case balanced:
			nd.Zone = fmt.Sprintf("z%d", i%zones)
		}
		c.nodes = append(c.nodes, nd)
	}
	rng.Shuffle(len(c.nodes), func(i, j int) { c.nodes[i], c.nodes[j] = c.nodes[j], c.nodes[i] })
	return c
}

func randID(rng *rand.Rand, i int) NodeID {
	return NodeID(fmt.Sprintf("n%02d-%04x", i, rng.IntN(1<<16)))
}

func mustPlan(t *testing.T, cur Placement, c cluster) Placement {
	t.Helper()
	pl, err := Plan(cur, c.nodes, c.p, c.n)
	if err != nil {
		t.Fatalf("Plan(%v): %v", c, err)
	}
	return pl
}

// zoneKey is the failure domain of a node: its zone, or itself.
func zoneKey(nd Node) string {
	if nd.Zone == "" {
		return "node:" + string(nd.ID)
	}
	return "zone:" + nd.Zone
}

// perZoneLimit is the reference for the zone rule: the fewest members of
// one zone a cohort must allow so that the zones can fill it.
func perZoneLimit(nodes []Node, n int) int {
	size := map[string]int{}
	for _, nd := range nodes {
		size[zoneKey(nd)]++
	}
	for c := 1; ; c++ {
		room := 0
		for _, s := range size {
			room += min(s, c)
		}
		if room >= n {
			return c
		}
	}
}

// refIdeal is a reference for the ideal loads, by bisection on the
// per-weight rate: a node gets min(P, rate*weight); a zone whose total would
// pass perZone*P gets exactly that, shared at a lower rate of its own.
func refIdeal(nodes []Node, p, n int) map[NodeID]float64 {
	byZone := map[string][]Node{}
	for _, nd := range nodes {
		byZone[zoneKey(nd)] = append(byZone[zoneKey(nd)], nd)
	}
	zoneCap := float64(perZoneLimit(nodes, n) * p)
	weight := func(nd Node) float64 { return float64(max(nd.Weight, 1)) }
	demand := func(zn []Node, rate float64) float64 {
		s := 0.0
		for _, nd := range zn {
			s += min(float64(p), rate*weight(nd))
		}
		return s
	}
	solve := func(f func(float64) float64, want float64) float64 {
		lo, hi := 0.0, float64(p)
		for range 200 {
			mid := (lo + hi) / 2
			if f(mid) < want {
				lo = mid
			} else {
				hi = mid
			}
		}
		return hi
	}
	rate := solve(func(r float64) float64 {
		s := 0.0
		for _, zn := range byZone {
			s += min(zoneCap, demand(zn, r))
		}
		return s
	}, float64(p*n))
	out := map[NodeID]float64{}
	for _, zn := range byZone {
		r := rate
		if demand(zn, rate) > zoneCap {
			r = solve(func(r float64) float64 { return demand(zn, r) }, zoneCap)
		}
		for _, nd := range zn {
			out[nd.ID] = min(float64(p), r*weight(nd))
		}
	}
	return out
}

// bounds returns floor and ceiling of an ideal load, computed in floating
// point: an ideal within 1e-6 of an integer is that integer.
func bounds(x float64) (lo, hi int) {
	if r := math.Round(x); math.Abs(x-r) < 1e-6 {
		return int(r), int(r)
	}
	return int(math.Floor(x)), int(math.Ceil(x))
}

// checkValid checks rules 1-3 of Plan: cohort size and distinctness, zones,
// and every load within one of the reference ideal.
func checkValid(t *testing.T, pl Placement, c cluster) {
	t.Helper()
	if pl.P() != c.p {
		t.Fatalf("placement has %d partitions, want %d", pl.P(), c.p)
	}
	byID := map[NodeID]Node{}
	zones := map[string]bool{}
	for _, nd := range c.nodes {
		byID[nd.ID] = nd
		zones[zoneKey(nd)] = true
	}
	limit := perZoneLimit(c.nodes, c.n)
	if len(zones) >= c.n && limit != 1 {
		t.Fatalf("reference bug: %d zones for N=%d but limit %d", len(zones), c.n, limit)
	}
	for part, cohort := range pl.Cohorts {
		if len(cohort) != c.n {
			t.Fatalf("partition %d has cohort %v, want %d members", part, cohort, c.n)
		}
		inZone := map[string]int{}
		for k, id := range cohort {
			nd, ok := byID[id]
			if !ok {
				t.Fatalf("partition %d has unknown node %q", part, id)
			}
			if slices.Contains(cohort[:k], id) {
				t.Fatalf("partition %d has node %q twice: %v", part, id, cohort)
			}
			inZone[zoneKey(nd)]++
			if inZone[zoneKey(nd)] > limit {
				t.Fatalf("partition %d: cohort %v has %d nodes of %s, limit %d (%d zones, N=%d)",
					part, cohort, inZone[zoneKey(nd)], zoneKey(nd), limit, len(zones), c.n)
			}
		}
	}
	loads := pl.Loads()
	for id, x := range refIdeal(c.nodes, c.p, c.n) {
		lo, hi := bounds(x)
		if l := loads[id]; l < lo || l > hi {
			t.Errorf("node %q (weight %d, zone %q) holds %d replicas, ideal %.3f: want in [%d, %d]",
				id, byID[id].Weight, byID[id].Zone, l, x, lo, hi)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// checkStable checks determinism (again, and with the nodes shuffled) and
// idempotence (planning the result again with the same nodes is a no-op).
func checkStable(t *testing.T, rng *rand.Rand, cur, pl Placement, c cluster) {
	t.Helper()
	if again := mustPlan(t, cur, c); !reflect.DeepEqual(again, pl) {
		t.Fatalf("Plan is not deterministic: %v", Diff(pl, again))
	}
	shuffled := c
	shuffled.nodes = slices.Clone(c.nodes)
	rng.Shuffle(len(shuffled.nodes), func(i, j int) {
		shuffled.nodes[i], shuffled.nodes[j] = shuffled.nodes[j], shuffled.nodes[i]
	})
	if again := mustPlan(t, cur, shuffled); !reflect.DeepEqual(again, pl) {
		t.Fatalf("Plan depends on node order: %v", Diff(pl, again))
	}
	if again := mustPlan(t, pl, c); !reflect.DeepEqual(again, pl) {
		t.Fatalf("Plan of a balanced placement with the same nodes is not a no-op: %v", Diff(pl, again))
	}
}

func TestPlanFresh(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			forSeeds(t, 60, func(t *testing.T, rng *rand.Rand) {
				c := randCluster(rng, kind)
				pl := mustPlan(t, Placement{}, c)
				checkValid(t, pl, c)
				checkStable(t, rng, Placement{}, pl, c)
			})
		})
	}
}

// TestPlanFromExisting plans from placements made for other clusters: some
// nodes gone, some new, another N, zones and weights changed, and from
// garbage (unknown, empty and repeated members, cohorts of any size).
func TestPlanFromExisting(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			forSeeds(t, 60, func(t *testing.T, rng *rand.Rand) {
				c := randCluster(rng, kind)
				var cur Placement
				if rng.IntN(4) == 0 {
					cur = garbagePlacement(rng, c)
				} else {
					old := randCluster(rng, kinds[rng.IntN(len(kinds))])
					old.p = c.p
					// Keep a random part of the new nodes in the old cluster.
					for _, nd := range c.nodes {
						if rng.IntN(3) > 0 {
							old.nodes = append(old.nodes, Node{ID: nd.ID, Zone: nd.Zone, Weight: rng.IntN(3)})
						}
					}
					old.nodes = dedupe(old.nodes)
					cur = mustPlan(t, Placement{}, old)
				}
				pl := mustPlan(t, cur, c)
				checkValid(t, pl, c)
				checkStable(t, rng, cur, pl, c)
			})
		})
	}
}

func garbagePlacement(rng *rand.Rand, c cluster) Placement {
	pl := Placement{Cohorts: make([][]NodeID, c.p)}
	for part := range pl.Cohorts {
		for range rng.IntN(7) {
			var id NodeID
			switch rng.IntN(4) {
			case 0:
				id = randID(rng, 99)
			case 1:
				id = ""
			default:
				id = c.nodes[rng.IntN(len(c.nodes))].ID
			}
			pl.Cohorts[part] = append(pl.Cohorts[part], id)
		}
	}
	return pl
}

func dedupe(nodes []Node) []Node {
	var out []Node
	for _, nd := range nodes {
		if !slices.ContainsFunc(out, func(o Node) bool { return o.ID == nd.ID }) {
			out = append(out, nd)
		}
	}
	return out
}

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
