package replicas

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/norn-dev/norn/ring"
)

// fullCohorts places p partitions on every one of nodes (N = len(nodes)).
func fullCohorts(p int, nodes ...string) [][]ring.NodeID {
	c := make([]ring.NodeID, len(nodes))
	for i, id := range nodes {
		c[i] = ring.NodeID(id)
	}
	out := make([][]ring.NodeID, p)
	for i := range out {
		out[i] = c
	}
	return out
}

func set(ids ...string) map[string]bool {
	out := map[string]bool{}
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// ledBy lists partitions 0..n-1 as led by self, each with voters.
func ledBy(n int, voters ...string) map[int][]string {
	out := map[int][]string{}
	for p := range n {
		out[p] = voters
	}
	return out
}

func TestLeaderBand(t *testing.T) {
	for _, c := range []struct {
		share, tol float64
		lo, hi     int
	}{
		{64.0 / 3, 0.2, 18, 25}, // the cluster: 17.07..25.6
		{32.0 / 3, 0.2, 9, 12},  // 8.53..12.8
		{16.0 / 3, 0.2, 5, 6},   // 4.27..6.4
		{8.0 / 3, 0.2, 2, 3},    // 2.13..3.2 holds only 3: widened to floor and ceiling
		{10, 0.2, 8, 12},        // exact products are not lost to rounding
		{5, 0.2, 4, 6},
		{1, 0.2, 1, 1},
		{1.0 / 3, 0.2, 0, 1},
		{0, 0.2, 0, 0}, // not eligible: leads nothing
		{20, 0.5, 10, 30},
		{2, 0.01, 2, 2},
	} {
		lo, hi := LeaderBand(c.share, c.tol)
		if lo != c.lo || hi != c.hi {
			t.Errorf("LeaderBand(%g, %g) = [%d, %d], want [%d, %d]", c.share, c.tol, lo, hi, c.lo, c.hi)
		}
	}
}

func TestFairLeaderShares(t *testing.T) {
	near := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
	// Weighted as the ring places: n1 holds every partition, n2 and n3
	// half each (N = 2).
	var cohorts [][]ring.NodeID
	for p := range 8 {
		other := ring.NodeID("n2")
		if p%2 == 1 {
			other = "n3"
		}
		cohorts = append(cohorts, []ring.NodeID{"n1", other})
	}
	got := FairLeaderShares(cohorts, set("n1", "n2", "n3"))
	if !near(got["n1"], 4) || !near(got["n2"], 2) || !near(got["n3"], 2) {
		t.Errorf("weighted shares %v, want n1 4, n2 2, n3 2", got)
	}
	// A node that may not lead has no share; its partitions go to the
	// rest of their cohorts; a partition with no eligible member to no
	// one.
	got = FairLeaderShares(cohorts, set("n1", "n2"))
	if !near(got["n1"], 6) || !near(got["n2"], 2) || got["n3"] != 0 {
		t.Errorf("shares without n3 %v, want n1 6, n2 2", got)
	}
	got = FairLeaderShares(cohorts, set("n3"))
	if !near(got["n3"], 4) || len(got) != 1 {
		t.Errorf("shares of n3 alone %v, want n3 4", got)
	}
	if got := FairLeaderShares(fullCohorts(64, "n1", "n2", "n3"), set("n1", "n2", "n3")); !near(got["n1"], 64.0/3) {
		t.Errorf("3 of 3: %v", got)
	}
}

func TestDecideLeaderTransfer(t *testing.T) {
	all := set("n1", "n2", "n3")
	for _, c := range []struct {
		name     string
		eligible map[string]bool
		leads    map[string]int
		led      map[int][]string
		moving   map[int]bool
		want     LeaderTransfer
		wantOK   bool
	}{
		{name: "balanced", eligible: all, leads: map[string]int{"n1": 22, "n2": 21, "n3": 21},
			led: ledBy(22, "n2", "n3")},
		{name: "balanced at the edges of the band", eligible: all, leads: map[string]int{"n1": 25, "n2": 21, "n3": 18},
			led: ledBy(25, "n2", "n3")},
		{name: "below its share: never gives", eligible: all, leads: map[string]int{"n1": 21, "n2": 43, "n3": 0},
			led: ledBy(21, "n2", "n3")},
		{name: "skewed: to the least loaded", eligible: all, leads: map[string]int{"n1": 54, "n2": 10, "n3": 0},
			led: ledBy(54, "n2", "n3"), want: LeaderTransfer{Partition: 0, To: "n3"}, wantOK: true},
		{name: "above the band: to a node below its share", eligible: all, leads: map[string]int{"n1": 26, "n2": 20, "n3": 18},
			led: ledBy(26, "n2", "n3"), want: LeaderTransfer{Partition: 0, To: "n3"}, wantOK: true},
		{name: "above the band, every other above its share too", eligible: all, leads: map[string]int{"n1": 26, "n2": 22, "n3": 22},
			led: ledBy(26, "n2", "n3"), want: LeaderTransfer{Partition: 0, To: "n2"}, wantOK: true},
		{name: "unbalanced, but no voter more than one below", eligible: all, leads: map[string]int{"n1": 26, "n2": 26, "n3": 12},
			led: ledBy(26, "n2")},
		{name: "below its share, another out of band: never gives", eligible: all, leads: map[string]int{"n1": 20, "n2": 30, "n3": 14},
			led: ledBy(20, "n2", "n3")},
		{name: "relays: above its share, in band, to a node more than one below", eligible: all,
			leads: map[string]int{"n1": 23, "n2": 30, "n3": 11},
			led:   map[int][]string{0: {"n3"}}, want: LeaderTransfer{Partition: 0, To: "n3"}, wantOK: true},
		{name: "above its share: to a node below the band", eligible: all, leads: map[string]int{"n1": 23, "n2": 24, "n3": 17},
			led: ledBy(23, "n2", "n3"), want: LeaderTransfer{Partition: 0, To: "n3"}, wantOK: true},
		{name: "a node whose clock is out of bound is never chosen", eligible: set("n1", "n2"),
			leads: map[string]int{"n1": 54, "n2": 10, "n3": 0},
			led:   ledBy(54, "n2", "n3"), want: LeaderTransfer{Partition: 0, To: "n2"}, wantOK: true},
		{name: "nobody eligible to take", eligible: set("n1"), leads: map[string]int{"n1": 54, "n2": 10, "n3": 0},
			led: ledBy(54, "n2", "n3")},
		{name: "only voters of the led partition", eligible: all, leads: map[string]int{"n1": 54, "n2": 10, "n3": 0},
			led: map[int][]string{4: {"n2"}, 7: {"n2"}}, want: LeaderTransfer{Partition: 4, To: "n2"}, wantOK: true},
		{name: "partitions with a move under way are skipped", eligible: all, leads: map[string]int{"n1": 54, "n2": 10, "n3": 0},
			led: map[int][]string{0: {"n2", "n3"}, 1: {"n2", "n3"}, 2: {"n2"}}, moving: set2(0, 1),
			want: LeaderTransfer{Partition: 2, To: "n2"}, wantOK: true},
		{name: "only moving partitions", eligible: all, leads: map[string]int{"n1": 54, "n2": 10, "n3": 0},
			led: map[int][]string{0: {"n2", "n3"}}, moving: set2(0)},
		{name: "ties: the smaller id", eligible: all, leads: map[string]int{"n1": 30, "n2": 17, "n3": 17},
			led: ledBy(30, "n3", "n2"), want: LeaderTransfer{Partition: 0, To: "n2"}, wantOK: true},
		{name: "not eligible itself (draining): gives everything", eligible: set("n2", "n3"),
			leads: map[string]int{"n1": 1, "n2": 31, "n3": 32},
			led:   ledBy(1, "n2", "n3"), want: LeaderTransfer{Partition: 0, To: "n2"}, wantOK: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := LeaderView{Self: "n1", Cohorts: fullCohorts(64, "n1", "n2", "n3"), Eligible: c.eligible,
				Leads: c.leads, Led: c.led, Moving: c.moving, Tolerance: 0.2}
			got, ok := DecideLeaderTransfer(v)
			if ok != c.wantOK || got != c.want {
				t.Fatalf("DecideLeaderTransfer = %+v, %v; want %+v, %v", got, ok, c.want, c.wantOK)
			}
		})
	}
}

