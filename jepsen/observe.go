package jepsen

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/jepsen/check"
)

// The checkers that read the live cluster after the heal: convergence
// (every scenario) and placement (membership-churn). They poll Status on
// the active nodes; the placement checker's judgement of what it read is
// check.PlacementProblems.

// CheckConvergence polls Status on every active node until, for every partition,
// the replicas agree (equal anti-entropy roots) and have the same claim
// state (equal applied index and claim digest), or within after the heal
// (time on h's clock) passes.
func CheckConvergence(ctx context.Context, c *Cluster, h *check.History, heal int64, within time.Duration) check.Verdict {
	v := check.Verdict{Checker: "convergence", Counts: map[string]int{}}
	sinceHeal := func() time.Duration { return time.Duration(h.Now() - heal) }
	problems := pollProblems(ctx, sinceHeal, within, func() []string { return convergenceProblems(ctx, c) })
	if len(problems) == 0 {
		v.Valid = true
		v.Counts["ms-after-heal"] = int(sinceHeal().Milliseconds())
		return v
	}
	v.Counts["problems"] = len(problems)
	for _, p := range problems {
		v.Addf("%s", p)
	}
	v.Addf("not converged %s after the heal", within)
	// For the diagnosis: anti-entropy skips the peers gossip does not
	// see up.
	if g := gossipViews(ctx, c); g != "" {
		v.Details = append(v.Details, "gossip: "+g)
	}
	return v
}

// pollProblems calls probe every half second until it finds no problem,
// elapsed passes within or ctx ends, and returns the last problems found.
func pollProblems(ctx context.Context, elapsed func() time.Duration, within time.Duration, probe func() []string) []string {
	for {
		problems := probe()
		if len(problems) == 0 || elapsed() > within || ctx.Err() != nil {
			return problems
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// gossipViews lists, for each active node, the other active nodes its
// gossip does not see alive ("" when every node sees every other alive).
func gossipViews(ctx context.Context, c *Cluster) string {
	active := c.Active()
	var out []string
	for _, n := range active {
		st, err := n.Status(ctx, false)
		if err != nil {
			continue
		}
		var not []string
		for _, nd := range st.Nodes {
			if o := c.Node(nd.Id); o != nil && o != n && c.IsActive(o) && nd.State != "alive" {
				not = append(not, nd.Id+" "+nd.State)
			}
		}
		if len(not) > 0 {
			out = append(out, n.ID+" sees "+strings.Join(not, ", "))
		}
	}
	return strings.Join(out, "; ")
}

func convergenceProblems(ctx context.Context, c *Cluster) []string {
	var out []string
	type claimState struct{ applied, digest uint64 }
	states := map[uint32]map[string]claimState{}
	for _, n := range c.Active() {
		st, err := n.Status(ctx, true)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: status: %v", n.ID, connect.CodeOf(err)))
			continue
		}
		for _, p := range st.Partitions {
			if !p.ReplicasAgree {
				out = append(out, fmt.Sprintf("%s: partition %d replicas disagree: %s", n.ID, p.Id, roots(p.ReplicaRoots)))
			}
			if states[p.Id] == nil {
				states[p.Id] = map[string]claimState{}
			}
			states[p.Id][n.ID] = claimState{p.ClaimApplied, p.ClaimDigest}
		}
	}
	var parts []uint32
	for p := range states {
		parts = append(parts, p)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
	for _, p := range parts {
		var first claimState
		for _, x := range states[p] {
			first = x
			break
		}
		for _, x := range states[p] {
			if x != first {
				var s []string
				for id, x := range states[p] {
					s = append(s, fmt.Sprintf("%s=%d/%x", id, x.applied, x.digest))
				}
				sort.Strings(s)
				out = append(out, fmt.Sprintf("partition %d: claim state (applied index/digest) differs: %s", p, strings.Join(s, " ")))
				break
			}
		}
	}
	return out
}

func roots(rs []*nornv1.ReplicaRoot) string {
	var s []string
	for _, r := range rs {
		if r.Error != "" {
			s = append(s, r.NodeId+"=error("+r.Error+")")
		} else {
			s = append(s, fmt.Sprintf("%s=%x", r.NodeId, r.Root))
		}
	}
	return strings.Join(s, " ")
}

// CheckPlacement is the placement checker of the membership-churn
// scenario, after the heal: it polls Status on every active node until
// no move is under way or failed; every partition has exactly N replicas,
// its cohort, all on active member nodes, with its group's leader among
// them (as every replica sees it); the decommissioned node is out of the
// ring; the drained node replicates nothing; and every node works with
// the same ring epoch; or until within passes. The churn nemesis's own
// failures (a step refused, moves not done in time, the sequence cut
// short) fail it too.
func CheckPlacement(ctx context.Context, c *Cluster, ch *Churn, within time.Duration) check.Verdict {
	v := check.Verdict{Checker: "placement", Counts: map[string]int{}}
	exp := ch.expect()
	v.Counts["moves"], v.Counts["kills"] = exp.Moves, exp.Kills
	start := time.Now()
	var epoch uint64
	problems := pollProblems(ctx, func() time.Duration { return time.Since(start) }, within, func() []string {
		sts := map[string]*nornv1.StatusResponse{}
		errs := map[string]error{}
		var active []string
		for _, n := range c.Active() {
			active = append(active, n.ID)
			st, err := n.Status(ctx, false)
			if err != nil {
				errs[n.ID] = err
				continue
			}
			sts[n.ID] = st
			epoch = st.RingEpoch
		}
		return check.PlacementProblems(active, sts, errs, exp, c.Cfg.Partitions, Replication)
	})
	v.Counts["ring-epoch"] = int(epoch)
	for _, f := range exp.Failures {
		v.Addf("churn: %s", f)
	}
	if !exp.Done {
		v.Addf("churn: the sequence did not complete")
	}
	v.Counts["problems"] = len(problems)
	for _, p := range problems {
		v.Addf("%s", p)
	}
	if len(problems) > 0 {
		v.Addf("placement not as expected %s after the convergence check", within)
	} else {
		v.Counts["ms-to-settle"] = int(time.Since(start).Milliseconds())
	}
	v.Valid = len(problems) == 0 && len(exp.Failures) == 0 && exp.Done
	return v
}

// CheckCounts is the counts checker, after the drain and the final read:
// it polls until the cluster's task counters agree between replicas,
// with the stored tasks and with the history (check.CountsProblems), or
// within passes.
func CheckCounts(ctx context.Context, c *Cluster, h *check.History, within time.Duration) check.Verdict {
	v := check.Verdict{Checker: "counts", Counts: map[string]int{}}
	start := time.Now()
	problems := pollProblems(ctx, func() time.Duration { return time.Since(start) }, within, func() []string {
		obs, err := observeCounts(ctx, c)
		if err != nil {
			return []string{err.Error()}
		}
		var total uint64
		for _, n := range obs.Counted {
			total += n
		}
		v.Counts["tasks"] = int(total)
		return check.CountsProblems(h.Ops(), obs)
	})
	if len(problems) == 0 {
		v.Valid = true
		v.Counts["ms-to-agree"] = int(time.Since(start).Milliseconds())
		return v
	}
	v.Counts["problems"] = len(problems)
	for _, p := range problems {
		v.Addf("%s", p)
	}
	v.Addf("counts not as expected %s after the drain", within)
	return v
}

// observeCounts reads every active node's per-partition counts (every
// queue), and CountTasks and a full ListTasks of the workload's queue
// (the retention clients' queue has tasks of its own) from the first
// active node.
func observeCounts(ctx context.Context, c *Cluster) (check.CountsObservation, error) {
	obs := check.CountsObservation{Replicas: map[uint32]map[string]map[string]uint64{}, Listed: map[string]uint64{}}
	active := c.Active()
	if len(active) == 0 {
		return obs, fmt.Errorf("no active node")
	}
	for _, n := range active {
		st, err := n.Status(ctx, true)
		if err != nil {
			return obs, fmt.Errorf("%s: status: %v", n.ID, err)
		}
		for _, p := range st.Partitions {
			if obs.Replicas[p.Id] == nil {
				obs.Replicas[p.Id] = map[string]map[string]uint64{}
			}
			obs.Replicas[p.Id][n.ID] = p.Counts
		}
	}
	n := active[0]
	cnt, err := n.Tasks.CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{Queue: Queue}))
	if err != nil {
		return obs, fmt.Errorf("%s: CountTasks: %v", n.ID, err)
	}
	obs.Counted = cnt.Msg.ByStatus
	for tok, pages := "", 0; ; pages++ {
		r, err := n.Tasks.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{Queue: Queue, PageSize: 1000, PageToken: tok}))
		if err != nil {
			return obs, fmt.Errorf("%s: ListTasks: %v", n.ID, err)
		}
		for _, t := range r.Msg.Tasks {
			obs.Listed[strings.TrimPrefix(t.Status.String(), "TASK_STATUS_")]++
		}
		if tok = r.Msg.NextPageToken; tok == "" {
			return obs, nil
		}
		if pages > 100_000 {
			return obs, fmt.Errorf("%s: ListTasks does not end", n.ID)
		}
	}
}

