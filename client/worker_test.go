package client_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
)

var quiet = slog.New(slog.DiscardHandler)

// startWorker runs a worker until the returned stop is called (or the test
// ends); stop returns Run's error.
func startWorker(t *testing.T, c *client.Client, cfg client.WorkerConfig) (stop func() error) {
	t.Helper()
	if cfg.Queue == "" {
		cfg.Queue = "q"
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	if cfg.Wait == 0 {
		cfg.Wait = time.Second
	}
	w, err := client.NewWorker(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after its context was cancelled")
			}
		})
		return runErr
	}
	t.Cleanup(func() { stop() })
	return stop
}

func enqueue(t *testing.T, c *client.Client, s *nornv1.TaskSpec) uint64 {
	t.Helper()
	id, err := c.Enqueue(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func waitStatus(t *testing.T, f *fakeServer, id uint64, want nornv1.TaskStatus) *nornv1.Task {
	t.Helper()
	var task *nornv1.Task
	waitFor(t, "task "+want.String(), func() bool {
		task = f.task(id)
		return task.GetStatus() == want
	})
	return task
}

// lastEnd returns how the task's last claim ended.
func lastEnd(task *nornv1.Task) nornv1.ClaimEnd {
	cs := task.GetClaims()
	if len(cs) == 0 {
		return nornv1.ClaimEnd_CLAIM_END_UNSPECIFIED
	}
	return cs[len(cs)-1].GetEndReason()
}

// TestWorkerCompletes: claim -> handler -> complete with the result, and
// the handler's progress reports arrive with increasing seq.
func TestWorkerCompletes(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	id := enqueue(t, c, spec("hello"))
	startWorker(t, c, client.WorkerConfig{
		Name: "w1",
		Handler: func(ctx context.Context, task *client.Task) ([]byte, error) {
			if err := task.Progress(ctx, 0.5, "half"); err != nil {
				return nil, err
			}
			if err := task.Update(ctx, 0.9, "almost", []byte("ckpt")); err != nil {
				return nil, err
			}
			return []byte(strings.ToUpper(string(task.Payload))), nil
		},
	})
	task := waitStatus(t, f, id, nornv1.TaskStatus_TASK_STATUS_COMPLETED)
	if string(task.GetResult()) != "HELLO" || task.GetClaims()[0].GetWorker() != "w1" {
		t.Fatalf("task = %v", task)
	}
	ups := task.GetUpdates()
	if len(ups) != 2 || ups[0].GetSeq() != 1 || ups[1].GetSeq() != 2 || string(ups[1].GetData()) != "ckpt" {
		t.Fatalf("updates = %v", ups)
	}
}

// TestWorkerSettles: a handler's error aborts the task (with the code a
// TaskError chooses), a panic aborts it without stopping the worker, and
// ErrYield gives it back.
func TestWorkerSettles(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	// One attempt each: a failed attempt makes the task DEAD at once.
	once := func(s *nornv1.TaskSpec) *nornv1.TaskSpec { s.Retry = &nornv1.RetryPolicy{MaxAttempts: 1}; return s }
	// Higher priority first: the panic comes before the rest, which shows
	// the worker carries on after it.
	panicID := enqueue(t, c, once(&nornv1.TaskSpec{Queue: "q", Payload: []byte("panic"), Priority: 9}))
	plainID := enqueue(t, c, once(spec("plain")))
	typedID := enqueue(t, c, once(spec("typed")))
	permanentID := enqueue(t, c, once(spec("permanent")))
	yieldID := enqueue(t, c, spec("yield"))
	startWorker(t, c, client.WorkerConfig{
		Handler: func(ctx context.Context, task *client.Task) ([]byte, error) {
			switch string(task.Payload) {
			case "panic":
				panic("kaboom")
			case "plain":
				return nil, errors.New("boom")
			case "typed":
				return nil, &client.TaskError{Code: "bad_input", Description: "no good", Args: []string{"a"}}
			case "permanent":
				return nil, fmt.Errorf("parsing: %w", client.Permanent(&client.TaskError{Code: "bad_input", Description: "for good"}))
			case "yield":
				if len(task.Info.GetClaims()) == 1 {
					task.Progress(ctx, 0.3, "")
					return nil, client.ErrYield
				}
			}
			return []byte("ok"), nil
		},
	})

	// A handler's error, typed or not, or a panic fails the attempt (a
	// retryable abort): with one attempt allowed, the task is DEAD.
	task := waitStatus(t, f, panicID, nornv1.TaskStatus_TASK_STATUS_DEAD)
	if e := task.GetErrors()[0]; e.GetCode() != client.CodeHandlerPanic || !strings.Contains(e.GetDescription(), "kaboom") ||
		!strings.Contains(e.GetDescription(), "goroutine") || e.GetAttempt() != 1 {
		t.Errorf("panic: errors = %v", task.GetErrors())
	}
	task = waitStatus(t, f, plainID, nornv1.TaskStatus_TASK_STATUS_DEAD)
	if e := task.GetErrors()[0]; e.GetCode() != client.CodeHandlerError || e.GetDescription() != "boom" {
		t.Errorf("plain error: errors = %v", task.GetErrors())
	}
	task = waitStatus(t, f, typedID, nornv1.TaskStatus_TASK_STATUS_DEAD)
	want := &nornv1.TaskError{Code: "bad_input", Description: "no good", Args: []string{"a"}, Attempt: 1}
	if !proto.Equal(task.GetErrors()[0], want) {
		t.Errorf("TaskError: errors = %v", task.GetErrors())
	}
	// Permanent aborts for good, with the TaskError it wraps.
	task = waitStatus(t, f, permanentID, nornv1.TaskStatus_TASK_STATUS_ABORTED)
	if e := task.GetErrors()[0]; e.GetCode() != "bad_input" || e.GetDescription() != "for good" || task.GetFailedAttempts() != 0 {
		t.Errorf("Permanent: %v", task)
	}
	task = waitStatus(t, f, yieldID, nornv1.TaskStatus_TASK_STATUS_COMPLETED)
	if cs := task.GetClaims(); len(cs) != 2 || cs[0].GetEndReason() != nornv1.ClaimEnd_CLAIM_END_YIELDED {
		t.Errorf("yield: claims = %v", cs)
	}
}

// TestWorkerRenewsAtAThirdOfTheLease: with a 300 ms lease, renews come
// about every 100 ms, and never later than the lease.
func TestWorkerRenewsAtAThirdOfTheLease(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	id := enqueue(t, c, spec("slow"))
	const lease = 300 * time.Millisecond
	renews := func() []time.Time {
		f.mu.Lock()
		defer f.mu.Unlock()
		return append([]time.Time{f.claimedAt[id]}, f.renews[id]...)
	}
	startWorker(t, c, client.WorkerConfig{
		Lease: lease,
		Handler: func(ctx context.Context, _ *client.Task) ([]byte, error) {
			for len(renews()) < 5 {
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(5 * time.Millisecond):
				}
			}
			return nil, nil
		},
	})
	waitStatus(t, f, id, nornv1.TaskStatus_TASK_STATUS_COMPLETED)
	times := renews()
	for i := 1; i < len(times); i++ {
		if d := times[i].Sub(times[i-1]); d < lease/3-10*time.Millisecond || d >= lease {
			t.Errorf("renew %d came %v after the previous (claim or renew); want about %v", i, d, lease/3)
		}
	}
}

// TestWorkerRenewFailureCancelsHandler: when a renew fails with
// FAILED_PRECONDITION (the task was cancelled, or the claim superseded),
// the handler's context is cancelled with that cause and the worker sends
// nothing more for the claim.
func TestWorkerRenewFailureCancelsHandler(t *testing.T) {
	for _, how := range []string{"cancel", "superseded"} {
		t.Run(how, func(t *testing.T) {
			f := newFakeT(t)
			c := newClient(t, f.addr)
			id := enqueue(t, c, spec("x"))
			started := make(chan struct{})
			causes := make(chan error, 1)
			startWorker(t, c, client.WorkerConfig{
				Lease: 300 * time.Millisecond,
				Handler: func(ctx context.Context, _ *client.Task) ([]byte, error) {
					close(started)
					<-ctx.Done()
					causes <- context.Cause(ctx)
					return nil, ctx.Err()
				},
			})
			<-started
			if how == "cancel" {
				if err := c.Cancel(t.Context(), id); err != nil {
					t.Fatal(err)
				}
			} else {
				f.setInject(func(m string, _ proto.Message) error {
					if m == "Renew" {
						return failedPrecondition("claimId: superseded")
					}
					return nil
				})
			}
			select {
			case cause := <-causes:
				if !client.IsSuperseded(cause) || !errors.Is(cause, client.ErrSuperseded) {
					t.Fatalf("cause = %v", cause)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the handler's context was not cancelled")
			}
			time.Sleep(20 * time.Millisecond) // give a wrong settle call the time to show
			for _, m := range []string{"Complete", "Abort", "Yield"} {
				if n := f.count(m); n != 0 {
					t.Errorf("%d %s calls after the claim ended", n, m)
				}
			}
		})
	}
}

// TestWorkerLeaseExpired: when no renew succeeds before the lease runs
// out, the handler's context is cancelled with ErrLeaseExpired and its
// task given back.
func TestWorkerLeaseExpired(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	enqueue(t, c, spec("x"))
	f.setInject(func(m string, _ proto.Message) error {
		if m == "Renew" {
			return errUnavailable
		}
		return nil
	})
	causes := make(chan error, 1)
	var once sync.Once
	startWorker(t, c, client.WorkerConfig{
		Lease: 300 * time.Millisecond,
		Handler: func(ctx context.Context, _ *client.Task) ([]byte, error) {
			<-ctx.Done()
			once.Do(func() { causes <- context.Cause(ctx) })
			return nil, ctx.Err()
		},
	})
	select {
	case cause := <-causes:
		if !errors.Is(cause, client.ErrLeaseExpired) {
			t.Fatalf("cause = %v", cause)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context was not cancelled")
	}
	waitFor(t, "a yield", func() bool { return f.count("Yield") > 0 })
	if n := f.count("Abort"); n != 0 {
		t.Fatalf("%d aborts of a task whose lease ran out", n)
	}
}

// TestWorkerShutdownYields: cancelling Run's context cancels the running
// handlers (cause ErrShutdown) and yields their tasks with the progress
// they reported; Run returns nil after that.
func TestWorkerShutdownYields(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	var ids []uint64
	for range 3 {
		ids = append(ids, enqueue(t, c, spec("x")))
	}
	var started sync.WaitGroup
	started.Add(3)
	var shutdowns atomic.Int32
	stop := startWorker(t, c, client.WorkerConfig{
		Concurrency: 3,
		Handler: func(ctx context.Context, task *client.Task) ([]byte, error) {
			if err := task.Progress(ctx, 0.5, "half"); err != nil {
				return nil, err
			}
			started.Done()
			<-ctx.Done()
			if errors.Is(context.Cause(ctx), client.ErrShutdown) {
				shutdowns.Add(1)
			}
			return nil, ctx.Err()
		},
	})
	started.Wait()
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	for _, id := range ids {
		task := f.task(id)
		if task.GetStatus() != nornv1.TaskStatus_TASK_STATUS_READY || lastEnd(task) != nornv1.ClaimEnd_CLAIM_END_YIELDED ||
			task.GetProgress() != 0.5 {
			t.Errorf("task %d after shutdown: %v", id, task)
		}
	}
	if n := shutdowns.Load(); n != 3 {
		t.Errorf("%d handlers saw ErrShutdown, want 3", n)
	}
}

// TestWorkerConcurrency: no more than Concurrency handlers run at once,
// and the worker gets there.
func TestWorkerConcurrency(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	var ids []uint64
	for range 12 {
		ids = append(ids, enqueue(t, c, spec("x")))
	}
	var active, peak atomic.Int32
	startWorker(t, c, client.WorkerConfig{
		Concurrency: 3,
		Handler: func(ctx context.Context, _ *client.Task) ([]byte, error) {
			n := active.Add(1)
			defer active.Add(-1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			time.Sleep(20 * time.Millisecond)
			return nil, nil
		},
	})
	for _, id := range ids {
		waitStatus(t, f, id, nornv1.TaskStatus_TASK_STATUS_COMPLETED)
	}
	if p := peak.Load(); p > 3 || p < 2 {
		t.Fatalf("peak concurrency %d, want 2 or 3 (at most 3)", p)
	}
}

// TestWorkerStopsOnPermanentClaimError: a claim error retrying cannot fix
// stops the worker and comes back from Run; transient ones are retried.
func TestWorkerStopsOnPermanentClaimError(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	var n atomic.Int32
	bad := connect.NewError(connect.CodePermissionDenied, errors.New("no"))
	f.setInject(func(m string, _ proto.Message) error {
		if m != "Claim" {
			return nil
		}
		if n.Add(1) <= 2 {
			return errUnavailable
		}
		return bad
	})
	w, err := client.NewWorker(c, client.WorkerConfig{Queue: "q", Logger: quiet, Handler: func(context.Context, *client.Task) ([]byte, error) {
		return nil, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("Run = %v, want PERMISSION_DENIED", err)
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("%d claims, want 3", got)
	}
	if err := w.Run(t.Context()); err == nil {
		t.Fatal("a second Run succeeded")
	}
}

func TestWorkerConfigValidate(t *testing.T) {
	h := func(context.Context, *client.Task) ([]byte, error) { return nil, nil }
	for _, tc := range []struct {
		name string
		cfg  client.WorkerConfig
		ok   bool
	}{
		{"minimal", client.WorkerConfig{Queue: "q", Handler: h}, true},
		{"full", client.WorkerConfig{Queue: "q", Handler: h, Name: "w", Concurrency: 8, Lease: time.Second, Wait: time.Second}, true},
		{"no queue", client.WorkerConfig{Handler: h}, false},
		{"no handler", client.WorkerConfig{Queue: "q"}, false},
		{"negative concurrency", client.WorkerConfig{Queue: "q", Handler: h, Concurrency: -1}, false},
		{"huge concurrency", client.WorkerConfig{Queue: "q", Handler: h, Concurrency: 10_001}, false},
		{"tiny lease", client.WorkerConfig{Queue: "q", Handler: h, Lease: time.Millisecond}, false},
		{"negative wait", client.WorkerConfig{Queue: "q", Handler: h, Wait: -time.Second}, false},
	} {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestWorkerNeverCompletesAfterLosingItsLease: a handler that ignores its
// context and returns a result after the lease ran out (no renew got
// through) does not get its task completed: another worker may hold it
// by then. The worker gives the task back instead.
func TestWorkerNeverCompletesAfterLosingItsLease(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	enqueue(t, c, spec("x"))
	f.setInject(func(m string, _ proto.Message) error {
		if m == "Renew" {
			return errUnavailable
		}
		return nil
	})
	returned := make(chan struct{})
	var once sync.Once
	startWorker(t, c, client.WorkerConfig{
		Lease: 300 * time.Millisecond,
		Handler: func(ctx context.Context, _ *client.Task) ([]byte, error) {
			<-ctx.Done()
			time.Sleep(50 * time.Millisecond) // a handler slow to notice
			once.Do(func() { close(returned) })
			return []byte("done anyway"), nil
		},
	})
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context was not cancelled")
	}
	waitFor(t, "a yield", func() bool { return f.count("Yield") > 0 })
	if n := f.count("Complete") + f.count("CompleteBatch"); n != 0 {
		t.Fatalf("%d completions of a task whose lease ran out", n)
	}
}

// TestWorkerRenewsAtOnceAfterALongPoll: a claim granted at the end of a
// long poll that took most of the lease is renewed at once, not a third
// of a lease after the handler started (the worker counts the lease from
// the claim request's start, so it would otherwise believe it lost).
func TestWorkerRenewsAtOnceAfterALongPoll(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	var delayed atomic.Bool
	f.setInject(func(m string, _ proto.Message) error {
		if m == "Claim" && !delayed.Load() {
			delayed.Store(true)
			time.Sleep(2200 * time.Millisecond) // more than 2/3 of the 3 s lease
			enqueue(t, c, spec("x"))
		}
		return nil
	})
	causes := make(chan error, 1)
	var once sync.Once
	startWorker(t, c, client.WorkerConfig{
		Lease: 3 * time.Second,
		Wait:  5 * time.Second,
		Handler: func(ctx context.Context, _ *client.Task) ([]byte, error) {
			select {
			case <-ctx.Done():
				once.Do(func() { causes <- context.Cause(ctx) })
				return nil, ctx.Err()
			case <-time.After(1500 * time.Millisecond): // past the claim request's start + the lease
				once.Do(func() { causes <- nil })
				return []byte("ok"), nil
			}
		},
	})
	select {
	case cause := <-causes:
		if cause != nil {
			t.Fatalf("the handler was cancelled: %v", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not finish")
	}
	waitFor(t, "the completion", func() bool { return f.count("Complete")+f.count("CompleteBatch") > 0 })
}

// Client.Retry gives a dead task a new life.
func TestClientRetry(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	id := enqueue(t, c, &nornv1.TaskSpec{Queue: "q", Retry: &nornv1.RetryPolicy{MaxAttempts: 1}})
	ctx := context.Background()
	if _, err := c.Retry(ctx, id, 0); !client.IsSuperseded(err) {
		t.Fatalf("retry of a READY task: %v", err)
	}
	claimed, err := c.Claim(ctx, client.ClaimRequest{Queue: "q"})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v, %v", claimed, err)
	}
	if err := c.Fail(ctx, id, claimed[0].ClaimId); err != nil {
		t.Fatal(err)
	}
	if life, err := c.Retry(ctx, id, 0); err != nil || life != 1 {
		t.Fatalf("retry of the dead task: %d, %v", life, err)
	}
	task, err := c.GetTask(ctx, id)
	if err != nil || task.GetStatus() != nornv1.TaskStatus_TASK_STATUS_READY || task.GetLife() != 1 {
		t.Fatalf("after the retry: %v, %v", task, err)
	}
}
