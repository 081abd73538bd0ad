package jepsen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/jepsen/check"
	"github.com/norn-dev/norn/transport"
)

// Queue is the queue the workload uses.
const Queue = "jepsen"

// Workload drives concurrent clients against the cluster, one operation
// at a time each, and records every operation in the history.
type Workload struct {
	C          *Cluster
	H          *check.History
	Clients    int
	Seed       uint64
	LongLease  time.Duration // longer than the run
	ShortLease time.Duration // 2-3 s
	OpTimeout  time.Duration
	// EnqueueShare is the share of enqueues among the ops of a client
	// holding no claim (default 0.45; claims take most of the rest). Below
	// about 0.3 claims outrun enqueues: the queue stays empty and most
	// claims wait for a task.
	EnqueueShare float64
	// Priorities, when set, gives each enqueued task a priority in
	// [0, Priorities) (the priority scenario); EnqueueW, when set, is the
	// enqueues' write quorum (default 2); ClaimVia, when set, is the node
	// every claim goes through while it is active (a worker pool behind
	// one address).
	Priorities int32
	EnqueueW   uint32
	ClaimVia   string
	// RetryShare is the share of enqueued tasks with a retry policy
	// (RetryAttempts attempts, a constant RetryBackoff, no jitter); a
	// client holding one of them fails its attempt (a retryable abort)
	// at FailShare of its ops on it.
	RetryShare    float64
	RetryAttempts uint32
	RetryBackoff  time.Duration
	FailShare     float64
	// ReviveShare is the share of a client's ops (holding no claim)
	// that Retry a task whose cancel (W=N) or complete it saw acked:
	// the cancelled ones come back to life, the completed ones must be
	// refused.
	ReviveShare float64
	// ShortOnly gives every claim the short lease (a capped queue).
	ShortOnly bool
	// DeadlineShare is the share of enqueued tasks with a deadline,
	// DeadlineMin to DeadlineMax after the enqueue's call.
	DeadlineShare            float64
	DeadlineMin, DeadlineMax time.Duration

	// stall, when set for a client, makes it hold its next short claim
	// without renewing for this long (the worker-pause nemesis).
	stall []atomic.Int64
	// TL, when set, records when a stalled client actually starts and
	// ends holding its claim.
	TL     *Timeline
	onHold atomic.Pointer[holdFunc] // see SetOnHold
	// staleVia, when set, is where a stalled client completes first at
	// the end of its hold (see SetStaleVia).
	staleVia atomic.Pointer[staleFunc]

	mu       sync.Mutex
	enqueued []uint64 // acked task ids (cancel targets)
	ended    []uint64 // tasks with an acked complete or cancel (W=N): Retry targets
	seq      atomic.Int64
}

type held struct {
	task, claim uint64
	long        bool
	op          *check.Op // the claim
	backoffMS   int64     // the task's retry backoff, 0 without a policy
}

func (w *Workload) init() {
	if w.OpTimeout == 0 {
		w.OpTimeout = 3 * time.Second
	}
	if w.EnqueueShare == 0 {
		w.EnqueueShare = 0.45
	}
	w.stall = make([]atomic.Int64, w.Clients)
}

type holdFunc func(client int, o *check.Op, hold time.Duration)

// SetOnHold makes f be called as a stalled client starts holding the claim
// that op o granted, for hold.
func (w *Workload) SetOnHold(f func(client int, o *check.Op, hold time.Duration)) {
	hf := holdFunc(f)
	w.onHold.Store(&hf)
}

type staleFunc func(client int) (via *Node, done func())

// SetStaleVia makes a stalled client, at the end of its hold, first
// complete through the node f returns (nil: none), forcing that node to
// answer itself (Norn-Hops at the limit: no forwarding) with w=1, then
// call done, then complete as usual through any node. Both completes are
// recorded.
func (w *Workload) SetStaleVia(f func(client int) (via *Node, done func())) {
	sf := staleFunc(f)
	w.staleVia.Store(&sf)
}

// Stall makes client i hold its next short claim for d without renewing.
func (w *Workload) Stall(i int, d time.Duration) { w.stall[i%w.Clients].Store(int64(d)) }

// Run runs the clients until ctx is done.
func (w *Workload) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for i := range w.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.client(ctx, i)
		}()
	}
	wg.Wait()
}

