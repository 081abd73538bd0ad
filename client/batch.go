package client

import (
	"context"
	"errors"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// maxBatchBytes caps the encoded specs of one coalesced batch, well below
// the server's default request limit (4 MiB). A spec larger than this goes
// alone.
const maxBatchBytes = 2 << 20

// batcher coalesces concurrent Enqueue calls into EnqueueBatch RPCs (see
// WithEnqueueBatching). Calls with different write quorums never share a
// batch.
type batcher struct {
	c        *Client
	linger   time.Duration
	maxBatch int

	mu     sync.Mutex
	open   map[uint32]*batch // the batch now filling, per write quorum
	closed bool

	inflight sync.WaitGroup // batches being sent
}

// batch is a group of calls sent in one RPC.
type batch struct {
	w     uint32
	items []*batchItem
	bytes int
	timer *time.Timer // fires linger after the first item
}

// batchItem is one waiting Enqueue call.
type batchItem struct {
	ctx  context.Context
	spec *nornv1.TaskSpec
	id   uint64
	done chan batchResult // buffered: the sender never blocks
}

type batchResult struct {
	id  uint64
	err error
}

func newBatcher(c *Client, linger time.Duration, maxBatch int) *batcher {
	return &batcher{c: c, linger: linger, maxBatch: maxBatch, open: map[uint32]*batch{}}
}

// enqueue adds one call to the open batch of quorum w and waits for its
// outcome or for ctx. A caller that gives up before its batch is sent is
// left out of it.
func (b *batcher) enqueue(ctx context.Context, spec *nornv1.TaskSpec, id uint64, w uint32) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, ctxError(err)
	}
	it := &batchItem{ctx: ctx, spec: spec, id: id, done: make(chan batchResult, 1)}
	size := proto.Size(spec)

	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return 0, wrapErr("enqueue", ErrClosed)
	}
	cur := b.open[w]
	if cur != nil && cur.bytes+size > maxBatchBytes {
		b.flushLocked(cur)
		cur = nil
	}
	if cur == nil {
		cur = &batch{w: w}
		b.open[w] = cur
		cur.timer = time.AfterFunc(b.linger, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.open[w] == cur {
				b.flushLocked(cur)
			}
		})
	}
	cur.items = append(cur.items, it)
	cur.bytes += size
	if len(cur.items) >= b.maxBatch || cur.bytes >= maxBatchBytes {
		b.flushLocked(cur)
	}
	b.mu.Unlock()

	select {
	case r := <-it.done:
		return r.id, r.err
	case <-ctx.Done():
		return 0, ctxError(ctx.Err())
	}
}

// flushLocked closes bt to new calls and sends it. b.mu must be held.
func (b *batcher) flushLocked(bt *batch) {
	if b.open[bt.w] == bt {
		delete(b.open, bt.w)
	}
	bt.timer.Stop()
	b.inflight.Add(1)
	go func() {
		defer b.inflight.Done()
		b.send(bt)
	}()
}

// close sends every open batch and waits for all batches in flight.
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	for _, bt := range b.open {
		b.flushLocked(bt)
	}
	b.mu.Unlock()
	b.inflight.Wait()
}

// send sends one batch and hands every caller its outcome: its id, or the
// batch's error with the caller's id when it is known. When the batch fails
// with an error that one bad task can cause (INVALID_ARGUMENT,
// RESOURCE_EXHAUSTED, ALREADY_EXISTS), every task is sent again on its own,
// so that only the bad one's caller sees the error.
func (b *batcher) send(bt *batch) {
	items := bt.items[:0:0]
	for _, it := range bt.items {
		if it.ctx.Err() == nil {
			items = append(items, it)
		}
	}
	if len(items) == 0 {
		return
	}
	ctx, cancel := b.sendContext(items)
	defer cancel()

	if len(items) == 1 {
		it := items[0]
		id, err := b.c.enqueueOne(ctx, it.spec, it.id, bt.w)
		it.done <- batchResult{id, err}
		return
	}

	specs := make([]*nornv1.TaskSpec, len(items))
	var ids []uint64
	for i, it := range items {
		specs[i] = it.spec
		if it.id != 0 {
			if ids == nil {
				ids = make([]uint64, len(items))
			}
			ids[i] = it.id
		}
	}
	got, err := b.c.enqueueBatch(ctx, specs, ids, bt.w)
	if err == nil {
		for i, it := range items {
			it.done <- batchResult{id: got[i]}
		}
		return
	}
	if got != nil {
		ids = got
	}
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeResourceExhausted, connect.CodeAlreadyExists:
		var wg sync.WaitGroup
		for i, it := range items {
			id := it.id
			if ids != nil {
				id = ids[i]
			}
			wg.Go(func() {
				id, err := b.c.enqueueOne(ctx, it.spec, id, bt.w)
				it.done <- batchResult{id, err}
			})
		}
		wg.Wait()
		return
	}
	var ce *callError
	if errors.As(err, &ce) {
		err = &callError{method: "enqueue (batched)", err: ce.err, ctxErr: ce.ctxErr}
	}
	for i, it := range items {
		r := batchResult{err: err}
		if ids != nil {
			r.id = ids[i]
		}
		it.done <- r
	}
}

// sendContext returns the context of a batch's RPC: no caller's
// cancellation applies to it (each caller stops waiting on its own), and
// its deadline is the latest of the callers' deadlines, or the client's
// timeout when a caller has none.
func (b *batcher) sendContext(items []*batchItem) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, it := range items {
		d, ok := it.ctx.Deadline()
		if !ok {
			return b.c.withTimeout(context.Background(), 0)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// ctxError turns a context error into a connect error with the matching
// code, wrapped like the client's other errors.
func ctxError(err error) error {
	code := connect.CodeCanceled
	if errors.Is(err, context.DeadlineExceeded) {
		code = connect.CodeDeadlineExceeded
	}
	return wrapErr("enqueue", connect.NewError(code, err))
}
