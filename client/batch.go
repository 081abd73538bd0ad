package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// maxBatchBytes caps the encoded items of one coalesced batch, well below
// the server's default request limit (4 MiB). An item larger than this
// goes alone.
const maxBatchBytes = 2 << 20

// coalescer groups concurrent calls of one kind into batches, one RPC per
// batch (see WithEnqueueBatching and WithCompleteBatching). Calls with
// different write quorums, or bound for different nodes (leader hints),
// never share a batch. send must answer every call of the batch.
//
// With a linger (timed batching), a call joins the open batch of its key
// (or opens one), and a batch is sent when it holds maxBatch items or
// maxBatchBytes, or linger after its first call.
//
// With no linger (the default: batching while in flight), a call goes out
// at once, alone, while fewer than maxInflightBatches batches of its key
// are in flight; otherwise it joins the open batch of its key, which is
// sent as soon as one of those returns (or when it is full). A lone
// caller waits for nothing; concurrent callers share RPCs, more of them
// the slower the node answers.
type coalescer[I, R any] struct {
	method   string // for errors: "enqueue", "complete"
	linger   time.Duration
	maxBatch int
	send     func(key batchKey, calls []*pending[I, R])

	mu     sync.Mutex
	open   map[batchKey]*batch[I, R] // the batch now filling, per key
	busy   map[batchKey]int          // batches in flight, per key
	closed bool

	inflight sync.WaitGroup // batches being sent
}

// batchKey is what the calls of one batch share: the write quorum, and
// the node they should go to ("" for any; see leaderHints).
type batchKey struct {
	w      uint32
	leader string
}

// batch is a group of calls sent in one RPC.
type batch[I, R any] struct {
	key   batchKey
	calls []*pending[I, R]
	bytes int
	timer *time.Timer // fires linger after the first call; nil without linger
}

// maxInflightBatches bounds the batches of one key in flight before calls
// wait to be batched, when batching while in flight. At 1, 8 workers
// completing one task at a time each waited for one another's calls
// (2,000-2,150 tasks/s on make cluster); at 4 they mostly go at once
// (2,400-2,900/s), and hundreds of concurrent callers still share
// batches (docs/BENCHMARKS.md, session 12).
const maxInflightBatches = 4

// pending is one waiting call.
type pending[I, R any] struct {
	ctx  context.Context
	in   I
	done chan callOutcome[R] // buffered: the sender never blocks
}

type callOutcome[R any] struct {
	r   R
	err error
}

// answer hands the call its outcome.
func (p *pending[I, R]) answer(r R, err error) { p.done <- callOutcome[R]{r, err} }

func newCoalescer[I, R any](method string, linger time.Duration, maxBatch int, send func(batchKey, []*pending[I, R])) *coalescer[I, R] {
	return &coalescer[I, R]{method: method, linger: linger, maxBatch: maxBatch, send: send,
		open: map[batchKey]*batch[I, R]{}, busy: map[batchKey]int{}}
}

// do adds one call (in, of encoded size bytes) to the open batch of key
// and waits for its outcome or for ctx. A caller that gives up before its
// batch is sent is left out of it.
func (b *coalescer[I, R]) do(ctx context.Context, key batchKey, in I, size int) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		return zero, b.ctxError(err)
	}
	p := &pending[I, R]{ctx: ctx, in: in, done: make(chan callOutcome[R], 1)}

	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return zero, wrapErr(b.method, ErrClosed)
	}
	cur := b.open[key]
	if cur != nil && cur.bytes+size > maxBatchBytes {
		b.flushLocked(cur)
		cur = nil
	}
	switch {
	case cur == nil && b.linger == 0 && b.busy[key] < maxInflightBatches:
		// Nothing waits and the node keeps up: go at once.
		b.flushLocked(&batch[I, R]{key: key, calls: []*pending[I, R]{p}, bytes: size})
		b.mu.Unlock()
		return b.wait(ctx, p)
	case cur == nil && b.linger == 0:
		cur = &batch[I, R]{key: key}
		b.open[key] = cur
	case cur == nil:
		cur = &batch[I, R]{key: key}
		b.open[key] = cur
		cur.timer = time.AfterFunc(b.linger, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.open[key] == cur {
				b.flushLocked(cur)
			}
		})
	}
	cur.calls = append(cur.calls, p)
	cur.bytes += size
	if len(cur.calls) >= b.maxBatch || cur.bytes >= maxBatchBytes {
		b.flushLocked(cur)
	}
	b.mu.Unlock()
	return b.wait(ctx, p)
}

