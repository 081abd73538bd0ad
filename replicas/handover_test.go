package replicas

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/ring"
)

func TestPlanLeaderHandOver(t *testing.T) {
	// count returns how many of plan go to each node.
	count := func(plan []LeaderTransfer) map[string]int {
		out := map[string]int{}
		for _, tr := range plan {
			out[tr.To]++
		}
		return out
	}
	all := set("n1", "n2", "n3")
	for _, c := range []struct {
		name     string
		cohorts  [][]ring.NodeID
		eligible map[string]bool
		leads    map[string]int
		led      map[int][]string
		want     map[string]int // transfers per taker
	}{
		{name: "balanced: split evenly", cohorts: fullCohorts(24, "n1", "n2", "n3"), eligible: all,
			leads: map[string]int{"n1": 8, "n2": 8, "n3": 8}, led: ledBy(8, "n2", "n3"),
			want: map[string]int{"n2": 4, "n3": 4}},
		{name: "uneven: the survivors end even", cohorts: fullCohorts(24, "n1", "n2", "n3"), eligible: all,
			leads: map[string]int{"n1": 8, "n2": 10, "n3": 6}, led: ledBy(8, "n2", "n3"),
			want: map[string]int{"n2": 2, "n3": 6}},
		{name: "itself not eligible (the plan ignores it)", cohorts: fullCohorts(24, "n1", "n2", "n3"), eligible: set("n2", "n3"),
			leads: map[string]int{"n1": 8, "n2": 8, "n3": 8}, led: ledBy(8, "n2", "n3"),
			want: map[string]int{"n2": 4, "n3": 4}},
		{name: "a node whose clock is out of bound takes nothing", cohorts: fullCohorts(24, "n1", "n2", "n3"), eligible: set("n1", "n2"),
			leads: map[string]int{"n1": 8, "n2": 8, "n3": 8}, led: ledBy(8, "n2", "n3"),
			want: map[string]int{"n2": 8}},
		{name: "settling nodes (false) take nothing", cohorts: fullCohorts(24, "n1", "n2", "n3"),
			eligible: map[string]bool{"n1": true, "n2": true, "n3": false},
			leads:    map[string]int{"n1": 8, "n2": 8, "n3": 8}, led: ledBy(8, "n2", "n3"),
			want: map[string]int{"n2": 8}},
		{name: "no eligible voter: left out", cohorts: fullCohorts(24, "n1", "n2", "n3"), eligible: set("n1", "n2"),
			leads: map[string]int{"n1": 3}, led: map[int][]string{0: {"n3"}, 1: {"n2", "n3"}, 2: {}},
			want: map[string]int{"n2": 1}},
		{name: "nothing led", cohorts: fullCohorts(24, "n1", "n2", "n3"), eligible: all,
			leads: map[string]int{"n2": 12, "n3": 12}, led: map[int][]string{}, want: map[string]int{}},
		{
			// 4 nodes, n4 not eligible: partitions 4-7 have n2 as their
			// only voter that may take them, 0-3 both n2 and n3 (shares:
			// n2 6, n3 2). Taken in number order, 0-3 would all go to n2
			// (the furthest below its share) and 4-7 on top: 8 and 0. The
			// constrained ones first: 6 and 2.
			name: "the partitions with the least choice first",
			cohorts: [][]ring.NodeID{{"n1", "n2", "n3"}, {"n1", "n2", "n3"}, {"n1", "n2", "n3"}, {"n1", "n2", "n3"},
				{"n1", "n2", "n4"}, {"n1", "n2", "n4"}, {"n1", "n2", "n4"}, {"n1", "n2", "n4"}},
			eligible: set("n1", "n2", "n3"),
			leads:    map[string]int{"n1": 8},
			led: map[int][]string{0: {"n2", "n3"}, 1: {"n2", "n3"}, 2: {"n2", "n3"}, 3: {"n2", "n3"},
				4: {"n2", "n4"}, 5: {"n2", "n4"}, 6: {"n2", "n4"}, 7: {"n2", "n4"}},
			want: map[string]int{"n2": 6, "n3": 2},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			leads := maps.Clone(c.leads)
			v := LeaderView{Self: "n1", Cohorts: c.cohorts, Eligible: c.eligible, Leads: c.leads, Led: c.led, Tolerance: 0.2}
			plan := PlanLeaderHandOver(v)
			if got := count(plan); !maps.Equal(got, c.want) {
				t.Fatalf("plan %v: per taker %v, want %v", plan, got, c.want)
			}
			seen := map[int]bool{}
			for _, tr := range plan {
				if seen[tr.Partition] || !containsID(c.led[tr.Partition], tr.To) {
					t.Fatalf("plan %v: partition %d twice, or to a node not its voter", plan, tr.Partition)
				}
				seen[tr.Partition] = true
			}
			if !maps.Equal(leads, c.leads) {
				t.Fatalf("Leads modified: %v, was %v", c.leads, leads)
			}
		})
	}
}

