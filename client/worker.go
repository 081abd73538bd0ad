package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// Handler does the work of one claimed task and returns its result (stored
// with Complete) or an error (the task is aborted; see Worker). It must
// return soon after ctx is done: the claim is lost, the task was cancelled,
// or the worker is shutting down. context.Cause(ctx) says which.
type Handler func(ctx context.Context, t *Task) (result []byte, err error)

// Error codes the Worker aborts tasks with.
const (
	// CodeHandlerError is the code of an abort caused by a handler error
	// that is not a *TaskError; the description is the error's text.
	CodeHandlerError = "handler_error"

	// CodeHandlerPanic is the code of an abort caused by a panicking
	// handler; the description holds the panic value and stack.
	CodeHandlerPanic = "handler_panic"
)

// TaskError is a handler error that chooses how the task is aborted: its
// fields become the abort's nornv1.TaskError. Return it (or wrap it) from
// a Handler.
type TaskError struct {
	// Code is machine-readable, lower_snake_case by convention, for
	// example "bad_payload". Empty means CodeHandlerError.
	Code string
	// Description is human-readable. Optional.
	Description string
	// Args are values the description refers to. Optional.
	Args []string
}

func (e *TaskError) Error() string {
	if e.Description == "" {
		return e.Code
	}
	return e.Code + ": " + e.Description
}

// ErrYield, returned (or wrapped) by a Handler, gives the task back for
// another claim (Yield) instead of aborting it.
var ErrYield = errors.New("norn: yield the task")

// Permanent wraps a handler error that no retry can fix (a payload that
// does not parse, a record that does not exist): the Worker aborts the
// task for good (ABORTED) instead of failing the attempt for a retry.
// Wrap a *TaskError in it to choose the abort's code. Permanent(nil) is
// nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err is, or wraps, a Permanent error.
func IsPermanent(err error) bool {
	var pe *permanentError
	return errors.As(err, &pe)
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// ErrLeaseExpired is the cause of a handler's context cancellation when the
// worker could not renew the lease before it ran out (the node was
// unreachable): another worker may claim the task now.
var ErrLeaseExpired = errors.New("norn: lease ran out before it could be renewed")

// ErrShutdown is the cause of a handler's context cancellation when the
// Worker's Run context is done.
var ErrShutdown = errors.New("norn: worker shutting down")

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Queue to claim from. Required.
	Queue string

	// Name identifies the worker in the claim history. Default
	// "<hostname>/<pid>".
	Name string

	// Concurrency is the most tasks held (and handlers running) at once.
	// Default 1; at most 10,000.
	Concurrency int

	// Lease is the length of every claim; the worker renews it about
	// every Lease/3 while the handler runs. Default 30 s; at least 100 ms
	// and at most the server's maximum lease (default 1 h).
	Lease time.Duration

	// Wait is how long one Claim long-polls for a task when there is none.
	// Default 20 s; the server shortens it to its maximum (default 60 s).
	Wait time.Duration

	// Handler does the work. Required.
	Handler Handler

	// Logger receives claim, renew and completion failures. Default
	// slog.Default().
	Logger *slog.Logger
}

// Defaults of WorkerConfig.
const (
	DefaultWorkerLease = 30 * time.Second
	DefaultWorkerWait  = 20 * time.Second
)

// Validate reports a WorkerConfig that cannot work. Zero fields are valid
// (they take their defaults) except Queue and Handler.
func (cfg *WorkerConfig) Validate() error {
	switch {
	case cfg.Queue == "":
		return errors.New("norn: WorkerConfig.Queue is required")
	case cfg.Handler == nil:
		return errors.New("norn: WorkerConfig.Handler is required")
	case cfg.Concurrency < 0 || cfg.Concurrency > 10_000:
		return fmt.Errorf("norn: WorkerConfig.Concurrency %d: want 0 (default 1) to 10,000", cfg.Concurrency)
	case cfg.Lease != 0 && cfg.Lease < 100*time.Millisecond:
		return fmt.Errorf("norn: WorkerConfig.Lease %v: want 0 (default 30s) or at least 100ms", cfg.Lease)
	case cfg.Wait < 0:
		return fmt.Errorf("norn: WorkerConfig.Wait %v: negative", cfg.Wait)
	}
	return nil
}

// Worker claims tasks from one queue and runs a Handler on each, at most
// Concurrency at a time. See the package documentation for its contract.
type Worker struct {
	c       *Client
	cfg     WorkerConfig // defaults applied
	log     *slog.Logger
	started atomic.Bool
}