// wait returns p's outcome, or the error of ctx when it ends first.
func (b *coalescer[I, R]) wait(ctx context.Context, p *pending[I, R]) (R, error) {
	var zero R
	select {
	case o := <-p.done:
		return o.r, o.err
	case <-ctx.Done():
		return zero, b.ctxError(ctx.Err())
	}
}

// flushLocked closes bt to new calls and sends it without the calls whose
// callers gave up. b.mu must be held.
func (b *coalescer[I, R]) flushLocked(bt *batch[I, R]) {
	if b.open[bt.key] == bt {
		delete(b.open, bt.key)
	}
	if bt.timer != nil {
		bt.timer.Stop()
	}
	b.busy[bt.key]++
	b.inflight.Add(1)
	go func() {
		defer b.inflight.Done()
		calls := bt.calls[:0:0]
		for _, p := range bt.calls {
			if p.ctx.Err() == nil {
				calls = append(calls, p)
			}
		}
		if len(calls) > 0 {
			b.send(bt.key, calls)
		}
		b.mu.Lock()
		if b.busy[bt.key]--; b.busy[bt.key] == 0 {
			delete(b.busy, bt.key)
		}
		if next := b.open[bt.key]; next != nil && b.linger == 0 {
			b.flushLocked(next) // the calls that waited for this one
		}
		b.mu.Unlock()
	}()
}

// close sends every open batch and waits for all batches in flight.
func (b *coalescer[I, R]) close() {
	b.mu.Lock()
	b.closed = true
	for _, bt := range b.open {
		b.flushLocked(bt)
	}
	b.mu.Unlock()
	b.inflight.Wait()
}

// ctxError turns a context error into a connect error with the matching
// code, wrapped like the client's other errors.
func (b *coalescer[I, R]) ctxError(err error) error {
	code := connect.CodeCanceled
	if errors.Is(err, context.DeadlineExceeded) {
		code = connect.CodeDeadlineExceeded
	}
	return wrapErr(b.method, connect.NewError(code, err))
}

// batchContext returns the context of a batch's RPC: no caller's
// cancellation applies to it (each caller stops waiting on its own), its
// deadline is the latest of the callers' deadlines, or the client's
// timeout when a caller has none, and it carries a caller's trace context.
func batchContext[I, R any](c *Client, calls []*pending[I, R]) (context.Context, context.CancelFunc) {
	var latest time.Time
	noDeadline := false
	var sc trace.SpanContext // the first valid, a sampled one over one that is not
	for _, p := range calls {
		if s := trace.SpanContextFromContext(p.ctx); s.IsValid() && (!sc.IsValid() || s.IsSampled() && !sc.IsSampled()) {
			sc = s
		}
		d, ok := p.ctx.Deadline()
		if !ok {
			noDeadline = true
		}
		if d.After(latest) {
			latest = d
		}
	}
	ctx := context.Background()
	if sc.IsValid() {
		// A batch has one parent; each caller's own span times its wait.
		ctx = trace.ContextWithSpanContext(ctx, sc)
	}
	if noDeadline {
		return c.withTimeout(ctx, 0)
	}
	return context.WithDeadline(ctx, latest)
}

// batchedError renames a whole batch's error for its callers.
func batchedError(method string, err error) error {
	var ce *callError
	if errors.As(err, &ce) {
		return &callError{method: method + " (batched)", err: ce.err, ctxErr: ce.ctxErr}
	}
	return err
}

// enqueueCall is one coalesced Enqueue: its spec and its id (0 for a new
// one).
type enqueueCall struct {
	spec *nornv1.TaskSpec
	id   uint64
}

func newEnqueueCoalescer(c *Client, linger time.Duration, maxBatch int) *coalescer[enqueueCall, uint64] {
	return newCoalescer("enqueue", linger, maxBatch, c.sendEnqueues)
}

// enqueue adds one Enqueue to the open batch and waits for its id.
func (c *Client) enqueueCoalesced(ctx context.Context, spec *nornv1.TaskSpec, id uint64, w uint32) (uint64, error) {
	return c.enqueues.do(ctx, batchKey{w: w}, enqueueCall{spec, id}, proto.Size(spec))
}

