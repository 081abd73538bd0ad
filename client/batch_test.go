package client_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// enqueueAll runs n concurrent Enqueue calls, call i with payload "p<i>"
// and the options opts(i), and returns their ids and errors.
func enqueueAll(ctx context.Context, c *client.Client, n int, opts func(i int) []client.EnqueueOption) ([]uint64, []error) {
	ids := make([]uint64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var o []client.EnqueueOption
			if opts != nil {
				o = opts(i)
			}
			ids[i], errs[i] = c.Enqueue(ctx, spec(fmt.Sprint("p", i)), o...)
		})
	}
	wg.Wait()
	return ids, errs
}

// checkOwnTasks checks that every caller got the id of its own task.
func checkOwnTasks(t *testing.T, f *fakeServer, ids []uint64, errs []error) {
	t.Helper()
	seen := map[uint64]bool{}
	for i, id := range ids {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if seen[id] {
			t.Fatalf("id %d returned twice", id)
		}
		seen[id] = true
		if got := string(f.task(id).GetSpec().GetPayload()); got != fmt.Sprint("p", i) {
			t.Fatalf("call %d got id %d, whose payload is %q", i, id, got)
		}
	}
}

// TestBatchingCoalesces: concurrent enqueues share a few EnqueueBatch
// calls, and each caller gets the id of its own task.
func TestBatchingCoalesces(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithEnqueueBatching(50*time.Millisecond, 1000))
	ids, errs := enqueueAll(t.Context(), c, 200, nil)
	checkOwnTasks(t, f, ids, errs)
	if n := f.count("Enqueue"); n != 0 {
		t.Errorf("%d single Enqueue calls, want 0", n)
	}
	if n := f.count("EnqueueBatch"); n > 3 {
		t.Errorf("%d EnqueueBatch calls for 200 enqueues, want at most 3", n)
	}
}

// TestBatchingMaxBatch: a batch is sent as soon as it is full; the rest
// waits for the linger.
func TestBatchingMaxBatch(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithEnqueueBatching(300*time.Millisecond, 10))
	ids, errs := enqueueAll(t.Context(), c, 25, nil)
	checkOwnTasks(t, f, ids, errs)
	f.mu.Lock()
	sizes := slices.Clone(f.batches)
	f.mu.Unlock()
	if len(sizes) < 3 || slices.Max(sizes) > 10 {
		t.Fatalf("batch sizes %v: want at least 3 batches of at most 10", sizes)
	}
}

// TestBatchingKeepsIDs: callers that give an id keep it; the others get
// server-assigned ids in the same batch.
func TestBatchingKeepsIDs(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithEnqueueBatching(50*time.Millisecond, 1000))
	ids, errs := enqueueAll(t.Context(), c, 20, func(i int) []client.EnqueueOption {
		if i%2 == 0 {
			return []client.EnqueueOption{client.WithID(uint64(1000 + i))}
		}
		return nil
	})
	checkOwnTasks(t, f, ids, errs)
	for i := 0; i < 20; i += 2 {
		if ids[i] != uint64(1000+i) {
			t.Fatalf("call %d got id %d, want its own %d", i, ids[i], 1000+i)
		}
	}
}

// TestBatchingRetryReusesIDs: a batch that missed its quorum is resent
// with the ids of its WriteFailure, so no task is stored twice.
func TestBatchingRetryReusesIDs(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithEnqueueBatching(50*time.Millisecond, 1000))
	var fails atomic.Int32
	f.setFailWrite(func(string) bool { return fails.Add(1) == 1 })
	ids, errs := enqueueAll(t.Context(), c, 30, nil)
	checkOwnTasks(t, f, ids, errs)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tasks) != 30 {
		t.Fatalf("%d tasks stored, want 30", len(f.tasks))
	}
	if len(f.reqIDs) < 2 || len(f.reqIDs[0]) != 0 || !allNonZero(f.reqIDs[1]) {
		t.Fatalf("request ids %v: want a first batch without ids, then the retry with ids", f.reqIDs)
	}
}

func allNonZero(ids []uint64) bool {
	return len(ids) > 0 && !slices.Contains(ids, 0)
}

// TestBatchingBadTaskFailsAlone: a batch rejected because of one bad task
// is resent task by task, so only that task's caller sees the error.
func TestBatchingBadTaskFailsAlone(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithEnqueueBatching(50*time.Millisecond, 1000))
	const bad = 3
	ids := make([]uint64, 10)
	errs := make([]error, 10)
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			s := spec(fmt.Sprint("p", i))
			if i == bad {
				s.Queue = ""
			}
			ids[i], errs[i] = c.Enqueue(t.Context(), s)
		})
	}
	wg.Wait()
	if !errors.Is(errs[bad], client.ErrInvalidArgument) || ids[bad] != 0 {
		t.Fatalf("bad task: %d, %v; want INVALID_ARGUMENT", ids[bad], errs[bad])
	}
	errs[bad] = nil
	ids = slices.Delete(ids, bad, bad+1)
	errs = slices.Delete(errs, bad, bad+1)
	for i, id := range ids {
		if errs[i] != nil || f.task(id) == nil {
			t.Fatalf("good task %d: %d, %v", i, id, errs[i])
		}
	}
}

