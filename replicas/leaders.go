package replicas

import (
	"math"
	"slices"
	"strings"

	"github.com/norn-dev/norn/ring"
)

// Leader balancing, the rule (pure: no clock, no I/O). The loop that feeds
// it and acts on its answer is LeaderBalancer (leaderbalancer.go).
//
// A node's fair share of the partition leaderships is what it would lead
// if every partition's leadership were spread evenly over the eligible
// members of its cohort: each partition gives 1/k to each of its k
// eligible voters. With every node eligible that is the node's replicas
// divided by N, so it follows the ring's placement (and its weights).
// Eligible means: a ring member (not draining, leaving or dead), alive,
// its clock in bound, and telling its leader count through gossip.
//
// A node whose count lies in its band [lo, hi] (LeaderBand: share -+
// tolerance, widened to the integers around the share for small counts)
// is balanced. While every eligible node is (and the deciding node, if it
// is not eligible, leads nothing), no leadership moves: no churn. While
// one is not, as the deciding node sees the counts, a node
// X above its share hands one leadership over to a voter Y of that
// partition whose excess (count - share) is more than one below X's.
// Such a move lowers the sum over the nodes of excess squared by
// 2(e(X) - e(Y) - 1) > 0, so no sequence of moves can cycle and moves
// stop; and it can pass leaderships along: a node at its share that is
// handed one is above it and may hand one on to a node short of
// leaderships that X shares no group with. Among the voters that
// qualify the one with the smallest excess is chosen (ties: the smaller
// count, then the smaller id), and the lowest partition number that has
// it as a voter. Partitions with a move under way are left to the
// rebalance driver.

// LeaderView is what one node knows when it decides whether to hand a
// leadership over. The maps are read, never modified.
type LeaderView struct {
	// Self is the deciding node.
	Self string
	// Cohorts is every partition's cohort as the ring places it.
	Cohorts [][]ring.NodeID
	// Eligible is the set of nodes that may lead now (see above); a
	// node missing from it has no share and is never chosen.
	Eligible map[string]bool
	// Leads is each node's count of leaderships as Self knows it: its
	// own exactly, the others' as well as it can tell (LeaderBalancer
	// errs on the high side).
	Leads map[string]int
	// Led lists, for each partition Self leads, the other voters of the
	// partition's group (its Raft configuration).
	Led map[int][]string
	// Moving is the set of partitions with a move under way.
	Moving map[int]bool
	// Tolerance is the fraction of its share a node may lead above or
	// below it (0.2: within -+20%).
	Tolerance float64
}

// LeaderTransfer is the leadership to hand over: partition Partition's,
// to node To.
type LeaderTransfer struct {
	Partition int
	To        string
}

// eps absorbs the rounding of float sums (a share that is an integer may
// come out a hair above or below it).
const eps = 1e-9

// FairLeaderShares returns each eligible node's fair share of the
// leaderships of the partitions placed by cohorts: each partition gives
// 1/k to each of its k eligible members. A partition without an eligible
// member gives nothing; a node not eligible gets no entry.
func FairLeaderShares(cohorts [][]ring.NodeID, eligible map[string]bool) map[string]float64 {
	out := map[string]float64{}
	for _, c := range cohorts {
		k := 0
		for _, id := range c {
			if eligible[string(id)] {
				k++
			}
		}
		for _, id := range c {
			if eligible[string(id)] {
				out[string(id)] += 1 / float64(k)
			}
		}
	}
	return out
}

// LeaderBand returns the counts [lo, hi] that are balanced for a node of
// fair share share: share -+ tolerance*share, rounded inwards, but never
// narrower than the integers around share (floor and ceiling), so that
// small counts always have a balanced value.
func LeaderBand(share, tolerance float64) (lo, hi int) {
	lo = min(int(math.Ceil(share*(1-tolerance)-eps)), int(math.Floor(share+eps)))
	hi = max(int(math.Floor(share*(1+tolerance)+eps)), int(math.Ceil(share-eps)))
	return max(lo, 0), hi
}

