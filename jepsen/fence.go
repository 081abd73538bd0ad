package jepsen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/norn-dev/norn/jepsen/check"
)

// The fence (DESIGN sections 4 and 7, promise 3a): what a worker does
// under a claim takes effect only if the claim is live when the
// partition's Raft group decides, whichever node the worker reaches.

// nemesisStaleWorker makes a client hold its next short claim past its
// lease without renewing (as worker-pause), and as it starts holding,
// cuts a node other than the claim's leader off from the others (1.5 s
// later, once it has applied the claim): that
// node's copy of the claim state stays with the claim live while the
// leader expires it (after the lease and the skew buffer) and grants the
// task to another client. At the end of the hold the stalled client
// completes through the cut-off node, forcing it to answer itself
// (Norn-Hops at the limit, w=1), then heals the cut and completes again
// through any node. Neither may take effect once the claim was
// superseded: the cut-off node cannot reach the leader and must refuse;
// the leader refuses a claim that is not live. The linearizability
// checker fails a complete acked under a superseded claim, and
// terminal-stable a claim granted after an acked complete. One cut at a
// time; a stall that starts while one is under way is a plain
// worker-pause. The scenarios enqueue little (claims outrun enqueues), so
// that an expired claim's task goes to the next waiting claim.
func nemesisStaleWorker(ctx context.Context, e *Env) {
	const cutAfter = 1500 * time.Millisecond
	stall := e.W.ShortLease + e.C.Cfg.SkewBuffer + 2500*time.Millisecond
	var mu sync.Mutex
	cut := map[int]*Node{}       // the stalled client -> the node cut off for it
	holds := map[int]*check.Op{} // the stalled client -> the claim it holds
	busy := false
	stopped := false // the nemesis returned: no cut from now on
	e.W.SetOnHold(func(client int, o *check.Op, hold time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if busy {
			return
		}
		var pick *Node
		for _, n := range e.shuffled() {
			if n.ID != o.Leader && n.Running() {
				pick = n
				break
			}
		}
		if pick == nil {
			return
		}
		busy = true
		cut[client], holds[client] = pick, o
		// Cut it once it has applied the claim: a follower learns of a
		// commit with the leader's next append (the commit timeout, 0.5-1
		// s when idle), and a replica that never saw the claim refuses the
		// stale complete even without the fence.
		time.AfterFunc(cutAfter, func() {
			mu.Lock()
			defer mu.Unlock()
			if stopped {
				return // the run's heal came first: no cut after it
			}
			err := e.Net.Partition([]*Node{pick}, e.others(pick))
			e.TL.Log("start", "stale-worker", fmt.Sprintf("%s | %s while client %d holds claim %d of task %d (granted by %s) %s without renewing",
				pick.ID, ids(e.others(pick)), client, o.Claim, o.Task, o.Leader, hold), err)
		})
	})
	e.W.SetStaleVia(func(client int) (*Node, func()) {
		mu.Lock()
		n, o := cut[client], holds[client]
		delete(cut, client)
		delete(holds, client)
		mu.Unlock()
		if n == nil {
			return nil, nil
		}
		// The checkers see the claim superseded only by another claim of
		// the task: hold on (the cut with it) until the leader has granted
		// the task again, so that the stale complete meets a regranted
		// task (a run whose expired tasks sat unclaimed through the hold
		// missed the seeded bug, seed 40511). Long enough for a claim
		// whose partition changed leaders during the hold: the new leader
		// extends it by the lease grace (10 s) before it expires it (CI
		// dry run, seed 55421: a regrant 10 s after the hold's end was
		// not yet due).
		e.TL.Log("note", "stale-worker", e.waitRegrant(o, regrantWait), nil)
		return n, func() {
			e.TL.Log("end", "stale-worker", n.ID+" (after the stale complete through it)", e.Net.Heal())
			mu.Lock()
			busy = false
			mu.Unlock()
		}
	})
	for sleep(ctx, e.between(1*time.Second, 2*time.Second)) {
		i := e.Rng.IntN(e.W.Clients)
		e.W.Stall(i, stall)
		e.TL.Log("note", "stale-worker", fmt.Sprintf("client %d is to hold its next short claim %s without renewing", i, stall), nil)
	}
	mu.Lock()
	stopped = true
	mu.Unlock()
}

