package jepsen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
	"github.com/norn-dev/norn/jepsen/check"
)

// The unique-keys clients (issue 44, session 29): beside the workload, a
// few clients enqueue tasks with unique keys from a small set into a
// queue of their own, each through a random node, and claim and complete
// or cancel them (and Retry half the cancelled ones, which takes the key
// back or is refused), so that keys are held, freed and taken again while
// the nemesis cuts and kills nodes. After the heal every task of the queue is
// listed (from every node) and read with R=3. check.Unique judges the
// history: no task created behind a duplicate answer, never two live
// tasks with one key, every answer naming a task with its key.

// uniqueQueue is the queue the clients use.
const uniqueQueue = "jepsen-unique"

const (
	// uniqueClients enqueue, claim, complete and cancel.
	uniqueClients = 4
	// uniqueKeyCount is how many keys they share: few, so that enqueues
	// of one key from several clients meet.
	uniqueKeyCount = 4
	// uniquePause is each client's pause between rounds.
	uniquePause = 50 * time.Millisecond
	// uniqueHold is how long a client holds a claimed task before it
	// completes it.
	uniqueHold = 200 * time.Millisecond
)

// uniqueRun is the unique-keys clients' history.
type uniqueRun struct{ sideRun }

func newUniqueRun(w *Workload) *uniqueRun { return &uniqueRun{sideRun{w: w, client: -3}} }

// client runs rounds until ctx ends: enqueue a task with a random key;
// then, half the time, claim one and complete it after uniqueHold; a
// tenth of the time, cancel the task the enqueue named.
func (r *uniqueRun) client(ctx context.Context, i int) {
	rng := rand.New(rand.NewPCG(r.w.Seed, 0x756e6900+uint64(i)))
	proc := r.w.H.NewProcess()
	pick := func() *Node { a := r.w.C.Active(); return a[rng.IntN(len(a))] }
	for seq := 0; sleep(ctx, uniquePause); seq++ {
		n := pick()
		key := fmt.Sprintf("key-%d", rng.IntN(uniqueKeyCount))
		e := r.op(ctx, n, proc, "enqueue", 0, func(ctx context.Context, o *check.Op) error {
			o.Key, o.Payload = key, fmt.Sprintf("u-%d-%d", i, seq)
			resp, err := n.Tasks.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{W: 2,
				Task: &nornv1.TaskSpec{Queue: uniqueQueue, UniqueKey: key, Payload: []byte(o.Payload)}}))
			if err != nil {
				if wf, ok := client.WriteFailureOf(err); ok && len(wf.Ids) == 1 {
					o.Task = wf.Ids[0] // may have been created
				}
				return err
			}
			o.Task, o.Duplicate = resp.Msg.Id, resp.Msg.Duplicate
			return nil
		})
		if e.Type == "info" {
			proc = r.w.H.NewProcess()
		}
		switch x := rng.Float64(); {
		case x < 0.5:
			r.claimAndComplete(ctx, pick, &proc, i)
		case x < 0.6 && e.Task != 0:
			n := pick()
			o := r.op(ctx, n, proc, "cancel", e.Task, func(ctx context.Context, _ *check.Op) error {
				_, err := n.Tasks.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: e.Task, W: 2}))
				return err
			})
			if o.Type == "info" {
				proc = r.w.H.NewProcess()
			}
			if o.Type == "ok" && rng.Float64() < 0.5 && sleep(ctx, 300*time.Millisecond) {
				// Bring it back, a moment later: its key must be taken
				// back first, and the Retry refused when another task took
				// it meanwhile.
				n := pick()
				o := r.op(ctx, n, proc, "retry", e.Task, func(ctx context.Context, o *check.Op) error {
					o.Key = key
					_, err := n.Tasks.Retry(ctx, connect.NewRequest(&nornv1.RetryRequest{Id: e.Task, W: 2}))
					return err
				})
				if o.Type == "info" {
					proc = r.w.H.NewProcess()
				}
			}
		}
	}
}

// claimAndComplete claims a task of the queue and completes it after
// uniqueHold.
func (r *uniqueRun) claimAndComplete(ctx context.Context, pick func() *Node, proc *int, i int) {
	n := pick()
	var claim uint64
	o := r.op(ctx, n, *proc, "claim", 0, func(ctx context.Context, o *check.Op) error {
		resp, err := n.Tasks.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: uniqueQueue, Worker: fmt.Sprintf("u%d", i),
			Lease: durationpb.New(time.Minute), Max: 1}))
		if err != nil || len(resp.Msg.Tasks) == 0 {
			return err
		}
		claim, o.Task = resp.Msg.Tasks[0].ClaimId, resp.Msg.Tasks[0].Task.Id
		o.Key = resp.Msg.Tasks[0].Task.GetSpec().GetUniqueKey()
		return nil
	})
	if o.Type == "info" {
		*proc = r.w.H.NewProcess()
	}
	if claim == 0 || !sleep(ctx, uniqueHold) {
		return
	}
	n = pick()
	task := o.Task
	c := r.op(ctx, n, *proc, "complete", task, func(ctx context.Context, _ *check.Op) error {
		_, err := n.Tasks.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: task, ClaimId: claim, W: 2}))
		return err
	})
	if c.Type == "info" {
		*proc = r.w.H.NewProcess()
	}
}

// start runs the clients until ctx ends; wait waits for them.
func (r *uniqueRun) start(ctx context.Context) (wait func()) {
	var wg sync.WaitGroup
	for i := range uniqueClients {
		wg.Go(func() { r.client(ctx, i) })
	}
	return wg.Wait
}

// final lists the queue on every node, reads each task listed or named
// by an enqueue with R=3 (op "final": Key its key, Payload its status;
// fail when no replica has it), judges the history and writes it to dir.
func (r *uniqueRun) final(ctx context.Context, dir string) check.Verdict {
	ids := map[uint64]bool{}
	var listErr []string
	for _, n := range r.w.C.Active() {
		for tok, pages := "", 0; pages < 10_000; pages++ {
			resp, err := n.Tasks.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{Queue: uniqueQueue, PageSize: 1000, PageToken: tok}))
			if err != nil {
				listErr = append(listErr, fmt.Sprintf("%s: %v", n.ID, err))
				break
			}
			for _, t := range resp.Msg.Tasks {
				ids[t.Id] = true
			}
			if tok = resp.Msg.NextPageToken; tok == "" {
				break
			}
		}
	}
	r.mu.Lock()
	for _, o := range r.ops {
		if o.F == "enqueue" && o.Task != 0 {
			ids[o.Task] = true
		}
	}
	r.mu.Unlock()
	proc := r.w.H.NewProcess()
	i := 0
	for id := range ids {
		a := r.w.C.Active()
		n := a[i%len(a)]
		i++
		r.op(ctx, n, proc, "final", id, func(ctx context.Context, o *check.Op) error {
			resp, err := n.Tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: Replication}))
			if err != nil {
				return err
			}
			o.Key = resp.Msg.Task.GetSpec().GetUniqueKey()
			o.Payload = strings.TrimPrefix(resp.Msg.Task.GetStatus().String(), "TASK_STATUS_")
			return nil
		})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.save(dir, "unique-history.jsonl")
	v := check.Unique(r.ops)
	if len(listErr) > 0 {
		v.Valid = false
		v.Details = append(v.Details, "listing the queue failed: "+strings.Join(listErr, "; "))
	}
	return v
}
