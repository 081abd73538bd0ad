package jepsen

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// The membership-churn scenario: placement changes through AdminService
// under the workload, with kill -9 of the nodes a move is running
// between, and a placement check at the end.

// Churn is what the membership-churn nemesis did, for the placement
// checker: the nodes it drained and decommissioned, the steps that went
// wrong, and whether the whole sequence ran. Safe for concurrent use.
type Churn struct {
	mu             sync.Mutex
	drained        string // the drained node: a member holding nothing
	decommissioned string // the decommissioned node: out of the ring, stopped
	done           bool   // the whole sequence ran
	failures       []string
	moves, kills   int
}

// Fail records a step that went wrong (the placement verdict fails).
func (ch *Churn) Fail(format string, args ...any) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.failures = append(ch.failures, fmt.Sprintf(format, args...))
}

func (ch *Churn) update(f func(ch *Churn)) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	f(ch)
}

// churnExpect is a copy of what the checker needs.
type churnExpect struct {
	drained, decommissioned string
	done                    bool
	failures                []string
	moves, kills            int
}

func (ch *Churn) expect() churnExpect {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return churnExpect{ch.drained, ch.decommissioned, ch.done, slices.Clone(ch.failures), ch.moves, ch.kills}
}

// Time bounds of the churn nemesis.
const (
	churnMovesTimeout = 3 * time.Minute  // a plan's moves must all be done within this
	churnHealthy      = 60 * time.Second // a started or restarted node must be healthy within this
	churnAdminRetry   = 30 * time.Second // an admin call is retried (UNAVAILABLE, no meta leader) this long
	churnPoll         = 100 * time.Millisecond
)

// nemesisMembershipChurn grows the cluster from its initial nodes with the
// spares (start, join, rebalance), drains one initial node and
// decommissions another (then stops it for good), each while the workload
// runs, killing -9 a node that a move under way copies from or to (and
// maybe a second one later in the same phase). It returns when the
// sequence is done (the run's workload then ends), or at ctx's end.
func nemesisMembershipChurn(ctx context.Context, e *Env) {
	ch := e.Churn
	initial := e.C.Nodes[:e.C.Cfg.Initial]
	spares := e.C.Spares()
	if len(initial) < 3 || len(spares) == 0 {
		ch.Fail("membership-churn needs at least 3 initial nodes and a spare (have %d and %d)", len(initial), len(spares))
		return
	}

	// Which initial node is drained and which decommissioned: fixed by
	// the seed alone (e.Rng's draws depend on the moves' timing, and its
	// first draws hardly differ between neighbouring seeds).
	i, j := churnPicks(e.W.Seed, len(initial))
	drained, leaving := initial[i], initial[j]
	e.TL.Log("note", "churn-plan", fmt.Sprintf("grow with %s, drain %s, decommission %s", ids(spares), drained.ID, leaving.ID), nil)

	// a. Grow: start the spares, join them, rebalance.
	e.TL.Log("start", "grow", fmt.Sprintf("start %s, join, rebalance", ids(spares)), nil)
	for _, n := range spares {
		err := e.C.StartSpare(n, churnHealthy)
		e.TL.Log("note", "spare-started", n.ID+" (gossiping with the cluster, not a ring member)", err)
		if err != nil {
			ch.Fail("start spare %s: %v", n.ID, err)
			return
		}
	}
	for _, n := range spares {
		var resp *nornv1.JoinResponse
		err := e.adminRetry(ctx, "join "+n.ID, func(ctx context.Context, via *Node) error {
			r, err := via.Admin.Join(ctx, connect.NewRequest(&nornv1.JoinRequest{Node: n.ID}))
			if err == nil {
				resp = r.Msg
			}
			return err
		}, true)
		detail := n.ID
		if resp != nil {
			detail = fmt.Sprintf("%s: ring epoch %d, meta voter %v", n.ID, resp.RingEpoch, resp.MetaVoter)
		}
		e.TL.Log("note", "join", detail, err)
		if err != nil {
			ch.Fail("join %s: %v", n.ID, err)
			return
		}
	}
	done, ok := e.churnPhase(ctx, "grow", func(ctx context.Context, via *Node) (*nornv1.Plan, error) {
		r, err := via.Admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Apply: true}))
		if err != nil {
			return nil, err
		}
		return r.Msg.Plan, nil
	})
	e.TL.Log("end", "grow", fmt.Sprintf("%s members; %s", ids(spares), done), nil)
	if !ok {
		return
	}

	// b. Drain one initial node, c. decommission another.
	e.TL.Log("start", "drain", drained.ID+" (its replicas move off; it stays a member and coordinates requests)", nil)
	done, ok = e.churnPhase(ctx, "drain", func(ctx context.Context, via *Node) (*nornv1.Plan, error) {
		r, err := via.Admin.Drain(ctx, connect.NewRequest(&nornv1.DrainRequest{Node: drained.ID, Apply: true}))
		if err != nil {
			return nil, err
		}
		return r.Msg.Plan, nil
	})
	ch.update(func(ch *Churn) { ch.drained = drained.ID })
	e.TL.Log("end", "drain", fmt.Sprintf("%s drained; %s", drained.ID, done), nil)
	if !ok {
		return
	}

	e.TL.Log("start", "decommission", leaving.ID+" (its replicas move off, then it leaves the ring and the meta group)", nil)
	done, ok = e.churnPhase(ctx, "decommission", func(ctx context.Context, via *Node) (*nornv1.Plan, error) {
		r, err := via.Admin.Decommission(ctx, connect.NewRequest(&nornv1.DecommissionRequest{Node: leaving.ID, Apply: true}))
		if err != nil {
			return nil, err
		}
		return r.Msg.Plan, nil
	})
	ch.update(func(ch *Churn) { ch.decommissioned = leaving.ID })
	if !ok {
		e.TL.Log("end", "decommission", done, nil)
		return
	}
	// Once out of the ring (as the other nodes see it), it is stopped for
	// good: retired first, so that nothing picks it any more.
	start := time.Now()
	err := e.waitStatus(ctx, time.Now().Add(churnMovesTimeout), leaving, func(st *nornv1.StatusResponse) bool {
		for _, nd := range st.Nodes {
			if nd.Id == leaving.ID {
				return !inRing(nd.Role) && nd.Replicas == 0
			}
		}
		return true
	})
	e.TL.Log("note", "left-ring", fmt.Sprintf("%s is out of the ring (%s after its moves)", leaving.ID, time.Since(start).Round(time.Millisecond)), err)
	if err != nil {
		e.TL.Log("end", "decommission", done, nil)
		ch.Fail("decommission: %s did not leave the ring: %v", leaving.ID, err)
		return
	}
	e.C.Retire(leaving)
	leaving.Kill()
	e.TL.Log("end", "decommission", fmt.Sprintf("%s; %s out of the ring, stopped for good and retired", done, leaving.ID), nil)

	// A little load on the final placement before the run ends.
	if sleep(ctx, 5*time.Second) {
		ch.update(func(ch *Churn) { ch.done = true })
		e.TL.Log("note", "churn-done", "", nil)
	}
}