// NewWorker validates cfg and returns a Worker that uses c. Start it with
// Run.
func NewWorker(c *Client, cfg WorkerConfig) (*Worker, error) {
	if c == nil {
		return nil, errors.New("norn: NewWorker: nil client")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Name == "" {
		host, _ := os.Hostname()
		cfg.Name = host + "/" + strconv.Itoa(os.Getpid())
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultWorkerLease
	}
	if cfg.Wait == 0 {
		cfg.Wait = DefaultWorkerWait
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("queue", cfg.Queue, "worker", cfg.Name)
	return &Worker{c: c, cfg: cfg, log: log}, nil
}

// Run claims and handles tasks until ctx is done, then shuts down: it stops
// claiming, cancels the running handlers' contexts, waits for every handler
// to return, settles its task (complete, or yield, see the package
// documentation) and returns nil. A claim that fails with an error retrying
// cannot fix (INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED,
// UNIMPLEMENTED) shuts the worker down the same way, and Run returns that
// error. Other claim errors are logged and retried with backoff. Run may
// be called once.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("norn: Worker.Run called twice")
	}
	// Calls that settle a task run on base, which keeps working after
	// shutdown begins. The claim loop runs on runCtx, cancelled with
	// cause ErrShutdown when ctx is done; the handlers on taskCtx,
	// cancelled with the same cause only once the loop has stopped: the
	// claim in flight is cancelled before a held task is yielded. Should
	// that claim still get the yielded task (the node granted it before
	// it learned of the cancel), its answer is lost, but not the task:
	// the node gives back what it grants for a caller that left, and a
	// framed claim's late answer is given back by the client (framed.go).
	base := context.WithoutCancel(ctx)
	runCtx, stop := context.WithCancelCause(base)
	defer stop(nil)
	defer context.AfterFunc(ctx, func() { stop(ErrShutdown) })()
	taskCtx, stopTasks := context.WithCancelCause(base)
	defer stopTasks(nil)

	var (
		wg       sync.WaitGroup
		slots    = make(chan struct{}, w.cfg.Concurrency) // one token per held task
		failures int
		runErr   error
	)
	for runCtx.Err() == nil {
		select {
		case slots <- struct{}{}:
		case <-runCtx.Done():
			continue
		}
		n := 1
	more:
		for n < min(w.cfg.Concurrency, 1000) {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break more
			}
		}

		sent := time.Now()
		tasks, err := w.c.Claim(runCtx, ClaimRequest{
			Queue: w.cfg.Queue, Worker: w.cfg.Name, Lease: w.cfg.Lease, Max: n, Wait: w.cfg.Wait,
		})
		for range max(n-len(tasks), 0) {
			<-slots
		}
		if len(tasks) > n { // never from a correct server: give back the extra
			for _, ct := range tasks[n:] {
				w.settle(base, ct.GetTask().GetId(), ct.GetClaimId(), outcomeYield, nil, nil, 0)
			}
			tasks = tasks[:n]
		}
		for _, ct := range tasks {
			wg.Go(func() {
				defer func() { <-slots }()
				w.runTask(taskCtx, base, ct, sent)
			})
		}

		switch {
		case err == nil:
			failures = 0
			if len(tasks) == 0 && time.Since(sent) < w.cfg.Wait/2 {
				// An early empty answer: do not spin.
				sleep(runCtx, w.c.retry.BaseBackoff)
			}
		case runCtx.Err() != nil:
		case permanentClaimError(err):
			w.log.Error("norn: claim failed; stopping the worker", "err", err)
			runErr = err
			stop(err)
		default:
			failures++
			w.log.Warn("norn: claim failed; retrying", "err", err, "failures", failures)
			sleep(runCtx, w.c.retry.backoff(failures))
		}
	}
	stopTasks(context.Cause(runCtx))
	wg.Wait()
	return runErr
}

// permanentClaimError reports whether a claim error will not go away by
// retrying.
func permanentClaimError(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodePermissionDenied, connect.CodeUnauthenticated, connect.CodeUnimplemented:
		return true
	}
	return false
}

// Task is one claimed task as a Handler sees it. Its methods are safe for
// concurrent use.
type Task struct {
	// ID is the task's id.
	ID uint64
	// ClaimID is the id of the claim the worker holds.
	ClaimID uint64
	// Payload is the task's payload (Info.Spec.Payload).
	Payload []byte
	// Info is the task as of the claim: spec, claim history and earlier
	// progress updates (for example a checkpoint an earlier claim left in
	// its last update's Data). It is not updated afterwards.
	Info *nornv1.Task

	c     *Client
	gone  func(error) // the claim ended: cancel the handler's context
	mu    sync.Mutex
	seq   uint64  // last update seq sent
	okSeq uint64  // greatest seq the server accepted
	prog  float64 // progress of okSeq
}

