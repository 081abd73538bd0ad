package ring

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

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