// churnPhase applies one placement change through apply (retried while
// the meta group has no reachable leader), then, while its moves run,
// kills -9 the source or the target of a move under way and restarts it
// 2-5 s later (a second kill later in the phase half the time), and waits
// until every move of the plan is done. It returns what happened, for
// the phase's end in the timeline, and false when the sequence cannot go
// on (recorded in Churn).
func (e *Env) churnPhase(ctx context.Context, phase string, apply func(ctx context.Context, via *Node) (*nornv1.Plan, error)) (string, bool) {
	ch := e.Churn
	started := time.Now()
	before, err := e.freshestStatus(ctx, nil)
	if err != nil {
		ch.Fail("%s: %v", phase, err)
		return "no status: " + err.Error(), false
	}
	var plan *nornv1.Plan
	err = e.adminRetry(ctx, phase+" apply", func(ctx context.Context, via *Node) error {
		p, err := apply(ctx, via)
		if err == nil {
			plan = p
		}
		return err
	}, false)
	// An apply that timed out may have been applied: the retry is then
	// refused while its moves are under way.
	minEpoch := before.RingEpoch + 1
	switch {
	case err == nil:
		minEpoch = plan.RingEpoch
		ch.update(func(ch *Churn) { ch.moves += len(plan.Moves) })
		e.TL.Log("note", "plan", fmt.Sprintf("%s: %d moves at ring epoch %d: %s; loads %s", phase, len(plan.Moves), plan.RingEpoch, moveList(plan.Moves), loads(plan.Loads)), nil)
	case connect.CodeOf(err) == connect.CodeFailedPrecondition && strings.Contains(err.Error(), "under way"):
		e.TL.Log("note", "plan", phase+": an earlier ambiguous apply took effect (moves under way)", err)
	default:
		ch.Fail("%s: apply: %v", phase, err)
		return "apply failed: " + err.Error(), false
	}
	deadline := started.Add(churnMovesTimeout)
	kills := 1 + e.Rng.IntN(2)
	for k := range kills {
		// The first kill within a second of the plan, a second one 1-3 s
		// after the first node is back.
		delay := e.between(0, time.Second)
		if k > 0 {
			delay = e.between(time.Second, 3*time.Second)
		}
		if !sleep(ctx, delay) {
			break
		}
		victim, why := e.moveVictim(ctx, minEpoch, deadline)
		if victim == nil {
			e.TL.Log("note", "kill-skipped", fmt.Sprintf("%s: no move filling or catching up left for kill %d of %d", phase, k+1, kills), nil)
			break
		}
		e.killFor(ctx, victim, e.between(2*time.Second, 5*time.Second), "kill", victim.ID+" ("+why+")")
		ch.update(func(ch *Churn) { ch.kills++ })
		err := e.waitHealthy(ctx, victim, churnHealthy)
		e.TL.Log("note", "healthy", victim.ID+" after its restart", err)
	}
	moves, err := e.waitMovesDone(ctx, phase, minEpoch, deadline)
	if err != nil {
		ch.Fail("%s: %v", phase, err)
		return err.Error(), false
	}
	return fmt.Sprintf("%d moves done in %s", moves, time.Since(started).Round(time.Millisecond)), true
}

