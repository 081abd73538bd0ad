package ring

import (
	"flag"
	"fmt"
	"math/rand/v2"
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