func set2(ps ...int) map[int]bool {
	out := map[int]bool{}
	for _, p := range ps {
		out[p] = true
	}
	return out
}

// TestLeaderBalanceConverges plays the rule on random clusters (3 to 7
// nodes, N=3, 8 to 64 partitions, skewed leaders, sometimes a node whose
// clock is out of bound) against a naive model where every node sees
// every count exactly and each round every node makes at most one
// transfer: the transfers stop, a node once in its band never leaves it
// (so a balanced cluster sees none), and every node with a share of 5 or
// more ends in its band.
func TestLeaderBalanceConverges(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	for trial := range 1000 {
		nodes := 3 + rng.IntN(5)
		n := min(3, nodes)
		parts := 8 << rng.IntN(4)
		ids := make([]string, nodes)
		for i := range ids {
			ids[i] = fmt.Sprintf("n%d", i)
		}
		cohorts := make([][]ring.NodeID, parts)
		leader := make([]string, parts)
		for p := range parts {
			perm := rng.Perm(nodes)[:n]
			for _, i := range perm {
				cohorts[p] = append(cohorts[p], ring.NodeID(ids[i]))
			}
			// Skewed on purpose: mostly the cohort's first member.
			leader[p] = string(cohorts[p][0])
			if rng.IntN(4) == 0 {
				leader[p] = string(cohorts[p][rng.IntN(n)])
			}
		}
		eligible := set(ids...)
		if rng.IntN(3) == 0 {
			delete(eligible, ids[rng.IntN(nodes)]) // one node's clock is out of bound
		}
		shares := FairLeaderShares(cohorts, eligible)
		// An ineligible node's leaderships are handed over by its clock
		// guard, not by this rule: give them to an eligible member.
		for p := range parts {
			if !eligible[leader[p]] {
				for _, id := range cohorts[p] {
					if eligible[string(id)] {
						leader[p] = string(id)
						break
					}
				}
			}
		}
		view := func(self string) LeaderView {
			v := LeaderView{Self: self, Cohorts: cohorts, Eligible: eligible, Leads: map[string]int{},
				Led: map[int][]string{}, Tolerance: 0.2}
			for p, l := range leader {
				v.Leads[l]++
				if l == self {
					for _, id := range cohorts[p] {
						if string(id) != self {
							v.Led[p] = append(v.Led[p], string(id))
						}
					}
				}
			}
			return v
		}
		inBand := func(id string) bool {
			lo, hi := LeaderBand(shares[id], 0.2)
			n := view(id).Leads[id]
			return lo <= n && n <= hi
		}
		wasIn := map[string]bool{}
		for _, id := range ids {
			wasIn[id] = inBand(id)
		}
		moves := 0
		for round := 0; ; round++ {
			if round > parts {
				t.Fatalf("seed %d trial %d: still moving after %d rounds", seed, trial, round)
			}
			moved := false
			for _, id := range ids {
				if !eligible[id] {
					continue
				}
				tr, ok := DecideLeaderTransfer(view(id))
				if !ok {
					continue
				}
				if leader[tr.Partition] != id || !slices.Contains(cohorts[tr.Partition], ring.NodeID(tr.To)) {
					t.Fatalf("seed %d trial %d: %s hands over %+v, which it does not lead or To does not hold", seed, trial, id, tr)
				}
				leader[tr.Partition] = tr.To
				moved = true
				moves++
			}
			for _, id := range ids {
				if wasIn[id] && !inBand(id) {
					t.Fatalf("seed %d trial %d: %s left its band (%d leads, share %.2f)", seed, trial, id, view(id).Leads[id], shares[id])
				}
				wasIn[id] = wasIn[id] || inBand(id)
			}
			if !moved {
				break
			}
		}
		// A node whose share is 5 or more (its band at least 2 wide) ends
		// in its band (200,000 trials). Below that the rule may stop
		// short: with 8 partitions on 7 nodes a node may lead 2 for a
		// share of 1 while every other voter of its groups leads its own
		// share, and the node short of one shares no group with it.
		for _, id := range ids {
			if eligible[id] && !inBand(id) && shares[id] >= 5 {
				t.Errorf("seed %d trial %d: %s ends with %d leads, share %.2f, out of its band (%d moves)",
					seed, trial, id, view(id).Leads[id], shares[id], moves)
			}
		}
	}
}
