package check

import (
	"errors"
	"strings"
	"testing"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// settled builds the Status answers of a settled churn: 5 slots, n1
// drained, n2 decommissioned (not active), n3-n5 holding every partition
// of 4, led by n3.
func settled() (active []string, sts map[string]*nornv1.StatusResponse) {
	active = []string{"n1", "n3", "n4", "n5"}
	nodes := func() []*nornv1.NodeStatus {
		return []*nornv1.NodeStatus{
			{Id: "n1", Role: "draining", Replicas: 0},
			{Id: "n2", Role: "not a member", State: "dead"},
			{Id: "n3", Role: "member", Replicas: 4},
			{Id: "n4", Role: "member", Replicas: 4},
			{Id: "n5", Role: "member", Replicas: 4},
		}
	}
	sts = map[string]*nornv1.StatusResponse{}
	for _, id := range active {
		st := &nornv1.StatusResponse{NodeId: id, RingEpoch: 40, Nodes: nodes(),
			Moves: []*nornv1.MoveStatus{{Partition: 1, FromNode: "n2", ToNode: "n5", State: "done"}}}
		if id != "n1" {
			for p := range uint32(4) {
				st.Partitions = append(st.Partitions, &nornv1.PartitionStatus{Id: p, Leader: "n3", Cohort: []string{"n5", "n3", "n4"}})
			}
		}
		sts[id] = st
	}
	return active, sts
}

// TestPlacementProblems: the settled placement passes; each broken
// expectation is named.
func TestPlacementProblems(t *testing.T) {
	exp := PlacementExpect{Drained: "n1", Decommissioned: "n2", Done: true}
	check := func() []string {
		active, sts := settled()
		return PlacementProblems(active, sts, nil, exp, 4, 3)
	}
	if ps := check(); len(ps) != 0 {
		t.Fatalf("settled placement: %v", ps)
	}
	cases := []struct {
		name, want string
		mutate     func(active []string, sts map[string]*nornv1.StatusResponse) []string
	}{
		{"move under way", "is catching-up", func(a []string, sts map[string]*nornv1.StatusResponse) []string {
			for _, st := range sts {
				st.Moves[0].State = "catching-up"
			}
			return a
		}},
		{"epochs differ", "ring epochs differ", func(a []string, sts map[string]*nornv1.StatusResponse) []string {
			sts["n4"].RingEpoch = 39
			return a
		}},
		{"decommissioned still in the ring", "sees decommissioned n2 as leaving", func(a []string, sts map[string]*nornv1.StatusResponse) []string {
			sts["n5"].Nodes[1].Role = "leaving"
			return a
		}},
		{"drained still replicates", "drained n1 still replicates 1 partitions", func(a []string, sts map[string]*nornv1.StatusResponse) []string {
			sts["n1"].Partitions = []*nornv1.PartitionStatus{{Id: 0, Leader: "n3", Cohort: []string{"n3", "n4", "n5"}}}
			return a
		}},
		{"fourth replica", "replicated by n1,n3,n4,n5", func(a []string, sts map[string]*nornv1.StatusResponse) []string {
			sts["n1"].Partitions = []*nornv1.PartitionStatus{{Id: 2, Leader: "n3", Cohort: []string{"n3", "n4", "n5"}}}
			return a
		}},
		{"leader outside the cohort", `leader "n1" not in its cohort`, func(a []string, sts map[string]*nornv1.StatusResponse) []string {
			for _, st := range sts {
				for _, p := range st.Partitions {
					if p.Id == 3 {
						p.Leader = "n1"
					}
				}
			}
			return a
		}},
		{"replicas disagree on the leader", "replicas disagree", func(a []string, sts map[string]*nornv1.StatusResponse) []string {
			sts["n4"].Partitions[0].Leader = "n5"
			return a
		}},
		{"cohort on a non-member", `cohort node n1 is "draining"`, func(a []string, sts map[string]*nornv1.StatusResponse) []string {
			for _, id := range []string{"n3", "n4"} {
				sts[id].Partitions[0].Cohort = []string{"n1", "n3", "n4"}
			}
			sts["n1"].Partitions = []*nornv1.PartitionStatus{{Id: 0, Leader: "n3", Cohort: []string{"n1", "n3", "n4"}}}
			sts["n5"].Partitions = sts["n5"].Partitions[1:]
			return a
		}},
		{"partition nowhere", "partition 0: no active node replicates it", func(a []string, sts map[string]*nornv1.StatusResponse) []string {
			for _, id := range []string{"n3", "n4", "n5"} {
				sts[id].Partitions = sts[id].Partitions[1:]
			}
			return a
		}},
		{"decommissioned still active", "decommissioned n2 is still active", func(a []string, sts map[string]*nornv1.StatusResponse) []string {
			sts["n2"] = &nornv1.StatusResponse{NodeId: "n2", RingEpoch: 40, Nodes: sts["n3"].Nodes}
			return append(a, "n2")
		}},
	}
	for _, c := range cases {
		active, sts := settled()
		active = c.mutate(active, sts)
		ps := PlacementProblems(active, sts, nil, exp, 4, 3)
		if !strings.Contains(strings.Join(ps, "\n"), c.want) {
			t.Errorf("%s: want a problem containing %q, got %q", c.name, c.want, ps)
		}
	}
	active, sts := settled()
	delete(sts, "n4")
	if ps := PlacementProblems(active, sts, map[string]error{"n4": errors.New("refused")}, exp, 4, 3); len(ps) == 0 || !strings.Contains(ps[0], "n4: status") {
		t.Errorf("a node without Status not reported: %v", ps)
	}
}