// DecideLeaderTransfer returns the leadership v.Self should hand over
// now, if any (the rule above).
func DecideLeaderTransfer(v LeaderView) (LeaderTransfer, bool) {
	shares := FairLeaderShares(v.Cohorts, v.Eligible)
	if !mayGive(v, shares) {
		return LeaderTransfer{}, false
	}
	excess := func(id string) float64 { return float64(v.Leads[id]) - shares[id] }
	parts := make([]int, 0, len(v.Led))
	for p := range v.Led {
		if !v.Moving[p] {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	best := LeaderTransfer{Partition: -1}
	for _, p := range parts {
		for _, id := range v.Led[p] {
			if id == v.Self || !v.Eligible[id] || excess(v.Self)-excess(id) <= 1+eps {
				continue
			}
			if _, hi := LeaderBand(shares[id], v.Tolerance); v.Leads[id]+1 > hi {
				continue
			}
			if best.Partition < 0 || lessTaker(v.Leads, shares, id, best.To) {
				best = LeaderTransfer{Partition: p, To: id}
			}
		}
	}
	if best.Partition < 0 {
		return LeaderTransfer{}, false
	}
	return best, true
}

// lessTaker orders the nodes a leadership may go to: smaller excess
// (count in leads minus share in shares), then smaller count, then id.
func lessTaker(leads map[string]int, shares map[string]float64, a, b string) bool {
	ea, eb := float64(leads[a])-shares[a], float64(leads[b])-shares[b]
	switch {
	case ea < eb-eps:
		return true
	case eb < ea-eps:
		return false
	case leads[a] != leads[b]:
		return leads[a] < leads[b]
	}
	return strings.Compare(a, b) < 0
}

// PlanLeaderHandOver returns where each leadership v.Self holds should go
// when it stops leading for good (it shuts down): for every partition of
// v.Led, one of its voters there that is eligible, chosen as
// DecideLeaderTransfer chooses a taker (the smallest excess over its fair
// share, then the smaller count, then the smaller id) on counts that
// grow with every choice, and on shares that give v.Self none. So the
// nodes that stay end as balanced as they were, as far as the groups'
// voters allow. Partitions whose voters have the fewest eligible ones go
// first (they have the least choice), then by number. A partition
// without an eligible voter is left out. v.Eligible, v.Moving and
// v.Self's own eligibility are not read beyond that: a partition with a
// move under way is handed over too (the node is going away). v.Leads
// is copied, not modified.
func PlanLeaderHandOver(v LeaderView) []LeaderTransfer {
	eligible := map[string]bool{}
	for id, ok := range v.Eligible {
		if ok && id != v.Self {
			eligible[id] = true
		}
	}
	shares := FairLeaderShares(v.Cohorts, eligible)
	leads := map[string]int{}
	for id, n := range v.Leads {
		leads[id] = n
	}
	type cand struct {
		p   int
		ids []string
	}
	var cands []cand
	for p, ids := range v.Led {
		var ok []string
		for _, id := range ids {
			if eligible[id] && !slices.Contains(ok, id) {
				ok = append(ok, id)
			}
		}
		if len(ok) > 0 {
			cands = append(cands, cand{p, ok})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if len(a.ids) != len(b.ids) {
			return len(a.ids) - len(b.ids)
		}
		return a.p - b.p
	})
	out := make([]LeaderTransfer, 0, len(cands))
	for _, c := range cands {
		best := c.ids[0]
		for _, id := range c.ids[1:] {
			if lessTaker(leads, shares, id, best) {
				best = id
			}
		}
		leads[best]++
		out = append(out, LeaderTransfer{Partition: c.p, To: best})
	}
	return out
}

// mayGive reports whether v.Self may hand a leadership over at all: it
// leads more than its share, and some eligible node is out of its band
// (or v.Self, not eligible, leads some). v.Led is not read.
func mayGive(v LeaderView, shares map[string]float64) bool {
	if float64(v.Leads[v.Self])-shares[v.Self] <= eps {
		return false
	}
	return !Balanced(v.Leads, shares, v.Eligible, v.Tolerance) || (!v.Eligible[v.Self] && v.Leads[v.Self] > 0)
}

// Balanced reports whether every eligible node leads a count within its
// band (LeaderBand of its share in shares).
func Balanced(leads map[string]int, shares map[string]float64, eligible map[string]bool, tolerance float64) bool {
	for id, ok := range eligible {
		if !ok {
			continue
		}
		lo, hi := LeaderBand(shares[id], tolerance)
		if n := leads[id]; n < lo || n > hi {
			return false
		}
	}
	return true
}