// Progress reports the fraction of the work done (0 to 1) and a status
// line; see Update.
func (t *Task) Progress(ctx context.Context, progress float64, message string) error {
	return t.Update(ctx, progress, message, nil)
}

// Update records a progress report under the task's claim, with a sequence
// number one above the last one. data is opaque (a checkpoint, for
// example). When it fails with ErrSuperseded (the claim has ended or the
// task was cancelled) the handler's context is cancelled too.
func (t *Task) Update(ctx context.Context, progress float64, message string, data []byte) error {
	t.mu.Lock()
	t.seq++
	seq := t.seq
	t.mu.Unlock()
	err := t.c.Update(ctx, &nornv1.UpdateRequest{
		Id: t.ID, ClaimId: t.ClaimID, Seq: seq, Progress: progress, Message: message, Data: data,
	})
	if err == nil {
		t.mu.Lock()
		if seq > t.okSeq {
			t.okSeq, t.prog = seq, progress
		}
		t.mu.Unlock()
	} else if IsSuperseded(err) && t.gone != nil {
		t.gone(err)
	}
	return err
}

// progress returns the latest progress the server accepted.
func (t *Task) progress() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prog
}

// outcome is how a task's claim is settled after its handler returned.
type outcome int

const (
	outcomeComplete outcome = iota
	outcomeAbort            // for good: a Permanent error
	outcomeFail             // a failed attempt, retried after its backoff
	outcomeYield
	outcomeNone // the claim is known to have ended: nothing to send
)

// runTask runs the handler on one claimed task, renewing its lease, and
// settles the claim. sent is when the Claim request was sent: the lease
// runs from no earlier than that.
func (w *Worker) runTask(runCtx, base context.Context, ct *nornv1.ClaimedTask, sent time.Time) {
	info := ct.GetTask()
	t := &Task{ID: info.GetId(), ClaimID: ct.GetClaimId(), Payload: info.GetSpec().GetPayload(), Info: info, c: w.c}
	if runCtx.Err() != nil {
		w.settle(base, t.ID, t.ClaimID, outcomeYield, nil, nil, 0)
		return
	}

	hctx, cancelHandler := context.WithCancelCause(runCtx)
	defer cancelHandler(nil)
	var claimGone atomic.Bool // a FAILED_PRECONDITION said the claim ended
	t.gone = func(err error) {
		claimGone.Store(true)
		cancelHandler(err)
	}

	renewCtx, stopRenew := context.WithCancel(base)
	renewed := make(chan struct{})
	var lease leaseDeadline
	lease.set(sent.Add(w.cfg.Lease))
	go func() {
		defer close(renewed)
		w.renew(renewCtx, t, sent, &lease, cancelHandler)
	}()

	result, err := w.callHandler(hctx, t)
	stopRenew()
	<-renewed

	var oc outcome
	switch {
	case claimGone.Load():
		oc = outcomeNone
		w.log.Info("norn: claim ended while the handler ran", "task", t.ID, "claim", t.ClaimID, "cause", context.Cause(hctx))
	case errors.Is(context.Cause(hctx), ErrLeaseExpired) || !time.Now().Before(lease.get()):
		// The worker knows its lease ran out: another worker may hold the
		// task now, so it never completes or aborts it, whatever the
		// handler returned; it gives the task back (a yield the server
		// refuses if the claim has ended), and the task runs again.
		oc = outcomeYield
		w.log.Warn("norn: the lease ran out before the handler returned; yielding, not completing", "task", t.ID, "claim", t.ClaimID, "handler_err", err)
	case err == nil:
		oc = outcomeComplete
	case hctx.Err() != nil || errors.Is(err, ErrYield):
		// The worker stopped the handler (shutdown, lost lease), so its
		// error says nothing about the task: give the task back.
		oc = outcomeYield
	case IsPermanent(err):
		oc = outcomeAbort
	default:
		oc = outcomeFail
	}
	// A complete or abort is retried for as long as the lease lasts (by
	// this worker's clock): through a failover of the task's partition,
	// which answers UNAVAILABLE for a second or three, the work is not
	// thrown away.
	sctx := base
	if d := lease.get(); oc == outcomeComplete || oc == outcomeAbort || oc == outcomeFail {
		var cancel context.CancelFunc
		sctx, cancel = context.WithDeadline(base, d)
		defer cancel()
	}
	w.settle(sctx, t.ID, t.ClaimID, oc, result, err, t.progress())
}