// TestBatchingAllFail: a batch that keeps missing its quorum fails every
// caller with UNAVAILABLE and the caller's own id.
func TestBatchingAllFail(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithEnqueueBatching(50*time.Millisecond, 1000))
	f.setFailWrite(func(string) bool { return true })
	ids, errs := enqueueAll(t.Context(), c, 10, nil)
	for i := range ids {
		if !client.IsUnavailable(errs[i]) || ids[i] == 0 {
			t.Fatalf("call %d: %d, %v; want its id and UNAVAILABLE", i, ids[i], errs[i])
		}
		if got := string(f.task(ids[i]).GetSpec().GetPayload()); got != fmt.Sprint("p", i) {
			t.Fatalf("call %d got id %d of payload %q", i, ids[i], got)
		}
	}
}

// TestBatchingCallerGivesUp: a caller whose context ends while it waits
// for its batch returns at once, and is left out of the batch.
func TestBatchingCallerGivesUp(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithEnqueueBatching(300*time.Millisecond, 1000))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Enqueue(ctx, spec("late"))
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Enqueue: %v", err)
	}
	if d := time.Since(start); d > 250*time.Millisecond {
		t.Fatalf("Enqueue returned after %v", d)
	}
	c.Close() // sends the open batch (nothing left in it)
	if n := f.count("Enqueue") + f.count("EnqueueBatch"); n != 0 {
		t.Fatalf("%d enqueue calls for a caller that gave up", n)
	}
}

// TestBatchingClose: Close sends the open batch at once (no linger), and
// later enqueues fail with ErrClosed.
func TestBatchingClose(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithEnqueueBatching(time.Minute, 1000))
	start := time.Now()
	done := make(chan struct{})
	var ids []uint64
	var errs []error
	go func() {
		ids, errs = enqueueAll(t.Context(), c, 5, nil)
		close(done)
	}()
	time.Sleep(20 * time.Millisecond) // let the calls join the batch (not needed for correctness)
	c.Close()
	<-done
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
	for i := range ids {
		if errs[i] == nil {
			if string(f.task(ids[i]).GetSpec().GetPayload()) != fmt.Sprint("p", i) {
				t.Fatalf("call %d: wrong task", i)
			}
		} else if !errors.Is(errs[i], client.ErrClosed) {
			t.Fatalf("call %d: %v", i, errs[i])
		}
	}
	if _, err := c.Enqueue(t.Context(), spec("x")); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Enqueue after Close: %v", err)
	}
}

// TestBatchingQuorums: calls with different write quorums go in different
// batches, each with its quorum.
func TestBatchingQuorums(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithEnqueueBatching(50*time.Millisecond, 1000), client.WithDefaultQuorum(2))
	var ws sync.Map
	f.setInject(func(m string, req proto.Message) error {
		if r, ok := req.(*nornv1.EnqueueBatchRequest); ok {
			ws.Store(r.GetW(), len(r.GetTasks()))
		}
		return nil
	})
	ids, errs := enqueueAll(t.Context(), c, 10, func(i int) []client.EnqueueOption {
		if i < 4 {
			return []client.EnqueueOption{client.WithQuorum(1)}
		}
		return nil
	})
	checkOwnTasks(t, f, ids, errs)
	n1, _ := ws.Load(uint32(1))
	n2, _ := ws.Load(uint32(2))
	if n1 != 4 || n2 != 6 {
		t.Fatalf("batch sizes by quorum: w=1 %v, w=2 %v; want 4 and 6", n1, n2)
	}
}

