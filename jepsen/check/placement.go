package check

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// PlacementExpect is what the membership-churn nemesis did, as the
// placement checker judges the final placement against it: the node it
// drained (a member holding nothing) and the one it decommissioned (out
// of the ring, stopped), whether the whole sequence ran, the steps that
// went wrong, and how many moves and kills it made (counted, not judged).
type PlacementExpect struct {
	Drained, Decommissioned string
	Done                    bool
	Failures                []string
	Moves, Kills            int
}

// InRing reports whether a NodeStatus role is that of a ring node.
func InRing(role string) bool { return role != "" && role != "not a member" }

// PlacementProblems judges the active nodes' Status answers (sts; errs for
// those that did not answer) against what the churn did (exp), for
// partitions partitions of replication replicas each.
func PlacementProblems(active []string, sts map[string]*nornv1.StatusResponse, errs map[string]error, exp PlacementExpect, partitions int, replication int) []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(errs)) {
		out = append(out, fmt.Sprintf("%s: status: %v", id, errs[id]))
	}
	if len(sts) == 0 {
		return append(out, "no active node answered Status")
	}
	// One ring epoch everywhere.
	epochs := map[uint64][]string{}
	var ref *nornv1.StatusResponse
	for _, id := range active {
		if st := sts[id]; st != nil {
			epochs[st.RingEpoch] = append(epochs[st.RingEpoch], id)
			if ref == nil || st.RingEpoch > ref.RingEpoch {
				ref = st
			}
		}
	}
	if len(epochs) > 1 {
		var s []string
		for ep, ns := range epochs {
			s = append(s, fmt.Sprintf("%d on %s", ep, strings.Join(ns, ",")))
		}
		sort.Strings(s)
		out = append(out, "ring epochs differ: "+strings.Join(s, "; "))
	}
	// No move under way or failed (the freshest ring's view).
	for _, m := range ref.Moves {
		if m.State != "done" {
			out = append(out, fmt.Sprintf("move of partition %d %s -> %s is %s %s", m.Partition, m.FromNode, m.ToNode, m.State, m.Error))
		}
	}
	// Roles as every node sees them.
	isActive := map[string]bool{}
	for _, id := range active {
		isActive[id] = true
	}
	roles := map[string]string{} // the freshest ring's
	replicas := map[string]uint32{}
	for _, nd := range ref.Nodes {
		roles[nd.Id], replicas[nd.Id] = nd.Role, nd.Replicas
	}
	for _, id := range active {
		st := sts[id]
		if st == nil {
			continue
		}
		for _, nd := range st.Nodes {
			if nd.Id == exp.Decommissioned && InRing(nd.Role) {
				out = append(out, fmt.Sprintf("%s sees decommissioned %s as %s", id, nd.Id, nd.Role))
			}
		}
	}
	if exp.Decommissioned != "" && isActive[exp.Decommissioned] {
		out = append(out, fmt.Sprintf("decommissioned %s is still active", exp.Decommissioned))
	}
	if d := exp.Drained; d != "" {
		if roles[d] != "draining" || replicas[d] != 0 {
			out = append(out, fmt.Sprintf("drained %s is %q with %d replicas in the ring, want draining with 0", d, roles[d], replicas[d]))
		}
		if st := sts[d]; st != nil && len(st.Partitions) > 0 {
			out = append(out, fmt.Sprintf("drained %s still replicates %d partitions", d, len(st.Partitions)))
		}
	}
	for id, role := range roles {
		if role == "member" && !isActive[id] {
			out = append(out, fmt.Sprintf("%s is a member but not an active node", id))
		}
	}
	// Every partition: its replicas (the nodes whose Status lists it) are
	// its cohort, N active members, with a leader among them that every
	// replica names.
	type view struct {
		cohort []string
		leader string
	}
	byPart := map[uint32]map[string]view{}
	for _, id := range active {
		st := sts[id]
		if st == nil {
			continue
		}
		for _, p := range st.Partitions {
			if byPart[p.Id] == nil {
				byPart[p.Id] = map[string]view{}
			}
			byPart[p.Id][id] = view{slices.Sorted(slices.Values(p.Cohort)), p.Leader}
		}
	}
	for p := range uint32(partitions) {
		views := byPart[p]
		if len(views) == 0 {
			out = append(out, fmt.Sprintf("partition %d: no active node replicates it", p))
			continue
		}
		holders := slices.Sorted(maps.Keys(views))
		var bad []string
		first := views[holders[0]]
		for _, id := range holders {
			w := views[id]
			if !slices.Equal(w.cohort, first.cohort) || w.leader != first.leader {
				bad = append(bad, fmt.Sprintf("%s sees cohort %s leader %q", id, strings.Join(w.cohort, ","), w.leader))
			}
		}
		if len(bad) > 0 {
			out = append(out, fmt.Sprintf("partition %d: replicas disagree: %s", p, strings.Join(bad, "; ")))
			continue
		}
		switch {
		case len(first.cohort) != replication:
			out = append(out, fmt.Sprintf("partition %d: cohort %s has %d nodes, want %d", p, strings.Join(first.cohort, ","), len(first.cohort), replication))
		case !slices.Equal(holders, first.cohort):
			out = append(out, fmt.Sprintf("partition %d: replicated by %s, its cohort is %s", p, strings.Join(holders, ","), strings.Join(first.cohort, ",")))
		case first.leader == "" || !slices.Contains(first.cohort, first.leader):
			out = append(out, fmt.Sprintf("partition %d: leader %q not in its cohort %s", p, first.leader, strings.Join(first.cohort, ",")))
		}
		for _, m := range first.cohort {
			if roles[m] != "member" || !isActive[m] {
				out = append(out, fmt.Sprintf("partition %d: cohort node %s is %q (active %v), want an active member", p, m, roles[m], isActive[m]))
			}
		}
	}
	return out
}