// classify turns a call's error into an op type: ok, fail (a definite
// refusal: the call did not take effect) or info (may have).
func classify(err error) (string, string) {
	if err == nil {
		return "ok", ""
	}
	switch connect.CodeOf(err) {
	case connect.CodeFailedPrecondition, connect.CodeNotFound, connect.CodeInvalidArgument, connect.CodeAlreadyExists:
		return "fail", err.Error()
	}
	return "info", err.Error()
}

func (w *Workload) client(ctx context.Context, i int) {
	rng := rand.New(rand.NewPCG(w.Seed, uint64(i)+1))
	proc := w.H.NewProcess()
	var h *held
	for ctx.Err() == nil {
		active := w.C.Active()
		n := active[rng.IntN(len(active))]
		r := rng.Float64()
		var o *check.Op
		switch {
		case h != nil && !h.long && h.backoffMS == 0 && w.stall[i].Load() > 0:
			// A stall holds a task without a retry policy: the faults
			// that stall want the task granted again at the expiry, not
			// after a backoff.
			d := time.Duration(w.stall[i].Swap(0))
			if w.TL != nil {
				w.TL.Log("start", "worker-pause", fmt.Sprintf("client %d holds claim %d of task %d (granted by %s) %s without renewing", i, h.claim, h.task, h.op.Leader, d), nil)
			}
			if f := w.onHold.Load(); f != nil {
				(*f)(i, h.op, d)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
			if w.TL != nil {
				w.TL.Log("end", "worker-pause", fmt.Sprintf("client %d", i), nil)
			}
			if f := w.staleVia.Load(); f != nil {
				if via, done := (*f)(i); via != nil {
					so := w.completeForced(ctx, via, proc, i, h)
					done()
					w.H.Add(so)
					if so.Type == "info" {
						proc = w.H.NewProcess()
					}
				}
			}
			o = w.complete(ctx, n, proc, i, h, 3)
			h = nil
		case h != nil && r < 0.35:
			o = w.renew(ctx, n, proc, i, h)
			if o.Type != "ok" {
				h = nil
			}
		case h != nil && r < 0.65:
			o = w.complete(ctx, n, proc, i, h, uint32(2+rng.IntN(2)))
			h = nil
		case h != nil && h.backoffMS > 0 && r < 0.65+w.FailShare:
			o = w.fail(ctx, n, proc, i, h)
			h = nil
		case h != nil && r < 0.8:
			o = w.yield(ctx, n, proc, i, h)
			h = nil
		case h != nil && !h.long:
			// Renew a short lease rather than let it lapse.
			o = w.renew(ctx, n, proc, i, h)
			if o.Type != "ok" {
				h = nil
			}
		case h != nil:
			o = w.enqueue(ctx, n, proc, i)
		case r < w.EnqueueShare:
			o = w.enqueue(ctx, n, proc, i)
		case r < w.EnqueueShare+w.ReviveShare:
			id := w.endedTask(rng)
			if id == 0 {
				continue
			}
			o = w.revive(ctx, n, proc, i, id)
		case r < w.EnqueueShare+w.ReviveShare+0.07:
			id := w.ackedTask(rng)
			if id == 0 {
				continue
			}
			o = w.read(ctx, n, proc, i, id)
		case r < 0.95:
			long := rng.Float64() < 0.3 && !w.ShortOnly
			o, h = w.claim(ctx, w.claimNode(active, n), proc, i, long)
		default:
			id := w.ackedTask(rng)
			if id == 0 {
				continue
			}
			o = w.cancel(ctx, n, proc, i, id)
		}
		if o == nil {
			continue
		}
		if ctx.Err() != nil && o.Type == "info" {
			// Cut short by the end of the run: still indeterminate.
			w.H.Add(o)
			return
		}
		w.H.Add(o)
		if o.Type == "ok" && (o.F == "complete" || o.F == "cancel") {
			w.mu.Lock()
			w.ended = append(w.ended, o.Task)
			w.mu.Unlock()
		}
		if o.Type == "info" {
			proc = w.H.NewProcess()
			h = nil
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
	}
}

// endedTask returns a random task with an acked complete or cancel, 0
// when none has one yet.
func (w *Workload) endedTask(rng *rand.Rand) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.ended) == 0 {
		return 0
	}
	return w.ended[rng.IntN(len(w.ended))]
}

// revive gives a task a new life (TaskService.Retry of its current life).
func (w *Workload) revive(ctx context.Context, n *Node, proc, client int, id uint64) *check.Op {
	o := &check.Op{Process: proc, Client: client, F: "retry", Node: n.ID, Task: id, Call: w.H.Now()}
	cctx, cancel := w.opCtx(ctx)
	defer cancel()
	_, err := n.Connect.Retry(cctx, connect.NewRequest(&nornv1.RetryRequest{Id: id}))
	o.Return = w.H.Now()
	o.Type, o.Err = classify(err)
	return o
}