// TestCompleteBatching: concurrent completes share CompleteBatch calls,
// each caller gets its own outcome (a stale claim fails alone, as
// ErrSuperseded), and the results reach the right tasks.
func TestCompleteBatching(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithCompleteBatching(50*time.Millisecond, 1000))
	ctx := t.Context()
	const n = 50
	for i := range n {
		if _, err := c.Enqueue(ctx, spec(fmt.Sprint("p", i))); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.Claim(ctx, client.ClaimRequest{Queue: "q", Max: n, Lease: time.Minute})
	if err != nil || len(got) != n {
		t.Fatalf("Claim = %d tasks, %v", len(got), err)
	}
	const stale = 7 // this caller completes with a wrong claim id
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, ct := range got {
		claim := ct.GetClaimId()
		if i == stale {
			claim += 1000
		}
		wg.Go(func() {
			errs[i] = c.Complete(ctx, ct.GetTask().GetId(), claim, []byte(fmt.Sprint("r", i)))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if i == stale {
			if !errors.Is(err, client.ErrSuperseded) || !strings.Contains(err.Error(), "claimId") {
				t.Errorf("stale complete: %v, want ErrSuperseded naming claimId", err)
			}
			continue
		}
		if err != nil {
			t.Errorf("complete %d: %v", i, err)
		}
		task := f.task(got[i].GetTask().GetId())
		if task.GetStatus() != nornv1.TaskStatus_TASK_STATUS_COMPLETED || string(task.GetResult()) != fmt.Sprint("r", i) {
			t.Errorf("task of complete %d: %v, result %q", i, task.GetStatus(), task.GetResult())
		}
	}
	if k := f.count("Complete"); k != 0 {
		t.Errorf("%d single Complete calls, want 0", k)
	}
	if k := f.count("CompleteBatch"); k == 0 || k > 3 {
		t.Errorf("%d CompleteBatch calls for %d completes, want 1 to 3", k, n)
	}
	if st := f.task(got[stale].GetTask().GetId()).GetStatus(); st != nornv1.TaskStatus_TASK_STATUS_CLAIMED {
		t.Errorf("task of the stale complete is %v, want still CLAIMED", st)
	}
}

// TestCompleteBatchingRetriesWholeBatch: a batch that fails with
// UNAVAILABLE is sent again whole (completes are idempotent).
func TestCompleteBatchingRetriesWholeBatch(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithCompleteBatching(20*time.Millisecond, 1000),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, BaseBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))
	ctx := t.Context()
	a, b := claimOne(t, c), claimOne(t, c)
	f.setInject(failFirst("CompleteBatch", 1, errUnavailable))
	var wg sync.WaitGroup
	for _, ct := range []*nornv1.ClaimedTask{a, b} {
		wg.Go(func() {
			if err := c.Complete(ctx, ct.GetTask().GetId(), ct.GetClaimId(), nil); err != nil {
				t.Errorf("complete: %v", err)
			}
		})
	}
	wg.Wait()
	if k := f.count("CompleteBatch"); k != 2 {
		t.Errorf("%d CompleteBatch calls, want 2 (one failed, one retry)", k)
	}
}

// TestInflightBatching: by default, a lone Enqueue goes out at once as an
// Enqueue of its own, and so do calls made while fewer than
// maxInflightBatches (4) are in flight; calls made while that many are
// in flight wait for one of them and then go together in one
// EnqueueBatch, each caller with its own task.
func TestInflightBatching(t *testing.T) {
	const inflight = 4 // client.maxInflightBatches
	f := newFakeT(t)
	c := newClient(t, f.addr)
	ctx := t.Context()
	if _, err := c.Enqueue(ctx, spec("alone")); err != nil {
		t.Fatal(err)
	}
	if f.count("Enqueue") != 1 || f.count("EnqueueBatch") != 0 {
		t.Fatalf("a lone enqueue made %d Enqueue and %d EnqueueBatch calls, want 1 and 0", f.count("Enqueue"), f.count("EnqueueBatch"))
	}

	// Hold the next Enqueue calls in the server until every other caller
	// waits.
	entered, release := make(chan struct{}, inflight), make(chan struct{})
	f.setInject(func(method string, _ proto.Message) error {
		if method == "Enqueue" {
			entered <- struct{}{}
			<-release
		}
		return nil
	})
	const n = 20
	ids, errs := make([]uint64, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range inflight {
		wg.Go(func() { ids[i], errs[i] = c.Enqueue(ctx, spec(fmt.Sprint("p", i))) })
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			close(release)
			t.Fatalf("call %d did not reach the server while %d were in flight", i, i)
		}
	}
	for i := inflight; i < n; i++ {
		wg.Go(func() { ids[i], errs[i] = c.Enqueue(ctx, spec(fmt.Sprint("p", i))) })
	}
	// Every caller waits: the held ones for their answers, the others
	// queued behind them.
	waitFor(t, "20 callers waiting", func() bool { return coalescerWaiters() == n })
	if k := f.count("Enqueue") + f.count("EnqueueBatch"); k != 1+inflight {
		t.Errorf("%d calls reached the server while %d were in flight, want %d (the lone one and the held ones)", k, inflight, 1+inflight)
	}
	close(release)
	wg.Wait()
	checkOwnTasks(t, f, ids, errs)
	if f.count("Enqueue") != 1+inflight || f.count("EnqueueBatch") != 1 {
		t.Errorf("%d Enqueue and %d EnqueueBatch calls in all, want %d and 1 (the %d queued calls together)", f.count("Enqueue"), f.count("EnqueueBatch"), 1+inflight, n-inflight)
	}
}

// coalescerWaiters counts the goroutines waiting for the outcome of a
// batched call.
func coalescerWaiters() int { return inStacks("client.(*coalescer[...]).wait(") }
