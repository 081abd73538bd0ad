package node

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
	"github.com/norn-dev/norn/transport"
)

// TestWorkerLifecycle runs the client library's Worker against a real node
// over HTTP/2: tasks that succeed complete with their result, a task whose
// handler fails for good (client.Permanent) aborts with its code, a task
// whose handler fails otherwise is retried after its backoff and then
// completes, keeping the failed attempt's error, a task cancelled while running has its
// handler's context cancelled (learned through a failed renew) and stays
// CANCELLED, and shutdown yields a task still held.
//
// It runs twice: the client's calls through connect (gRPC over HTTP/2),
// then with the hot ones framed on the API port (transport.SplitListener,
// as nornd serves them), which must answer alike.
func TestWorkerLifecycle(t *testing.T) {
	t.Run("connect", func(t *testing.T) {
		h := newHarness(t, t.TempDir(), nil)
		c, err := client.New(h.srv.URL, client.WithHTTPClient(h.hc))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		workerLifecycle(t, c, h)
	})
	t.Run("framed", func(t *testing.T) {
		h := newHarness(t, t.TempDir(), nil)
		addr, framedCalls := serveSplit(t, h.node)
		c, err := client.New(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		workerLifecycle(t, c, h)
		// Enqueue, claims, renews (progress), completes, the abort's
		// claim: at least the 5 enqueues and 2 completes went framed.
		if n := framedCalls.Load(); n < 7 {
			t.Fatalf("%d framed calls, want at least 7", n)
		}
	})
}

// serveSplit serves n's API on a port of its own as nornd does: HTTP and
// the framed client calls on one listener. It returns the address and the
// count of framed calls answered.
func serveSplit(t *testing.T, n *Node) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rest, framed := transport.SplitListener(ln)
	calls := new(atomic.Int64)
	handler := n.ClientRPCHandler()
	rpc := transport.ServeRPCListener(framed, 0, func(ctx context.Context, m transport.RPCMethod, meta transport.RPCMeta, body []byte) ([]byte, error) {
		calls.Add(1)
		return handler(ctx, m, meta, body)
	}, nil)
	srv := &http.Server{Handler: n.Handler(), Protocols: serverProtocols(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(rest) //nolint:errcheck // stops with Close
	t.Cleanup(func() {
		n.StopWaiting()
		srv.Close()
		rpc.Close()
	})
	return ln.Addr().String(), calls
}

func workerLifecycle(t *testing.T, c *client.Client, h *harness) {
	t.Helper()
	ctx := context.Background()
	// The harness's monitor runs when told: here every 50 ms, so that a
	// retried task's backoff ends (the node's clock is the harness's,
	// moved along with the passes).
	stopPasses, passesDone := make(chan struct{}), make(chan struct{})
	defer func() { close(stopPasses); <-passesDone }()
	go func() {
		defer close(passesDone)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopPasses:
				return
			case <-tick.C:
				h.clock.advance(50 * time.Millisecond)
				h.node.dispatch.MonitorOnce()
			}
		}
	}()
	var ids []uint64
	for _, p := range []string{"ok-1", "ok-2", "fail", "cancel-me", "hold", "retry"} {
		id, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "work", Payload: []byte(p),
			Retry: &nornv1.RetryPolicy{MaxAttempts: 3, InitialBackoff: durationpb.New(100 * time.Millisecond)}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	var mu sync.Mutex
	started := map[string]chan struct{}{"cancel-me": make(chan struct{}), "hold": make(chan struct{})}
	cancelled := make(chan error, 1)
	w, err := client.NewWorker(c, client.WorkerConfig{
		Queue: "work", Name: "test-worker", Concurrency: 5, Lease: 3 * time.Second, Wait: time.Second,
		Handler: func(ctx context.Context, task *client.Task) ([]byte, error) {
			p := string(task.Payload)
			switch {
			case strings.HasPrefix(p, "ok"):
				if err := task.Progress(ctx, 0.5, "half"); err != nil {
					return nil, err
				}
				return []byte("result-" + p), nil
			case p == "fail":
				return nil, client.Permanent(&client.TaskError{Code: "bad_payload", Description: "cannot do it"})
			case p == "retry" && task.Info.GetFailedAttempts() == 0:
				return nil, errors.New("transient trouble")
			case p == "retry":
				return []byte("retried"), nil
			default:
				mu.Lock()
				close(started[p])
				mu.Unlock()
				<-ctx.Done()
				if p == "cancel-me" {
					cancelled <- context.Cause(ctx)
				}
				return nil, ctx.Err()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()

	<-started["cancel-me"]
	if err := c.Cancel(ctx, ids[3]); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-cancelled:
		if !errors.Is(cause, client.ErrSuperseded) {
			t.Fatalf("handler of a cancelled task stopped with %v, want ErrSuperseded", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("handler of a cancelled task was not stopped")
	}
	// Wait for the quick tasks to settle, then shut the worker down while
	// it holds "hold".
	<-started["hold"]
	waitStatus(t, c, ids[0], nornv1.TaskStatus_TASK_STATUS_COMPLETED)
	waitStatus(t, c, ids[1], nornv1.TaskStatus_TASK_STATUS_COMPLETED)
	waitStatus(t, c, ids[2], nornv1.TaskStatus_TASK_STATUS_ABORTED)
	waitStatus(t, c, ids[5], nornv1.TaskStatus_TASK_STATUS_COMPLETED)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for i, want := range map[int]string{0: "result-ok-1", 1: "result-ok-2"} {
		task, err := c.GetTask(ctx, ids[i])
		if err != nil || string(task.Result) != want || task.Progress != 1 || task.Claims[0].Worker != "test-worker" {
			t.Fatalf("task %d: %v, %v", i, task, err)
		}
	}
	if task, _ := c.GetTask(ctx, ids[2]); task.Errors[0].Code != "bad_payload" {
		t.Fatalf("failed task errors: %v", task.Errors)
	}
	if task, _ := c.GetTask(ctx, ids[5]); len(task.Errors) != 1 || task.Errors[0].Code != client.CodeHandlerError ||
		task.Errors[0].Description != "transient trouble" || task.Errors[0].Attempt != 1 || string(task.Result) != "retried" ||
		task.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_FAILED {
		t.Fatalf("retried task: %v", task)
	}
	if task, _ := c.GetTask(ctx, ids[3]); task.Status != nornv1.TaskStatus_TASK_STATUS_CANCELLED {
		t.Fatalf("cancelled task: %v", task.Status)
	}
	held, _ := c.GetTask(ctx, ids[4])
	if held.Status != nornv1.TaskStatus_TASK_STATUS_READY || held.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_YIELDED {
		t.Fatalf("task held at shutdown: %v", held)
	}
}

func waitStatus(t *testing.T, c *client.Client, id uint64, want nornv1.TaskStatus) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		task, err := c.GetTask(context.Background(), id)
		if err == nil && task.Status == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %d: status %v (%v), want %v", id, task.GetStatus(), err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
