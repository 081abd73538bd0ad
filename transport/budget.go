package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/semaphore"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrBudgetExhausted is wrapped by the RESOURCE_EXHAUSTED error of a
// request refused because its bytes did not fit in its Budget in time:
// the node held as many request bytes as it may; the call did not run,
// and may be sent again later.
var ErrBudgetExhausted = errors.New("transport: too many request bytes in flight")

// DefaultBudgetWait is how long a request waits for room in a Budget
// before it is refused: long enough to ride out a burst (a request's
// bytes are given back when it has been answered, within milliseconds
// for most), short enough that a node that stays full sheds its load
// instead of queueing it.
const DefaultBudgetWait = time.Second

// Budget bounds the bytes of requests a node holds at once: a request's
// bytes are taken from it before they are read (a framed call's whole
// frame, an HTTP body as it is read: BudgetBody) and given back when the
// request has been answered. One that does not fit within the wait is
// refused (ErrBudgetExhausted). Waiters are served first come, first
// served. Safe for concurrent use.
//
// What it counts is request bytes as received; a decoded message holds
// about as much again until its call returns.
type Budget struct {
	name    string
	size    int64
	wait    time.Duration
	sem     *semaphore.Weighted
	inUse   atomic.Int64
	refused atomic.Uint64
}

// NewBudget returns a budget of size bytes (at least 1) whose requests
// wait at most wait for room (0: DefaultBudgetWait). name says whose
// requests it bounds, in its errors ("client", "peer").
func NewBudget(name string, size int64, wait time.Duration) *Budget {
	if size < 1 {
		panic(fmt.Sprintf("transport: budget %q of %d bytes", name, size))
	}
	if wait == 0 {
		wait = DefaultBudgetWait
	}
	return &Budget{name: name, size: size, wait: wait, sem: semaphore.NewWeighted(size)}
}

// Acquire takes n bytes (0 < n <= Size), waiting for room at most the
// budget's wait, or until ctx ends. It fails with a RESOURCE_EXHAUSTED
// *connect.Error that wraps ErrBudgetExhausted (or ctx's error), having
// taken nothing.
func (b *Budget) Acquire(ctx context.Context, n int64) error {
	if n > b.size {
		b.refused.Add(1)
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%w: a %s request of %d bytes exceeds the node's %d", ErrBudgetExhausted, b.name, n, b.size))
	}
	if !b.sem.TryAcquire(n) {
		wctx, cancel := context.WithTimeout(ctx, b.wait)
		err := b.sem.Acquire(wctx, n)
		cancel()
		if err != nil {
			b.refused.Add(1)
			if err := ctx.Err(); err != nil {
				code := connect.CodeCanceled
				if errors.Is(err, context.DeadlineExceeded) {
					code = connect.CodeDeadlineExceeded
				}
				return connect.NewError(code, err)
			}
			return retryLater(connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%w: the node holds %d bytes of %s requests (at most %d), and %d more did not fit within %s; retry later",
				ErrBudgetExhausted, b.inUse.Load(), b.name, b.size, n, b.wait)))
		}
	}
	b.inUse.Add(n)
	return nil
}

// TryAcquire takes n bytes if they fit now, without waiting (nor taking
// a place before requests that wait); else it fails as Acquire does.
func (b *Budget) TryAcquire(n int64) error {
	if n > b.size || !b.sem.TryAcquire(n) {
		b.refused.Add(1)
		return retryLater(connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%w: the node holds %d bytes of %s requests (at most %d), and %d more did not fit; retry later",
			ErrBudgetExhausted, b.inUse.Load(), b.name, b.size, n)))
	}
	b.inUse.Add(n)
	return nil
}

// BudgetRetryDelay is the delay a budget's refusal suggests before the
// same request is sent again (its google.rpc.RetryInfo).
const BudgetRetryDelay = 100 * time.Millisecond

// retryLater adds to a budget's refusal a google.rpc.RetryInfo detail: the
// request did not run, and the same one may be sent again (after
// BudgetRetryDelay), unlike a request over the size limit, which has
// none. It returns ce.
func retryLater(ce *connect.Error) *connect.Error {
	if d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(BudgetRetryDelay)}); err == nil {
		ce.AddDetail(d)
	}
	return ce
}

// Release gives back n bytes taken by Acquire or TryAcquire.
func (b *Budget) Release(n int64) {
	if n == 0 {
		return
	}
	b.inUse.Add(-n)
	b.sem.Release(n)
}

// Size is the budget's size in bytes.
func (b *Budget) Size() int64 { return b.size }

// InUse is the bytes taken now.
func (b *Budget) InUse() int64 { return b.inUse.Load() }

// Refused counts the requests refused so far.
func (b *Budget) Refused() uint64 { return b.refused.Load() }

// budgetChunk is how many bytes a BudgetBody takes at a time once it goes
// on past the length it declared (a second gRPC envelope).
const budgetChunk = 32 << 10

// BodyShape is what a request says of its body before it is read.
type BodyShape struct {
	// Limit is the largest message its handler reads: it reads at most
	// Limit+1 bytes of it (then knows it is too large), and what a
	// reader reads past that to throw it away is not held.
	Limit int64
	// Length is its Content-Length, -1 when unknown.
	Length int64
	// Encoding, when not "" or "identity", says the body is compressed
	// and decodes to at most Limit bytes.
	Encoding string
	// Enveloped: a gRPC or gRPC-Web body, whose message follows a
	// 5-byte prefix that gives its length.
	Enveloped bool
	// Shared: the body shares its connection's flow control with other
	// requests (HTTP/2): it does not wait for room but is refused at
	// once. A body that waits leaves its data unread in the connection's
	// window, which the requests that hold the budget may need to
	// finish: they could all wait for each other until the wait is over.
	Shared bool
}