// sendEnqueues sends one batch of Enqueue calls and hands every caller its
// outcome: its id, or the batch's error with the caller's id when it is
// known. When the batch fails with an error that one bad task can cause
// (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ALREADY_EXISTS), every task is
// sent again on its own, so that only the bad one's caller sees the error.
func (c *Client) sendEnqueues(key batchKey, calls []*pending[enqueueCall, uint64]) {
	w := key.w
	if len(calls) == 1 {
		// A batch of one is its caller's own call, under its context.
		p := calls[0]
		p.answer(c.enqueueOne(p.ctx, p.in.spec, p.in.id, enqueueOptions{w: w}))
		return
	}
	ctx, cancel := batchContext(c, calls)
	defer cancel()

	specs := make([]*nornv1.TaskSpec, len(calls))
	var ids []uint64
	for i, p := range calls {
		specs[i] = p.in.spec
		if p.in.id != 0 {
			if ids == nil {
				ids = make([]uint64, len(calls))
			}
			ids[i] = p.in.id
		}
	}
	got, err := c.enqueueBatch(ctx, specs, ids, w, nil)
	if err == nil {
		for i, p := range calls {
			p.answer(got[i], nil)
		}
		return
	}
	if got != nil {
		ids = got
	}
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeResourceExhausted, connect.CodeAlreadyExists:
		var wg sync.WaitGroup
		for i, p := range calls {
			id := p.in.id
			if ids != nil {
				id = ids[i]
			}
			wg.Go(func() { p.answer(c.enqueueOne(ctx, p.in.spec, id, enqueueOptions{w: w})) })
		}
		wg.Wait()
		return
	}
	err = batchedError("enqueue", err)
	for i, p := range calls {
		var id uint64
		if ids != nil {
			id = ids[i]
		}
		p.answer(id, err)
	}
}

func newCompleteCoalescer(c *Client, linger time.Duration, maxBatch int) *coalescer[*nornv1.CompleteRequest, struct{}] {
	return newCoalescer("complete", linger, maxBatch, c.sendCompletes)
}

// sendCompletes sends one batch of Complete calls as a CompleteBatch
// (retried as a whole: completes are idempotent), to the batch's leader
// when it has one, and hands every caller its own outcome.
func (c *Client) sendCompletes(key batchKey, calls []*pending[*nornv1.CompleteRequest, struct{}]) {
	w := key.w
	if len(calls) == 1 {
		in := calls[0].in
		req := &nornv1.CompleteRequest{Id: in.Id, ClaimId: in.ClaimId, Result: in.Result, W: w}
		// The policy's attempts: Complete retries on past them, with the
		// claim's lease (callClaim).
		err := c.callAt(calls[0].ctx, key.leader, "complete", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
			_, err := ep.tasks.Complete(ctx, connect.NewRequest(req))
			return err
		})
		calls[0].answer(struct{}{}, err)
		return
	}
	ctx, cancel := batchContext(c, calls)
	defer cancel()
	req := &nornv1.CompleteBatchRequest{W: w, Completions: make([]*nornv1.CompleteRequest, len(calls))}
	for i, p := range calls {
		req.Completions[i] = p.in
	}
	var results []*nornv1.CompletionResult
	err := c.callAt(ctx, key.leader, "complete (batched)", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.tasks.CompleteBatch(ctx, connect.NewRequest(req))
		if err == nil {
			results = resp.Msg.GetResults()
			if len(results) != len(calls) {
				return connect.NewError(connect.CodeInternal, errProtocol("CompleteBatch answered a different number of results than completions"))
			}
		}
		return err
	})
	for i, p := range calls {
		switch {
		case err != nil:
			p.answer(struct{}{}, err)
		case results[i].GetCode() != "":
			p.answer(struct{}{}, itemError("complete", results[i].GetCode(), results[i].GetMessage()))
		default:
			p.answer(struct{}{}, nil)
		}
	}
}

// itemError is the error of one item of a batch RPC, from its code (in
// the connect protocol's form) and message.
func itemError(method, code, msg string) error {
	var c connect.Code
	if err := c.UnmarshalText([]byte(code)); err != nil {
		c = connect.CodeUnknown
		msg = fmt.Sprintf("%s (unknown code %q)", msg, code)
	}
	return wrapErr(method, connect.NewError(c, errors.New(msg)))
}
