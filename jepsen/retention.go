package jepsen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/jepsen/check"
)

// The retention scenario (issue 43, session 28): beside the workload, a
// few clients use a queue of their own with a short retention
// (Scenario.QueueRetention; the test hooks let a queue's retention go
// below the hour users get): each enqueues a task, claims it, holds it
// retentionHold and completes it; a reader reads every task of the queue
// (R=2) every retentionReadEvery through the run; once every completed
// task is past its retention, a final read (R=3) of each. check.Retention
// judges the history: no task gone before its retention from its end, none
// found again after it was gone, none kept past it.

// retentionQueue is the queue with the retention.
const retentionQueue = "jepsen-retained"

const (
	// retentionClients enqueue, hold and complete tasks of the queue.
	retentionClients = 3
	// retentionHold is how long a client holds a task before completing
	// it: retention counts from the end, so a task deleted counting from
	// its enqueue (the seeded bug retention-from-enqueue) goes this much
	// early.
	retentionHold = 4 * time.Second
	// retentionReadEvery is the reader's interval.
	retentionReadEvery = time.Second
	// retentionSlack is how early a deletion may look on the history's
	// clock (the task's end is after its complete's call).
	retentionSlack = time.Second
	// retentionSettle is how long after a read found a task gone another
	// may still find it (a replica whose pass, a monitor interval apart,
	// has not run), and how long after its retention a task may still be
	// read at the final read.
	retentionSettle = 3 * time.Second
)

// setQueueRetention gives retentionQueue its retention before the run,
// and waits until every node applies it.
func setQueueRetention(ctx context.Context, c *Cluster, r time.Duration) error {
	return setQueue(ctx, c, retentionQueue, &nornv1.QueueSettings{Retention: durationpb.New(r)})
}

// retentionRun is the retention clients' history.
type retentionRun struct {
	sideRun
	ids []uint64 // acknowledged enqueues, under mu
}

func newRetentionRun(w *Workload) *retentionRun {
	r := &retentionRun{sideRun: sideRun{w: w, client: -2}}
	r.onAdd = func(o *check.Op) {
		if o.F == "enqueue" && o.Type == "ok" {
			r.ids = append(r.ids, o.Task)
		}
	}
	return r
}

// op runs call on node n as one op of the history; the id call returns,
// when not 0, is the op's task.
func (r *retentionRun) op(ctx context.Context, n *Node, proc int, f string, task uint64, call func(context.Context) (uint64, error)) *check.Op {
	return r.sideRun.op(ctx, n, proc, f, task, func(ctx context.Context, o *check.Op) error {
		id, err := call(ctx)
		if id != 0 {
			o.Task = id
		}
		return err
	})
}

// client enqueues, claims, holds and completes tasks until ctx ends.
func (r *retentionRun) client(ctx context.Context, i int) {
	rng := rand.New(rand.NewPCG(r.w.Seed, 0x7265740000+uint64(i)))
	proc := r.w.H.NewProcess()
	pick := func() *Node { a := r.w.C.Active(); return a[rng.IntN(len(a))] }
	for ctx.Err() == nil {
		n := pick()
		r.op(ctx, n, proc, "enqueue", 0, func(ctx context.Context) (uint64, error) {
			resp, err := n.Tasks.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{W: 2,
				Task: &nornv1.TaskSpec{Queue: retentionQueue, Payload: fmt.Appendf(nil, "r-%d", i)}}))
			if err != nil {
				return 0, err
			}
			return resp.Msg.Id, nil
		})
		n = pick()
		var claim uint64
		o := r.op(ctx, n, proc, "claim", 0, func(ctx context.Context) (uint64, error) {
			resp, err := n.Tasks.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: retentionQueue, Worker: fmt.Sprintf("r%d", i),
				Lease: durationpb.New(time.Minute), Max: 1}))
			if err != nil || len(resp.Msg.Tasks) == 0 {
				return 0, err
			}
			claim = resp.Msg.Tasks[0].ClaimId
			return resp.Msg.Tasks[0].Task.Id, nil
		})
		if claim == 0 || !sleep(ctx, retentionHold) {
			if o.Type == "info" {
				proc = r.w.H.NewProcess()
			}
			continue
		}
		n = pick()
		task := o.Task
		r.op(ctx, n, proc, "complete", task, func(ctx context.Context) (uint64, error) {
			_, err := n.Tasks.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: task, ClaimId: claim, W: 2}))
			return 0, err
		})
	}
}

// read reads task id with r replicas as op f.
func (r *retentionRun) read(ctx context.Context, n *Node, proc int, f string, id uint64, replicas uint32) {
	r.op(ctx, n, proc, f, id, func(ctx context.Context) (uint64, error) {
		_, err := n.Tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: replicas}))
		return 0, err
	})
}

// reader reads every task of the queue every retentionReadEvery until
// ctx ends.
func (r *retentionRun) reader(ctx context.Context) {
	rng := rand.New(rand.NewPCG(r.w.Seed, 0x72656164))
	proc := r.w.H.NewProcess()
	for sleep(ctx, retentionReadEvery) {
		r.mu.Lock()
		ids := slices.Clone(r.ids)
		r.mu.Unlock()
		for _, id := range ids {
			a := r.w.C.Active()
			r.read(ctx, a[rng.IntN(len(a))], proc, "read", id, 2)
		}
	}
}

// start runs the clients and the reader until ctx ends; wait waits for
// them.
func (r *retentionRun) start(ctx context.Context) (wait func()) {
	var wg sync.WaitGroup
	for i := range retentionClients {
		wg.Go(func() { r.client(ctx, i) })
	}
	wg.Go(func() { r.reader(ctx) })
	return wg.Wait
}

// final waits until every completed task is past retention plus
// retentionSettle, reads every task with R=3, judges the history and
// writes it to dir.
func (r *retentionRun) final(ctx context.Context, retention time.Duration, dir string) check.Verdict {
	r.mu.Lock()
	last := int64(0)
	for _, o := range r.ops {
		if o.F == "complete" && o.Type == "ok" {
			last = max(last, o.Return)
		}
	}
	ids := slices.Clone(r.ids)
	r.mu.Unlock()
	sleep(ctx, time.Duration(last+int64(retention+retentionSettle)-r.w.H.Now())+500*time.Millisecond)
	proc := r.w.H.NewProcess()
	for i, id := range ids {
		a := r.w.C.Active()
		r.read(ctx, a[i%len(a)], proc, "final", id, Replication)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.save(dir, "retention-history.jsonl")
	return check.Retention(r.ops, retention, retentionSlack, retentionSettle)
}