// ackedTask returns a random acked task id, 0 when none is acked yet.
func (w *Workload) ackedTask(rng *rand.Rand) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.enqueued) == 0 {
		return 0
	}
	return w.enqueued[rng.IntN(len(w.enqueued))]
}

func (w *Workload) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), w.OpTimeout)
}

// claimNode is the node a claim goes through: ClaimVia while it is
// active, else n.
func (w *Workload) claimNode(active []*Node, n *Node) *Node {
	for _, a := range active {
		if w.ClaimVia != "" && a.ID == w.ClaimVia {
			return a
		}
	}
	return n
}

func (w *Workload) enqueue(ctx context.Context, n *Node, proc, client int) *check.Op {
	seq := w.seq.Add(1)
	payload := fmt.Sprintf("p-%d-%d", client, seq)
	wq := cmp.Or(w.EnqueueW, 2)
	var pr int32
	if w.Priorities > 0 {
		// Spread over the priorities by the op's number (a hash of it).
		pr = int32((uint64(seq) * 0x9E3779B97F4A7C15 >> 33) % uint64(w.Priorities))
	}
	o := &check.Op{Process: proc, Client: client, F: "enqueue", Node: n.ID, W: wq, Payload: payload, Priority: pr, Call: w.H.Now()}
	spec := &nornv1.TaskSpec{Queue: Queue, Payload: []byte(payload), Priority: pr}
	if float64(uint64(seq)*0xBF58476D1CE4E5B9>>40)/float64(1<<24) < w.RetryShare {
		spec.Retry = &nornv1.RetryPolicy{MaxAttempts: w.RetryAttempts, InitialBackoff: durationpb.New(w.RetryBackoff)}
	}
	if h := uint64(seq) * 0x94D049BB133111EB; float64(h>>40)/float64(1<<24) < w.DeadlineShare {
		d := w.DeadlineMin + time.Duration(h>>8%uint64(max(w.DeadlineMax-w.DeadlineMin, 1)))
		spec.Deadline = timestamppb.New(time.Now().Add(d))
		o.Deadline = o.Call + int64(d)
	}
	cctx, cancel := w.opCtx(ctx)
	defer cancel()
	r, err := n.Tasks.Enqueue(cctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: spec, W: wq}))
	o.Return = w.H.Now()
	o.Type, o.Err = classify(err)
	if err == nil {
		o.Task = r.Msg.Id
		w.mu.Lock()
		w.enqueued = append(w.enqueued, r.Msg.Id)
		w.mu.Unlock()
	}
	return o
}

// claim claims one task; the op records the task it got, if any (an empty
// answer is recorded as a fail: nothing was claimed).
func (w *Workload) claim(ctx context.Context, n *Node, proc, client int, long bool) (*check.Op, *held) {
	lease := w.ShortLease
	if long {
		lease = w.LongLease
	}
	o := &check.Op{Process: proc, Client: client, F: "claim", Node: n.ID, LeaseMS: lease.Milliseconds(), Long: long, Call: w.H.Now()}
	cctx, cancel := w.opCtx(ctx)
	defer cancel()
	r, err := n.Tasks.Claim(cctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: Queue, Worker: fmt.Sprintf("c%d", client),
		Lease: durationpb.New(lease), Max: 1, Wait: durationpb.New(300 * time.Millisecond)}))
	o.Return = w.H.Now()
	o.Type, o.Err = classify(err)
	if err != nil {
		return o, nil
	}
	if len(r.Msg.Tasks) == 0 {
		o.Type, o.Err = "fail", "empty"
		return o, nil
	}
	t := r.Msg.Tasks[0]
	o.Task, o.Claim, o.Payload, o.Priority = t.Task.Id, t.ClaimId, string(t.Task.Spec.GetPayload()), t.Task.Spec.GetPriority()
	if l := w.C.NodeByAPI(t.Leader); l != nil {
		o.Leader = l.ID
	}
	return o, &held{task: t.Task.Id, claim: t.ClaimId, long: long, op: o,
		backoffMS: t.Task.Spec.GetRetry().GetInitialBackoff().AsDuration().Milliseconds()}
}

