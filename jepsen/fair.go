package jepsen

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/jepsen/check"
)

// The fairness clients (issue 44): beside the workload, on a queue of
// their own, a heavy tenant keeps a backlog of ready tasks (batches
// topped up as claims take them), a light one enqueues a task every
// fairLightEvery (W=3: claimable wherever its leader is when acked), and
// fairClaimers claim one task at a time, all through n1 (one node serves
// every claim: the promise is per node), completing each at once. The
// nemesis kills the other nodes (nemesisKillOthers). check.Fairness
// counts the heavy claims each light task waited, outside the fault
// windows.

// fairQueue is the queue the clients use.
const fairQueue = "jepsen-fair"

const (
	fairClaimers   = 2
	fairLightEvery = 400 * time.Millisecond
	// fairBacklog is the heavy tenant's ready tasks the producer keeps
	// (at least), in batches of fairBatch.
	fairBacklog = 300
	fairBatch   = 100
	// fairVisible: a light task is claimable at n1 this long after its
	// ack (n1's cache of the other leaders' heads is at most HeadsTTL
	// old; the rest covers a claim's round trips).
	fairVisible = 300 * time.Millisecond
	// fairBound is the most heavy claims a light task may wait once
	// visible: 1 (two keys of weight 1), plus 1 for the other claimer's
	// claim under way, plus 4 for picks made before the task was seen and
	// heads skipped (claimed meanwhile).
	fairBound = 6
	// fairSettle: fault windows run to a fault's end plus this (a
	// restarted node's leaderships come back, its heads with them).
	fairSettle = 3 * time.Second
)

// fairRun is the fairness clients' history.
type fairRun struct {
	sideRun
	pending atomic.Int64 // heavy tasks enqueued and not yet claimed
}

func newFairRun(w *Workload) *fairRun { return &fairRun{sideRun: sideRun{w: w, client: -4}} }

// claimNode is the node every claim goes through.
func (r *fairRun) claimNode() *Node { return r.w.C.Nodes[0] }

// heavy keeps the heavy backlog at fairBacklog or more until ctx ends.
func (r *fairRun) heavy(ctx context.Context) {
	specs := make([]*nornv1.TaskSpec, fairBatch)
	for i := range specs {
		specs[i] = &nornv1.TaskSpec{Queue: fairQueue, FairnessKey: "heavy", Payload: []byte("h")}
	}
	for i := 0; ctx.Err() == nil; i++ {
		if r.pending.Load() >= fairBacklog {
			sleep(ctx, 20*time.Millisecond)
			continue
		}
		a := r.w.C.Active()
		n := a[i%len(a)]
		cctx, cancel := r.w.opCtx(ctx)
		_, err := n.Tasks.EnqueueBatch(cctx, connect.NewRequest(&nornv1.EnqueueBatchRequest{Tasks: specs, W: 2}))
		cancel()
		if err == nil {
			r.pending.Add(fairBatch)
		} else {
			sleep(ctx, 100*time.Millisecond)
		}
	}
}

// light enqueues a light task every fairLightEvery until ctx ends.
func (r *fairRun) light(ctx context.Context) {
	proc := r.w.H.NewProcess()
	for i := 0; sleep(ctx, fairLightEvery); i++ {
		a := r.w.C.Active()
		n := a[i%len(a)]
		o := r.op(ctx, n, proc, "enqueue", 0, func(ctx context.Context, o *check.Op) error {
			o.Key, o.Payload, o.W = check.FairLight, fmt.Sprintf("l-%d", i), 3
			resp, err := n.Tasks.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{W: 3,
				Task: &nornv1.TaskSpec{Queue: fairQueue, FairnessKey: check.FairLight, Payload: []byte(o.Payload)}}))
			if err == nil {
				o.Task = resp.Msg.Id
			}
			return err
		})
		if o.Type == "info" {
			proc = r.w.H.NewProcess()
		}
	}
}

// claimer claims one task at a time through claimNode and completes it,
// until ctx ends.
func (r *fairRun) claimer(ctx context.Context, i int) {
	proc := r.w.H.NewProcess()
	n := r.claimNode()
	for ctx.Err() == nil {
		var claim uint64
		o := r.op(ctx, n, proc, "claim", 0, func(ctx context.Context, o *check.Op) error {
			resp, err := n.Tasks.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: fairQueue, Worker: fmt.Sprintf("f%d", i),
				Lease: durationpb.New(time.Minute), Max: 1, Wait: durationpb.New(time.Second)}))
			if err != nil || len(resp.Msg.Tasks) == 0 {
				return err
			}
			ct := resp.Msg.Tasks[0]
			claim, o.Task, o.Key = ct.ClaimId, ct.Task.Id, ct.Task.GetSpec().GetFairnessKey()
			return nil
		})
		switch {
		case o.Type == "info":
			proc = r.w.H.NewProcess()
			sleep(ctx, 50*time.Millisecond)
			continue
		case claim == 0:
			sleep(ctx, 20*time.Millisecond)
			continue
		}
		if o.Key != check.FairLight {
			r.pending.Add(-1)
		}
		cctx, cancel := r.w.opCtx(ctx)
		n.Tasks.Complete(cctx, connect.NewRequest(&nornv1.CompleteRequest{Id: o.Task, ClaimId: claim, W: 2})) //nolint:errcheck // only claims are judged
		cancel()
	}
}

// start runs the clients until ctx ends; wait waits for them.
func (r *fairRun) start(ctx context.Context) (wait func()) {
	var wg sync.WaitGroup
	wg.Go(func() { r.heavy(ctx) })
	wg.Go(func() { r.light(ctx) })
	for i := range fairClaimers {
		wg.Go(func() { r.claimer(ctx, i) })
	}
	return wg.Wait
}

// final judges the history (check.Fairness) and writes it to dir.
func (r *fairRun) final(events []Event, dir string) check.Verdict {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.save(dir, "fair-history.jsonl")
	return check.Fairness(r.ops, faultWindows(events, fairSettle), fairVisible, fairBound, 2*time.Second)
}

// nemesisKillOthers kills a random node other than n1 (the fairness
// clients' claim node) for 2 s, every 5 to 7 s.
func nemesisKillOthers(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(5*time.Second, 7*time.Second)) {
		others := e.others(e.C.Nodes[0])
		n := others[e.Rng.IntN(len(others))]
		e.killFor(ctx, n, 2*time.Second, "kill", n.ID)
	}
}