// completeHandoverArgs are the complete-handover scenarios' nornd flags:
// a short lease grace, so that a new leader expires a claim it inherits
// soon after the lease ends (with the default 10 s it would extend it past
// the fault); no leader balancing, which would hand a moved leadership
// back within a second or two.
var completeHandoverArgs = []string{"-lease-grace", "500ms", "-leader-balance=false"}

// nemesisCompleteHandover makes a replica miss a completion and then lead
// its partition (DESIGN section 7, promise 3b: a task completed with an
// acknowledgement is never handed out again, whatever the W). A node X
// stops exchanging task states with its peers (test hooks: it refuses
// their replicated writes, serves no replica reads, does no
// anti-entropy) while its Raft groups go on; the next complete of a short
// claim acked at w=2 has skipped X; within milliseconds of the ack the
// partition's leader hands its leadership to X. X keeps refusing task
// states until the claim's lease, the new leader's grace and the skew
// buffer have passed. With the fence the completion is an entry of the
// group, which X applied before it could lead: it neither expires the
// claim nor grants the task again. With the seeded bug end-after-write
// (the claim's end proposed a second after the write, and dropped by a
// node that no longer leads) X sees the claim live and the task not
// terminal: it expires the claim and grants the task to a waiting
// client, which terminal-stable and the linearizability checker fail.
// The scenarios enqueue little, so that claims wait for tasks.
func nemesisCompleteHandover(ctx context.Context, e *Env) {
	ops := e.W.H.Subscribe()
	hold := e.W.ShortLease + e.C.Cfg.SkewBuffer + 2*time.Second
	for sleep(ctx, e.between(500*time.Millisecond, time.Second)) {
		x := e.randomNode()
		if !x.Running() {
			continue
		}
		e.TL.Log("start", "refuse-states", x.ID+" exchanges no task states with its peers (its Raft groups go on)", x.RefuseStates(true))
		o, ok := e.nextOp(ctx, ops, func(o *check.Op) bool {
			return o.F == "complete" && o.Type == "ok" && o.W == 2 && !o.Long && !o.Drain
		})
		if ok {
			e.handOver(o, x)
			sleep(ctx, hold)
		}
		e.TL.Log("end", "refuse-states", x.ID, x.RefuseStates(false))
	}
}

// handOver moves the leadership of complete o's partition to x: the node
// leading it (one of the others; when x leads it, it saw the write)
// transfers it.
func (e *Env) handOver(o *check.Op, x *Node) {
	ago := float64(e.W.H.Now()-o.Return) / 1e6
	var errs []error
	for _, n := range e.others(x) {
		err := n.TransferLeadership(o.Task, x.ID)
		if err == nil {
			e.TL.Log("note", "transfer", fmt.Sprintf("task %d's partition from %s to %s, %.0f ms after its complete (claim %d, w=2) was acked",
				o.Task, n.ID, x.ID, ago, o.Claim), nil)
			return
		}
		errs = append(errs, fmt.Errorf("%s: %w", n.ID, err))
	}
	e.TL.Log("note", "transfer", fmt.Sprintf("task %d's partition to %s: no other node handed it over (%s may lead it)", o.Task, x.ID, x.ID), errors.Join(errs...))
}

// regrantWait bounds the stale-worker nemesis's wait for a regrant after
// the hold: a new leader's lease grace (10 s) and a short lease and the
// skew buffer past it, and a margin.
const regrantWait = 20 * time.Second

// waitRegrant waits up to max for a claim of o's task after o's (the task
// granted again) in the history, and says what it saw.
func (e *Env) waitRegrant(o *check.Op, max time.Duration) string {
	deadline := time.Now().Add(max)
	for {
		for _, x := range e.W.H.Ops() {
			if x.F == "claim" && x.Type == "ok" && x.Task == o.Task && x.Claim > o.Claim {
				return fmt.Sprintf("task %d granted again as claim %d before the stale complete", o.Task, x.Claim)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("task %d not granted again within %s of the hold's end", o.Task, max)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