// fail fails the held claim's attempt (a retryable abort): the task is
// claimable again after its backoff, or dead after its last attempt.
func (w *Workload) fail(ctx context.Context, n *Node, proc, client int, h *held) *check.Op {
	o := &check.Op{Process: proc, Client: client, F: "fail", Node: n.ID, Task: h.task, Claim: h.claim, Long: h.long, BackoffMS: h.backoffMS, Call: w.H.Now()}
	cctx, cancel := w.opCtx(ctx)
	defer cancel()
	_, err := n.Tasks.Abort(cctx, connect.NewRequest(&nornv1.AbortRequest{Id: h.task, ClaimId: h.claim, Retry: true,
		Errors: []*nornv1.TaskError{{Code: "jepsen_fail", Args: []string{fmt.Sprint(client)}}}}))
	o.Return = w.H.Now()
	o.Type, o.Err = classify(err)
	return o
}

func (w *Workload) renew(ctx context.Context, n *Node, proc, client int, h *held) *check.Op {
	lease := w.ShortLease
	if h.long {
		lease = w.LongLease
	}
	o := &check.Op{Process: proc, Client: client, F: "renew", Node: n.ID, Task: h.task, Claim: h.claim, LeaseMS: lease.Milliseconds(), Long: h.long, Call: w.H.Now()}
	cctx, cancel := w.opCtx(ctx)
	defer cancel()
	_, err := n.Tasks.Renew(cctx, connect.NewRequest(&nornv1.RenewRequest{Id: h.task, ClaimId: h.claim, Lease: durationpb.New(lease)}))
	o.Return = w.H.Now()
	o.Type, o.Err = classify(err)
	return o
}

func (w *Workload) complete(ctx context.Context, n *Node, proc, client int, h *held, wq uint32) *check.Op {
	o := &check.Op{Process: proc, Client: client, F: "complete", Node: n.ID, Task: h.task, Claim: h.claim, Long: h.long, W: wq, Call: w.H.Now()}
	cctx, cancel := w.opCtx(ctx)
	defer cancel()
	_, err := n.Tasks.Complete(cctx, connect.NewRequest(&nornv1.CompleteRequest{Id: h.task, ClaimId: h.claim, W: wq}))
	o.Return = w.H.Now()
	o.Type, o.Err = classify(err)
	return o
}

// completeForced completes through n with w=1, forcing n to answer
// itself (Norn-Hops at the limit), as a node forwarding to it does (the
// secure cluster takes the header from a node's certificate only).
func (w *Workload) completeForced(ctx context.Context, n *Node, proc, client int, h *held) *check.Op {
	o := &check.Op{Process: proc, Client: client, F: "complete", Node: n.ID, Task: h.task, Claim: h.claim, Long: h.long, W: 1, Call: w.H.Now()}
	cctx, cancel := w.opCtx(ctx)
	defer cancel()
	req := connect.NewRequest(&nornv1.CompleteRequest{Id: h.task, ClaimId: h.claim, W: 1})
	req.Header().Set(transport.HeaderHops, "2")
	_, err := n.Forwarding.Complete(cctx, req)
	o.Return = w.H.Now()
	o.Type, o.Err = classify(err)
	return o
}

func (w *Workload) yield(ctx context.Context, n *Node, proc, client int, h *held) *check.Op {
	o := &check.Op{Process: proc, Client: client, F: "yield", Node: n.ID, Task: h.task, Claim: h.claim, Long: h.long, Call: w.H.Now()}
	cctx, cancel := w.opCtx(ctx)
	defer cancel()
	_, err := n.Tasks.Yield(cctx, connect.NewRequest(&nornv1.YieldRequest{Id: h.task, ClaimId: h.claim}))
	o.Return = w.H.Now()
	o.Type, o.Err = classify(err)
	return o
}

// read reads an acked task with R=2: with W=2 and N=3 it must be found.
func (w *Workload) read(ctx context.Context, n *Node, proc, client int, id uint64) *check.Op {
	o := &check.Op{Process: proc, Client: client, F: "read", Node: n.ID, Task: id, Call: w.H.Now()}
	cctx, cancel := w.opCtx(ctx)
	defer cancel()
	_, err := n.Tasks.GetTask(cctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 2}))
	o.Return = w.H.Now()
	o.Type, o.Err = classify(err)
	return o
}