// adminRetry calls f through the active running nodes, from a random one
// in turn, until it succeeds or churnAdminRetry passes: an error other
// than UNAVAILABLE, a deadline or a transport error ends it at once,
// unless retryAll (Join: gossip may not have shown the node to the meta
// leader yet).
func (e *Env) adminRetry(ctx context.Context, what string, f func(ctx context.Context, via *Node) error, retryAll bool) error {
	deadline := time.Now().Add(churnAdminRetry)
	for i := 0; ; i++ {
		ns := e.runningActive()
		if len(ns) == 0 {
			return errors.New("no active node is running")
		}
		via := ns[e.Rng.IntN(len(ns))]
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(cctx, via)
		cancel()
		if err == nil {
			return nil
		}
		switch connect.CodeOf(err) {
		case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeUnknown, connect.CodeCanceled:
		default:
			if !retryAll {
				return err
			}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("%s via %s (attempt %d): %w", what, via.ID, i+1, err)
		}
		if i == 0 || i%10 == 0 {
			e.TL.Log("note", "admin-retry", fmt.Sprintf("%s via %s", what, via.ID), err)
		}
		sleep(ctx, 500*time.Millisecond)
	}
}

func (e *Env) runningActive() []*Node {
	var out []*Node
	for _, n := range e.C.Active() {
		if n.Running() && !n.Paused() {
			out = append(out, n)
		}
	}
	return out
}

// freshestStatus asks every active running node but skip for its Status
// and returns the answer with the highest ring epoch.
func (e *Env) freshestStatus(ctx context.Context, skip *Node) (*nornv1.StatusResponse, error) {
	var best *nornv1.StatusResponse
	var errs []error
	for _, n := range e.runningActive() {
		if n == skip {
			continue
		}
		st, err := n.Status(ctx, false)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.ID, err))
			continue
		}
		if best == nil || st.RingEpoch > best.RingEpoch {
			best = st
		}
	}
	if best == nil {
		return nil, fmt.Errorf("no node answered Status: %w", errors.Join(errs...))
	}
	return best, nil
}

// waitStatus polls the freshest Status (of the nodes but skip) until cond
// holds, deadline passes or ctx ends.
func (e *Env) waitStatus(ctx context.Context, deadline time.Time, skip *Node, cond func(*nornv1.StatusResponse) bool) error {
	var last error
	for {
		st, err := e.freshestStatus(ctx, skip)
		if err == nil && cond(st) {
			return nil
		}
		if err != nil {
			last = err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			if last == nil {
				last = errors.New("condition not met")
			}
			return fmt.Errorf("timed out: %w", last)
		}
		sleep(ctx, churnPoll)
	}
}

// moveVictim waits for a move of the plan (ring epoch >= minEpoch) that
// is filling or catching up, and picks (seeded) its source or its target;
// nil when every move has ended, or at the deadline.
func (e *Env) moveVictim(ctx context.Context, minEpoch uint64, deadline time.Time) (*Node, string) {
	for ctx.Err() == nil && time.Now().Before(deadline) {
		st, err := e.freshestStatus(ctx, nil)
		if err != nil || st.RingEpoch < minEpoch {
			sleep(ctx, churnPoll)
			continue
		}
		var running []*nornv1.MoveStatus
		ended := true
		for _, m := range st.Moves {
			if m.State != "done" && m.State != "failed" {
				ended = false
			}
			if m.State == "filling" || m.State == "catching-up" {
				running = append(running, m)
			}
		}
		if ended {
			return nil, ""
		}
		if len(running) > 0 {
			m := running[e.Rng.IntN(len(running))]
			side, id := "source", m.FromNode
			if e.Rng.IntN(2) == 0 {
				side, id = "target", m.ToNode
			}
			if n := e.C.Node(id); n != nil && e.C.IsActive(n) && n.Running() {
				return n, fmt.Sprintf("%s of the move of partition %d %s -> %s, %s", side, m.Partition, m.FromNode, m.ToNode, m.State)
			}
		}
		sleep(ctx, churnPoll)
	}
	return nil, ""
}