// queueSettled reports whether nothing of the workload's queue can come
// out for the drain before until: every active node counts no task of the
// queue READY or DELAYED, and each task it lists CLAIMED holds a live
// claim whose lease runs past until (a claim the workload made with a
// long lease, which no drain waits out). Each node reads the partitions
// it replicates from its own replicas, and a replica behind (a renew, a
// claim's end or a revival it has not applied) shows the task sooner to
// come out, so the drain goes on; an error is "not settled". Only the
// drain's end rests on it: a task it misses is still read at the end and
// judged by the checkers.
func queueSettled(ctx context.Context, c *Cluster, until time.Time) bool {
	active := c.Active()
	if len(active) == 0 {
		return false
	}
	for _, n := range active {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := n.Tasks.CountTasks(cctx, connect.NewRequest(&nornv1.CountTasksRequest{Queue: Queue}))
		cancel()
		if err != nil || r.Msg.ByStatus["READY"] > 0 || r.Msg.ByStatus["DELAYED"] > 0 {
			return false
		}
		if r.Msg.ByStatus["CLAIMED"] > 0 && !claimsOutlast(ctx, n, until) {
			return false
		}
	}
	return true
}

// claimsOutlast reports whether every task of the workload's queue that n
// lists CLAIMED holds a live claim expiring after until.
func claimsOutlast(ctx context.Context, n *Node, until time.Time) bool {
	for tok, pages := "", 0; pages < 20; pages++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := n.Tasks.ListTasks(cctx, connect.NewRequest(&nornv1.ListTasksRequest{Queue: Queue,
			Status: nornv1.TaskStatus_TASK_STATUS_CLAIMED, PageSize: 1000, PageToken: tok}))
		cancel()
		if err != nil {
			return false
		}
		for _, t := range r.Msg.Tasks {
			cs := t.GetClaims()
			if len(cs) == 0 || cs[len(cs)-1].GetEndReason() != nornv1.ClaimEnd_CLAIM_END_UNSPECIFIED ||
				!cs[len(cs)-1].GetExpiry().AsTime().After(until) {
				return false
			}
		}
		if tok = r.Msg.NextPageToken; tok == "" {
			return true
		}
	}
	return false
}