func containsID(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// TestLeaderBalancerHandOver: a node that stops hands every leadership it
// holds over, the survivors ending even, gossips at once that it may
// not lead, and afterwards claims no share and hands over at once any
// leadership it is given again.
func TestLeaderBalancerHandOver(t *testing.T) {
	c := newFakeCluster(t, 24)
	c.lead("n1", 0, 8)
	c.lead("n2", 8, 18)
	c.lead("n3", 18, 24)
	b := c.balancer(100, 100, time.Hour) // n2 and n3 still settling: they take them all the same
	res := b.HandOver(context.Background(), 3)
	if res.Led != 8 || res.HandedOver != 8 || res.Failed != 0 || len(res.Left) != 0 || res.Reason != "" {
		t.Fatalf("result %+v, want 8 led, 8 handed over", res)
	}
	if c.count("n1") != 0 || c.count("n2") != 12 || c.count("n3") != 12 {
		t.Fatalf("leads n1 %d, n2 %d, n3 %d; want 0, 12, 12", c.count("n1"), c.count("n2"), c.count("n3"))
	}
	if len(c.published) == 0 || !c.published[0].NoLead || c.published[0].Count != 8 {
		t.Fatalf("published %+v, want no-lead first, before any transfer (count 8)", c.published)
	}
	// Given one back (an election it won while waiting to close): the
	// next pass hands it over again, and Loads show it not eligible.
	c.leader[0] = "n1"
	n := len(c.transfers)
	b.Pass()
	if got := c.transfers[n:]; len(got) != 1 || got[0].Partition != 0 || c.count("n1") != 0 {
		t.Fatalf("a pass after the hand-over, leading partition 0 again, made transfers %v (n1 leads %d), want partition 0's", got, c.count("n1"))
	}
	// Leading nothing, a pass transfers nothing.
	n = len(c.transfers)
	b.Pass()
	if len(c.transfers) != n {
		t.Fatalf("a pass after the hand-over made transfers %v", c.transfers[n:])
	}
	if l := b.Loads()["n1"]; l.Eligible || l.Share != 0 {
		t.Fatalf("own load %+v, want not eligible", l)
	}
	if last := c.published[len(c.published)-1]; !last.NoLead {
		t.Fatalf("published %+v after the hand-over", last)
	}
}

// TestLeaderBalancerHandOverFailures: a voter whose transfers fail is left
// out of the next plans; a cluster of one, or one whose other voters may
// not lead, returns at once and says why; a hand-over whose context ends
// returns at once with what is left.
func TestLeaderBalancerHandOverFailures(t *testing.T) {
	c := newFakeCluster(t, 24)
	c.lead("n1", 0, 8)
	c.lead("n2", 8, 16)
	c.lead("n3", 16, 24)
	c.fail["n2"] = errors.New("leadership transfer timeout")
	res := c.balancer(1, 1, 0).HandOver(context.Background(), 2)
	if c.count("n1") != 0 || c.count("n3") != 16 || res.HandedOver != 8 || res.Failed == 0 || len(res.Left) != 0 {
		t.Fatalf("n2 failing: n1 leads %d, n3 %d, result %+v; want everything to n3", c.count("n1"), c.count("n3"), res)
	}

	c = newFakeCluster(t, 24)
	c.lead("n1", 0, 8)
	c.fail["n2"] = errors.New("leadership transfer timeout")
	c.fail["n3"] = errors.New("leadership transfer timeout")
	res = c.balancer(1, 1, 0).HandOver(context.Background(), 2)
	if len(res.Left) != 8 || !strings.Contains(res.Reason, "failed") {
		t.Fatalf("every transfer failing: result %+v", res)
	}

	c = newFakeCluster(t, 8)
	c.lead("n1", 0, 8)
	c.state["n2"], c.state["n3"] = cluster.StateDead, cluster.StateSuspect
	res = c.balancer(1, 1, 0).HandOver(context.Background(), 2)
	if len(res.Left) != 8 || !strings.Contains(res.Reason, "no other voter may lead") || len(c.transfers) != 0 {
		t.Fatalf("no healthy peer: result %+v, transfers %v", res, c.transfers)
	}

	c = newFakeCluster(t, 8)
	c.ring.Nodes = c.ring.Nodes[:1]
	c.ring.Placement.Cohorts = fullCohorts(8, "n1")
	c.lead("n1", 0, 8)
	res = c.balancer(1, 1, 0).HandOver(context.Background(), 2)
	if len(res.Left) != 8 || !strings.Contains(res.Reason, "only voter") {
		t.Fatalf("a cluster of one: result %+v", res)
	}

	c = newFakeCluster(t, 8)
	c.lead("n1", 0, 8)
	c.block = make(chan struct{})
	defer close(c.block)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan HandOverResult)
	go func() { done <- c.balancer(1, 1, 0).HandOver(ctx, 2) }()
	cancel()
	if res := <-done; len(res.Left) != 8 || !strings.Contains(res.Reason, "stopped before") {
		t.Fatalf("cancelled: result %+v", res)
	}
}
