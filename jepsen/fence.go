package jepsen

import (
	"context"
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
	cut := map[int]*Node{} // the stalled client -> the node cut off for it
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
		cut[client] = pick
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
		n := cut[client]
		delete(cut, client)
		mu.Unlock()
		if n == nil {
			return nil, nil
		}
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