// callHandler runs the handler, turning a panic into an error.
func (w *Worker) callHandler(ctx context.Context, t *Task) (result []byte, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: debug.Stack()}
			w.log.Error("norn: handler panicked", "task", t.ID, "panic", v)
		}
	}()
	return w.cfg.Handler(ctx, t)
}

// leaseDeadline is when a claim's lease runs out by the worker's clock, at
// the latest: counted from before the request that got or renewed it.
type leaseDeadline struct{ unixNano atomic.Int64 }

func (l *leaseDeadline) set(t time.Time) { l.unixNano.Store(t.UnixNano()) }
func (l *leaseDeadline) get() time.Time  { return time.Unix(0, l.unixNano.Load()) }

// renew renews t's lease about every Lease/3 until ctx is done, the first
// time Lease/3 after sent (the claim request's start: at once after a long
// poll that took longer). When the server says the claim has ended, it
// cancels the handler through t.gone; when the lease runs out (by the
// worker's clock, counted from lease) before a renew succeeds, it cancels
// the handler with ErrLeaseExpired. It keeps lease current.
func (w *Worker) renew(ctx context.Context, t *Task, sent time.Time, lease *leaseDeadline, cancelHandler context.CancelCauseFunc) {
	interval := w.cfg.Lease / 3
	timer := time.NewTimer(max(time.Until(sent.Add(interval)), 0))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		sent := time.Now()
		deadline := lease.get()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		_, err := w.c.Renew(rctx, t.ID, t.ClaimID, w.cfg.Lease)
		cancel()
		switch {
		case err == nil:
			lease.set(sent.Add(w.cfg.Lease))
			timer.Reset(interval)
		case ctx.Err() != nil:
			return
		case IsSuperseded(err):
			t.gone(err)
			return
		case !time.Now().Before(deadline):
			w.log.Warn("norn: lease ran out before a renew succeeded", "task", t.ID, "claim", t.ClaimID, "err", err)
			cancelHandler(ErrLeaseExpired)
			return
		default:
			w.log.Warn("norn: renew failed; retrying", "task", t.ID, "claim", t.ClaimID, "err", err)
			timer.Reset(min(interval/3, time.Until(deadline)))
		}
	}
}

// settle ends a claim as oc says, logging a failure: the lease expires
// then and the task is claimed again.
func (w *Worker) settle(ctx context.Context, id, claimID uint64, oc outcome, result []byte, herr error, progress float64) {
	var err error
	switch oc {
	case outcomeNone:
		return
	case outcomeComplete:
		err = w.c.Complete(ctx, id, claimID, result)
	case outcomeYield:
		err = w.c.Yield(ctx, id, claimID, progress)
	case outcomeAbort:
		err = w.c.Abort(ctx, id, claimID, abortError(herr))
	case outcomeFail:
		err = w.c.Fail(ctx, id, claimID, abortError(herr))
	}
	if err != nil {
		w.log.Warn("norn: could not end the claim; the lease will expire", "task", id, "claim", claimID, "err", err)
	}
}

// maxDescription bounds the description of an abort the worker writes
// (the server allows 64 KiB).
const maxDescription = 16 << 10

// abortError turns a handler error into the abort's TaskError.
func abortError(err error) *nornv1.TaskError {
	var te *TaskError
	var pe *panicError
	switch {
	case errors.As(err, &te):
		code := te.Code
		if code == "" {
			code = CodeHandlerError
		}
		return &nornv1.TaskError{Code: truncate(code), Description: truncate(te.Description), Args: validUTF8(te.Args)}
	case errors.As(err, &pe):
		return &nornv1.TaskError{Code: CodeHandlerPanic, Description: truncate(pe.Error() + "\n\n" + string(pe.stack))}
	default:
		return &nornv1.TaskError{Code: CodeHandlerError, Description: truncate(err.Error())}
	}
}

// truncate makes s valid UTF-8 (protobuf strings must be) of at most
// maxDescription bytes.
func truncate(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxDescription {
		return s
	}
	cut := maxDescription
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// validUTF8 returns ss with every string made valid UTF-8.
func validUTF8(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.ToValidUTF8(s, "\uFFFD")
	}
	return out
}

// panicError is a recovered handler panic.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.value) }
