package jepsen

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/jepsen/check"
)

// The membership-churn scenario: placement changes through AdminService
// under the workload, with kill -9 of the nodes a move is running
// between, and a placement check at the end (CheckPlacement, observe.go;
// its judgement is check.PlacementProblems). The admin calls and Status
// polls the nemesis is made of are in admin.go.

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

// expect is a copy of what the placement checker needs.
func (ch *Churn) expect() check.PlacementExpect {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return check.PlacementExpect{Drained: ch.drained, Decommissioned: ch.decommissioned, Done: ch.done,
		Failures: slices.Clone(ch.failures), Moves: ch.moves, Kills: ch.kills}
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
				return !check.InRing(nd.Role) && nd.Replicas == 0
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
