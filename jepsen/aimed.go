package jepsen

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/norn-dev/norn/jepsen/check"
)

// Aimed nemeses strike right after a particular operation (they watch the
// history as it is recorded), at the moment a class of bug can show:
// random faults hit those windows too rarely for a 60 s run.

// freshOp bounds how long ago an op an aimed nemesis strikes after may
// have returned: the windows it aims at last milliseconds.
const freshOp = 5 * time.Millisecond

// nextOp waits for the next op that match accepts and that returned at
// most freshOp ago (ops recorded while the nemesis slept are stale), or
// for ctx's end.
func (e *Env) nextOp(ctx context.Context, ops <-chan *check.Op, match func(*check.Op) bool) (*check.Op, bool) {
	for {
		select {
		case <-ctx.Done():
			return nil, false
		case o := <-ops:
			if e.W.H.Now()-o.Return <= int64(freshOp) && match(o) {
				return o, true
			}
		}
	}
}

// nemesisKillClaimLeader kills -9 the partition leader that has just
// granted a long-lease claim, and restarts it 2-3 s later. The claim's Raft
// entry is committed, but the followers learn that only from the leader's
// next append (up to a commit timeout later), so the new leader wins its
// election with the claim unapplied: its local view shows the task ready,
// and only the claim FSM's own check, applied in log order, stands between
// the waiting claims it serves at once and a second grant.
func nemesisKillClaimLeader(ctx context.Context, e *Env) {
	ops := e.W.H.Subscribe()
	for sleep(ctx, e.between(time.Second, 2*time.Second)) {
		o, ok := e.nextOp(ctx, ops, func(o *check.Op) bool {
			return o.F == "claim" && o.Type == "ok" && o.Long && !o.Drain && o.Leader != ""
		})
		if !ok {
			return
		}
		n := e.C.Node(o.Leader)
		if n == nil || !n.Running() {
			continue
		}
		detail := fmt.Sprintf("%s (it granted claim %d of task %d %.0f ms ago)", n.ID, o.Claim, o.Task, float64(e.W.H.Now()-o.Return)/1e6)
		e.killFor(ctx, n, e.between(2*time.Second, 3*time.Second), "kill-leader", detail)
	}
}

// nemesisCrashAfterEnqueue cuts the power of every node at once right
// after an enqueue is acknowledged, before the nodes' next WAL sync (any
// Raft append syncs the shared WAL, so the window is milliseconds), and
// restarts them 1 s later. A node that acknowledges before syncing loses
// the task on every replica.
func nemesisCrashAfterEnqueue(ctx context.Context, e *Env) {
	ops := e.W.H.Subscribe()
	for sleep(ctx, e.between(2*time.Second, 3*time.Second)) {
		o, ok := e.nextOp(ctx, ops, func(o *check.Op) bool { return o.F == "enqueue" && o.Type == "ok" && o.Client >= 0 })
		if !ok {
			return
		}
		e.crashFor(ctx, e.C.Active(), time.Second, fmt.Sprintf("right after the enqueue of task %d was acked", o.Task))
	}
}

// nemesisStallLeaderClockAhead makes a client hold its next short-lease
// claim past the lease without renewing (as worker-pause), and as soon as
// it starts holding, moves the clock of the leader that granted the claim
// ahead, just inside the max clock offset (justInBound: so that the
// clock guard lets it go on leading), until the hold ends: the lease then
// ends that much early in real time on the leader, and only the skew
// buffer keeps the task from being granted to another worker while the
// first may still rightly believe it holds it. The offset stays below
// the buffer.
func nemesisStallLeaderClockAhead(ctx context.Context, e *Env) {
	off := e.justInBound()
	var mu sync.Mutex
	bumped := map[*Node]int{} // holds in progress per node
	e.W.SetOnHold(func(client int, o *check.Op, hold time.Duration) {
		n := e.C.Node(o.Leader)
		if n == nil {
			return
		}
		mu.Lock()
		bumped[n]++
		if bumped[n] == 1 {
			e.TL.Log("start", "clock-bump", fmt.Sprintf("%s offset +%s (in bound, below the %s buffer): it granted claim %d of task %d that client %d now holds %s",
				n.ID, off, e.C.Cfg.SkewBuffer, o.Claim, o.Task, client, hold), n.SetClock(off, 1))
		}
		mu.Unlock()
		time.AfterFunc(hold, func() {
			mu.Lock()
			defer mu.Unlock()
			if bumped[n]--; bumped[n] == 0 {
				e.TL.Log("end", "clock-bump", n.ID, n.SetClock(0, 1))
			}
		})
	})
	nemesisWorkerPause(ctx, e)
}