// grpcPrefix is the length of a gRPC envelope's prefix: a flags byte and
// the message's length.
const grpcPrefix = 5

// BudgetBody is a request body read through a Budget: its bytes are
// taken from the budget before they are read, once its first bytes have
// arrived, all at once: its length (its Content-Length, or the length in
// a gRPC envelope's prefix), or its limit when it declares none; what it
// does not use goes back when it ends. An encoded body takes its limit
// too, for what it decodes to. Taking all at once (not a part at a time)
// keeps requests that wait for room from each holding part of it, which
// could fill the budget with requests that can none of them go on. Bytes
// past what the body declared (a second envelope) are taken only if
// there is room at once, and so is a Shared body. Past the limit nothing is taken: what a handler
// reads there it throws away. Read fails with Budget.Acquire's error when
// there is no room in time. Release gives the bytes back: call it once
// the request has been answered.
//
// Reads are the handler's, one at a time as for any reader; Release and
// Taken may be called from other goroutines.
type BudgetBody struct {
	rc      io.ReadCloser
	ctx     context.Context
	b       *Budget
	shape   BodyShape
	head    []byte // read ahead, to be read first
	headErr error  // what the read ahead ended with, after head
	started bool   // the first bytes were taken

	mu      sync.Mutex
	most    int64 // the body bytes it may take; 0 once released
	body    int64 // body bytes taken
	credit  int64 // of body, taken and not read yet
	decoded int64 // taken for an encoded body's decoded message
	err     error
}

// Body returns rc, the body of a request of shape, read through b.
func (b *Budget) Body(ctx context.Context, rc io.ReadCloser, shape BodyShape) *BudgetBody {
	most := shape.Limit + 1
	if shape.Enveloped {
		most += grpcPrefix
	}
	if shape.Length >= 0 {
		most = min(most, shape.Length)
	}
	return &BudgetBody{rc: rc, ctx: ctx, b: b, shape: shape, most: min(most, b.size)}
}

// Read reads from the body once its bytes are taken from the budget.
func (r *BudgetBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return r.rc.Read(p)
	}
	r.mu.Lock()
	err, need := r.err, r.credit == 0 && r.body < r.most
	r.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if need && len(r.head) == 0 && r.headErr == nil {
		// Look ahead: a body that has ended takes nothing, and one that
		// has not taken anything yet takes nothing before its first byte.
		ahead := 1
		if !r.started && r.shape.Enveloped {
			ahead = grpcPrefix
		}
		var buf [grpcPrefix]byte
		n, err := io.ReadFull(r.rc, buf[:ahead])
		if n == 0 {
			return 0, err
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF // the body ended where the reader would say so
		}
		r.head, r.headErr = buf[:n], err
	}
	if need {
		if err := r.take(); err != nil {
			return 0, err
		}
	}
	r.mu.Lock()
	counted := r.credit > 0
	if counted && int64(len(p)) > r.credit {
		p = p[:r.credit]
	}
	r.mu.Unlock()
	var n int
	if len(r.head) > 0 {
		n = copy(p, r.head)
		r.head = r.head[n:]
		if len(r.head) == 0 && r.headErr != nil {
			err, r.headErr = r.headErr, nil
		}
	}
	if len(r.head) == 0 && err == nil && n < len(p) {
		var k int
		k, err = r.rc.Read(p[n:])
		n += k
	}
	r.mu.Lock()
	if counted && r.most > 0 {
		r.credit -= int64(n)
		if err != nil && r.credit > 0 {
			// The body ended: what it did not use goes back now.
			r.b.Release(r.credit)
			r.body -= r.credit
			r.credit = 0
		}
	}
	r.mu.Unlock()
	return n, err
}

// take takes the next bytes of the body from the budget: at its first
// bytes, all it declared (waiting for room, unless Shared); past that, a
// chunk if there is room now.
func (r *BudgetBody) take() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.credit > 0 || r.body >= r.most {
		return nil // released meanwhile
	}
	n := r.most - r.body
	var decoded int64
	var err error
	if !r.started {
		r.started = true
		if r.shape.Enveloped && r.shape.Length < 0 && len(r.head) == grpcPrefix {
			n = min(n, grpcPrefix+int64(binary.BigEndian.Uint32(r.head[1:])))
		}
		if r.shape.Encoding != "" && !strings.EqualFold(r.shape.Encoding, "identity") {
			decoded = min(r.shape.Limit, r.b.size-r.most)
		}
		if r.shape.Shared {
			err = r.b.TryAcquire(n + decoded)
		} else {
			err = r.b.Acquire(r.ctx, n+decoded)
		}
	} else {
		n = min(n, budgetChunk)
		err = r.b.TryAcquire(n)
	}
	if err != nil {
		r.err = err
		return err
	}
	r.body += n
	r.credit = n
	r.decoded += decoded
	return nil
}

// Close closes the underlying body; the bytes stay taken until Release.
func (r *BudgetBody) Close() error { return r.rc.Close() }

// Release gives the body's bytes back to the budget; reads after it are
// no longer counted. Call it once the request has been answered.
func (r *BudgetBody) Release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.b.Release(r.body + r.decoded)
	r.body, r.credit, r.most, r.decoded = 0, 0, 0, 0
}

// Taken is the bytes the body holds of its budget now.
func (r *BudgetBody) Taken() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.body + r.decoded
}