// cancel cancels a task with W = N: it reaches every replica (during a
// move, every replica of the cohort and of the cohort to be), so the task
// is terminal (check.Terminal). nornd refuses a W above N.
func (w *Workload) cancel(ctx context.Context, n *Node, proc, client int, id uint64) *check.Op {
	wq := uint32(Replication)
	o := &check.Op{Process: proc, Client: client, F: "cancel", Node: n.ID, Task: id, W: wq, Call: w.H.Now()}
	cctx, cancel := w.opCtx(ctx)
	defer cancel()
	_, err := n.Tasks.Cancel(cctx, connect.NewRequest(&nornv1.CancelRequest{Id: id, W: wq}))
	o.Return = w.H.Now()
	o.Type, o.Err = classify(err)
	return o
}

// Drain claims and completes every claimable task until none has come out
// for quiet (long enough for abandoned short leases to expire), or, sooner,
// until nothing can come out before then (queueSettled: no task of the
// queue ready or delayed, and every claimed one held past it), or max
// passes. It returns the time of the
// first successful claim (-1 if none).
func (w *Workload) Drain(ctx context.Context, quiet, max time.Duration) (firstClaim int64, err error) {
	return w.drain(ctx, quiet, max, false)
}

// FirstClaim claims (and completes) until one claim gets a task, or max
// passes; it returns the claim's return time (-1 if none).
func (w *Workload) FirstClaim(ctx context.Context, max time.Duration) (int64, error) {
	return w.drain(ctx, max, max, true)
}

func (w *Workload) drain(ctx context.Context, quiet, max time.Duration, once bool) (firstClaim int64, err error) {
	firstClaim = -1
	proc := w.H.NewProcess()
	deadline := time.Now().Add(max)
	lastGot := time.Now()
	for i := 0; time.Now().Before(deadline) && time.Since(lastGot) < quiet; i++ {
		if ctx.Err() != nil {
			return firstClaim, ctx.Err()
		}
		active := w.C.Active()
		n := active[i%len(active)]
		call := w.H.Now()
		cctx, cancel := w.opCtx(ctx)
		r, err := n.Tasks.Claim(cctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: Queue, Worker: "drain",
			Lease: durationpb.New(time.Minute), Max: 50, Wait: durationpb.New(time.Second)}))
		cancel()
		ret := w.H.Now()
		typ, msg := classify(err)
		if err != nil {
			w.H.Add(&check.Op{Process: proc, Client: -1, F: "claim", Node: n.ID, LeaseMS: 60000, Long: true, Type: typ, Err: msg, Call: call, Return: ret, Drain: true})
			if typ == "info" {
				proc = w.H.NewProcess()
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if len(r.Msg.Tasks) == 0 {
			// A margin of a second: the claim's wait, and the clocks.
			if !once && queueSettled(ctx, w.C, lastGot.Add(quiet+time.Second)) {
				return firstClaim, nil
			}
			continue
		}
		lastGot = time.Now()
		if firstClaim < 0 {
			firstClaim = ret
		}
		for _, t := range r.Msg.Tasks {
			o := &check.Op{Process: proc, Client: -1, F: "claim", Node: n.ID, Task: t.Task.Id, Claim: t.ClaimId, LeaseMS: 60000, Long: true,
				Payload: string(t.Task.Spec.GetPayload()), Type: "ok", Call: call, Return: ret, Drain: true}
			if l := w.C.NodeByAPI(t.Leader); l != nil {
				o.Leader = l.ID
			}
			w.H.Add(o)
		}
		for _, t := range r.Msg.Tasks {
			o := w.complete(ctx, n, proc, -1, &held{task: t.Task.Id, claim: t.ClaimId, long: true}, 2)
			o.Drain = true
			w.H.Add(o)
			if o.Type == "info" {
				proc = w.H.NewProcess()
			}
		}
		if once {
			break
		}
	}
	return firstClaim, nil
}

// FinalRead reads each task with R = replication; it returns the statuses
// (or the error text).
func (w *Workload) FinalRead(ctx context.Context, ids []uint64) map[uint64]string {
	out := map[uint64]string{}
	for i, id := range ids {
		active := w.C.Active()
		n := active[i%len(active)]
		var st string
		for attempt := 0; attempt < 3; attempt++ {
			cctx, cancel := w.opCtx(ctx)
			r, err := n.Tasks.GetTask(cctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 3}))
			cancel()
			if err == nil {
				st = r.Msg.Task.Status.String()
				break
			}
			st = "error: " + err.Error()
			if connect.CodeOf(err) == connect.CodeNotFound {
				st = "NOT_FOUND"
				break
			}
			var ce *connect.Error
			if !errors.As(err, &ce) {
				time.Sleep(200 * time.Millisecond)
			}
		}
		out[id] = st
	}
	return out
}