// waitHealthy waits until n answers /healthz.
func (e *Env) waitHealthy(ctx context.Context, n *Node, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !n.Healthy() {
		if !n.Running() {
			return fmt.Errorf("%s is not running", n.ID)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not healthy after %s", n.ID, timeout)
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// waitMovesDone waits until the ring (epoch >= minEpoch) shows every move
// of the plan done, logging the progress; a failed move or the deadline
// is an error. It returns how many moves the plan has.
func (e *Env) waitMovesDone(ctx context.Context, phase string, minEpoch uint64, deadline time.Time) (int, error) {
	lastDone := -1
	var last *nornv1.StatusResponse
	for {
		st, err := e.freshestStatus(ctx, nil)
		if err == nil && st.RingEpoch >= minEpoch {
			last = st
			done, open := 0, 0
			var failed []string
			for _, m := range st.Moves {
				switch m.State {
				case "done":
					done++
				case "failed":
					failed = append(failed, fmt.Sprintf("partition %d %s -> %s: %s", m.Partition, m.FromNode, m.ToNode, m.Error))
				default:
					open++
				}
			}
			if done != lastDone {
				e.TL.Log("note", "moves", fmt.Sprintf("%s: %d of %d moves done (ring epoch %d)", phase, done, len(st.Moves), st.RingEpoch), nil)
				lastDone = done
			}
			if len(failed) > 0 {
				return len(st.Moves), fmt.Errorf("moves failed: %s", strings.Join(failed, "; "))
			}
			if open == 0 {
				return len(st.Moves), nil
			}
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("cut short: %w", ctx.Err())
		}
		if time.Now().After(deadline) {
			desc := "no status"
			if last != nil {
				desc = moveList(last.Moves)
			}
			return 0, fmt.Errorf("moves not done within %s: %s", churnMovesTimeout, desc)
		}
		sleep(ctx, churnPoll)
	}
}

// churnPicks returns, for seed, the indexes of two different nodes of k:
// the one to drain and the one to decommission.
func churnPicks(seed uint64, k int) (drain, decommission int) {
	h := splitmix64(seed)
	drain = int(h % uint64(k))
	return drain, (drain + 1 + int(h/uint64(k)%uint64(k-1))) % k
}

// splitmix64 is SplitMix64's output function: a well-mixed hash of x.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func moveList(ms []*nornv1.MoveStatus) string {
	var s []string
	for _, m := range ms {
		x := fmt.Sprintf("p%d %s->%s", m.Partition, m.FromNode, m.ToNode)
		if m.State != "queued" {
			x += " " + m.State
		}
		if m.Error != "" {
			x += " (" + m.Error + ")"
		}
		s = append(s, x)
	}
	return strings.Join(s, ", ")
}

func loads(ls []*nornv1.NodeLoad) string {
	var s []string
	for _, l := range ls {
		s = append(s, fmt.Sprintf("%s %d->%d", l.NodeId, l.Before, l.After))
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
func CheckPlacement(ctx context.Context, c *Cluster, ch *Churn, within time.Duration) Verdict {
	v := Verdict{Checker: "placement", Counts: map[string]int{}}
	exp := ch.expect()
	v.Counts["moves"], v.Counts["kills"] = exp.moves, exp.kills
	start := time.Now()
	var problems []string
	var epoch uint64
	for {
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
		problems = placementProblems(active, sts, errs, exp, c.Cfg.Partitions, Replication)
		if len(problems) == 0 || time.Since(start) > within || ctx.Err() != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	v.Counts["ring-epoch"] = int(epoch)
	for _, f := range exp.failures {
		v.add("churn: %s", f)
	}
	if !exp.done {
		v.add("churn: the sequence did not complete")
	}
	v.Counts["problems"] = len(problems)
	for _, p := range problems {
		v.add("%s", p)
	}
	if len(problems) > 0 {
		v.add("placement not as expected %s after the convergence check", within)
	} else {
		v.Counts["ms-to-settle"] = int(time.Since(start).Milliseconds())
	}
	v.Valid = len(problems) == 0 && len(exp.failures) == 0 && exp.done
	return v
}

// placementProblems judges the active nodes' Status answers (sts; errs for
// those that did not answer) against what the churn did (exp), for
// partitions partitions of replication replicas each.
func placementProblems(active []string, sts map[string]*nornv1.StatusResponse, errs map[string]error, exp churnExpect, partitions int, replication int) []string {
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
			if nd.Id == exp.decommissioned && inRing(nd.Role) {
				out = append(out, fmt.Sprintf("%s sees decommissioned %s as %s", id, nd.Id, nd.Role))
			}
		}
	}
	if exp.decommissioned != "" && isActive[exp.decommissioned] {
		out = append(out, fmt.Sprintf("decommissioned %s is still active", exp.decommissioned))
	}
	if d := exp.drained; d != "" {
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
