package node

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

func TestLifecycle(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	id := h.enqueue(&nornv1.TaskSpec{Queue: "emails", Payload: []byte("hi")})
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_READY || string(got.Spec.Payload) != "hi" {
		t.Fatalf("after enqueue: %v", got)
	}
	c := h.claim("emails", 1, 30*time.Second)
	if len(c) != 1 || c[0].Task.Id != id || c[0].ClaimId == 0 {
		t.Fatalf("claim = %v", c)
	}
	claimID := c[0].ClaimId
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_CLAIMED || got.CurrentClaim.GetClaimId() != claimID {
		t.Fatalf("after claim: %v", got)
	}
	if more := h.claim("emails", 1, time.Second); len(more) != 0 {
		t.Fatalf("second claim of the only task: %v", more)
	}
	if _, err := h.api.Update(ctx, connect.NewRequest(&nornv1.UpdateRequest{Id: id, ClaimId: claimID, Seq: 1, Progress: 0.5, Message: "half"})); err != nil {
		t.Fatal(err)
	}
	h.clock.advance(10 * time.Second)
	r, err := h.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: id, ClaimId: claimID, Lease: durationpb.New(time.Minute)}))
	if err != nil || !r.Msg.Expiry.AsTime().Equal(h.clock.Now().Add(time.Minute)) {
		t.Fatalf("renew: %v, %v", r, err)
	}
	if got := h.get(id); got.Progress != 0.5 || len(got.Updates) != 1 {
		t.Fatalf("progress %v, updates %v", got.Progress, got.Updates)
	}
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: claimID, Result: []byte("done")})); err != nil {
		t.Fatal(err)
	}
	// A retried complete succeeds.
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: claimID, Result: []byte("done")})); err != nil {
		t.Fatalf("retried complete: %v", err)
	}
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED || string(got.Result) != "done" || got.Progress != 1 ||
		got.CurrentClaim != nil || len(got.Claims) != 1 || got.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_COMPLETED {
		t.Fatalf("after complete: %v", got)
	}
	if c := h.claim("emails", 1, time.Second); len(c) != 0 {
		t.Fatalf("completed task claimed again: %v", c)
	}
}

func TestPriorityThenFIFO(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	low1 := h.enqueue(&nornv1.TaskSpec{Queue: "q", Priority: 0})
	high := h.enqueue(&nornv1.TaskSpec{Queue: "q", Priority: 5})
	low2 := h.enqueue(&nornv1.TaskSpec{Queue: "q", Priority: 0})
	neg := h.enqueue(&nornv1.TaskSpec{Queue: "q", Priority: -3})
	var order []uint64
	for range 4 {
		c := h.claim("q", 1, time.Minute)
		if len(c) != 1 {
			t.Fatalf("claim returned %d tasks", len(c))
		}
		order = append(order, c[0].Task.Id)
	}
	want := []uint64{high, low1, low2, neg}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("claim order %v, want %v", order, want)
		}
	}
	// A batch claim returns in the same order.
	h2 := newHarness(t, t.TempDir(), nil)
	a := h2.enqueue(&nornv1.TaskSpec{Queue: "q"})
	b := h2.enqueue(&nornv1.TaskSpec{Queue: "q", Priority: 1})
	c := h2.claim("q", 10, time.Minute)
	if len(c) != 2 || c[0].Task.Id != b || c[1].Task.Id != a {
		t.Fatalf("batch claim %v", c)
	}
}

// Claims walk the heads of every partition in one order: with many tasks
// per partition (so each partition's head is read further several times)
// and claims of assorted sizes, the claimed sequence is exactly priority
// descending, then id ascending.
// TestClaimOrderAcrossPartitions checks the claim order against a
// reference model (see headMerger): every claim starts with the best head
// of all (priority, then age); it then stays in that head's partition
// while the partition's next head has the best priority left anywhere,
// and otherwise moves to the best head of all again.
func TestClaimOrderAcrossPartitions(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	rng := rand.New(rand.NewPCG(1, 2))
	specs := make([]*nornv1.TaskSpec, 400)
	for i := range specs {
		specs[i] = &nornv1.TaskSpec{Queue: "q", Priority: rng.Int32N(5) - 2}
	}
	r, err := h.api.EnqueueBatch(context.Background(), connect.NewRequest(&nornv1.EnqueueBatchRequest{Tasks: specs}))
	if err != nil {
		t.Fatal(err)
	}
	type head struct {
		prio int32
		id   uint64
	}
	better := func(a, b head) int { return cmp.Or(cmp.Compare(b.prio, a.prio), cmp.Compare(a.id, b.id)) }
	// The model: each partition's heads in order.
	parts := map[uint16][]head{}
	for i, id := range r.Msg.Ids {
		p := h.node.partition(id)
		parts[p] = append(parts[p], head{specs[i].Priority, id})
	}
	for _, hs := range parts {
		slices.SortFunc(hs, better)
	}
	best := func() (uint16, bool) {
		var bp uint16
		found := false
		for p, hs := range parts {
			if len(hs) > 0 && (!found || better(hs[0], parts[bp][0]) < 0) {
				bp, found = p, true
			}
		}
		return bp, found
	}
	modelClaim := func(size int) []head {
		var out []head
		sticky, ok := best()
		for ok && len(out) < size {
			b, _ := best()
			if hs := parts[sticky]; len(hs) == 0 || hs[0].prio != parts[b][0].prio {
				sticky = b
			}
			out = append(out, parts[sticky][0])
			parts[sticky] = parts[sticky][1:]
			_, ok = best()
		}
		slices.SortFunc(out, better) // Claim answers in claim order
		return out
	}
	claimed, single := 0, 0
	for size := uint32(1); claimed < len(specs); size = size%37 + 3 {
		want := modelClaim(int(size))
		c := h.claim("q", size, time.Minute)
		got := make([]head, len(c))
		inParts := map[uint16]bool{}
		for i, ct := range c {
			got[i] = head{ct.Task.Spec.Priority, ct.Task.Id}
			inParts[h.node.partition(ct.Task.Id)] = true
		}
		if !slices.Equal(got, want) {
			t.Fatalf("claim of %d after %d claimed: got %v, want %v", size, claimed, got, want)
		}
		if len(c) > 1 && len(inParts) == 1 {
			single++
		}
		claimed += len(c)
	}
	// The point of the order: batches come from one partition (one Raft
	// entry) when its priorities allow.
	if single == 0 {
		t.Fatal("no multi-task claim came from a single partition")
	}
}

func TestDelayedAndDependencies(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	later := h.enqueue(&nornv1.TaskSpec{Queue: "q", NotBefore: timestamppb.New(h.clock.Now().Add(time.Minute))})
	if got := h.get(later); got.Status != nornv1.TaskStatus_TASK_STATUS_DELAYED {
		t.Fatalf("status %v", got.Status)
	}
	dep := h.enqueue(&nornv1.TaskSpec{Queue: "deps"})
	child := h.enqueue(&nornv1.TaskSpec{Queue: "deps", Priority: 9, DependsOn: []uint64{dep}})
	if got := h.get(child); got.Status != nornv1.TaskStatus_TASK_STATUS_DELAYED {
		t.Fatalf("child of an unfinished dependency: %v", got.Status)
	}
	if c := h.claim("q", 1, time.Minute); len(c) != 0 {
		t.Fatalf("delayed task claimed early: %v", c)
	}
	c := h.claim("deps", 5, time.Minute)
	if len(c) != 1 || c[0].Task.Id != dep {
		t.Fatalf("claim with an unfinished dependency: %v", c)
	}
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: dep, ClaimId: c[0].ClaimId})); err != nil {
		t.Fatal(err)
	}
	if c := h.claim("deps", 5, time.Minute); len(c) != 1 || c[0].Task.Id != child {
		t.Fatalf("child after its dependency completed: %v", c)
	}
	h.clock.advance(time.Minute)
	h.node.dispatch.MonitorOnce()
	if c := h.claim("q", 1, time.Minute); len(c) != 1 || c[0].Task.Id != later {
		t.Fatalf("delayed task after its time: %v", c)
	}
	// A dependency must exist.
	_, err := h.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q", DependsOn: []uint64{12345}}}))
	wantCode(t, err, connect.CodeInvalidArgument)
	if !strings.Contains(err.Error(), "task.dependsOn[0]") {
		t.Fatalf("error does not name the field: %v", err)
	}
}

func TestRetentionDeletesTerminalTasks(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	done := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	c := h.claim("q", 1, time.Minute)
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: done, ClaimId: c[0].ClaimId})); err != nil {
		t.Fatal(err)
	}
	h.clock.advance(24 * time.Hour)
	cancelled := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: cancelled})); err != nil {
		t.Fatal(err)
	}
	live := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	h.clock.advance(6*24*time.Hour + time.Minute) // the first is past 7 days, the second not
	h.node.dispatch.MonitorOnce()
	_, err := h.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: done}))
	wantCode(t, err, connect.CodeNotFound)
	if rec, err := h.node.store.ClaimFSMRecord(h.node.partition(done), done); err == nil {
		t.Fatalf("claim record of a deleted task left: %x", rec)
	}
	if got := h.get(cancelled); got.Status != nornv1.TaskStatus_TASK_STATUS_CANCELLED {
		t.Fatalf("task within retention: %v", got.Status)
	}
	if got := h.get(live); got.Status != nornv1.TaskStatus_TASK_STATUS_READY {
		t.Fatalf("live task: %v", got.Status)
	}
}

func TestFailedDependencyAbortsDependant(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	dep := h.enqueue(&nornv1.TaskSpec{Queue: "parent"})
	child := h.enqueue(&nornv1.TaskSpec{Queue: "child", DependsOn: []uint64{dep}})
	if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: dep})); err != nil {
		t.Fatal(err)
	}
	if c := h.claim("child", 1, time.Minute); len(c) != 0 {
		t.Fatalf("dependant of a cancelled task claimed: %v", c)
	}
	got := h.get(child)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_ABORTED || got.Errors[0].Code != "dependency_failed" ||
		got.Errors[0].Args[0] != fmt.Sprint(dep) {
		t.Fatalf("dependant of a cancelled task: %v", got)
	}
}

func TestLeaseExpiryWaitsForSkewBuffer(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	c := h.claim("q", 1, 10*time.Second)
	h.clock.advance(10*time.Second + testSkew) // expiry + skew: not yet past it
	h.node.dispatch.MonitorOnce()
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_CLAIMED {
		t.Fatalf("expired at expiry + skew buffer: %v", got.Status)
	}
	if again := h.claim("q", 1, time.Second); len(again) != 0 {
		t.Fatalf("claimable before lease + skew: %v", again)
	}
	h.clock.advance(time.Millisecond)
	h.node.dispatch.MonitorOnce()
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_READY || got.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_EXPIRED {
		t.Fatalf("after lease + skew: %v", got)
	}
	c2 := h.claim("q", 1, 10*time.Second)
	if len(c2) != 1 || c2[0].ClaimId <= c[0].ClaimId || c2[0].Task.CurrentClaim.Seq != 2 {
		t.Fatalf("reclaim: %v", c2)
	}
	_, err := h.api.Renew(context.Background(), connect.NewRequest(&nornv1.RenewRequest{Id: id, ClaimId: c[0].ClaimId}))
	wantCode(t, err, connect.CodeFailedPrecondition)
}

func TestMaxClaimsAborts(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q", MaxClaims: 2})
	for i := range 2 {
		if c := h.claim("q", 1, time.Second); len(c) != 1 {
			t.Fatalf("claim %d: %v", i, c)
		}
		h.clock.advance(time.Second + testSkew + time.Millisecond)
		h.node.dispatch.MonitorOnce()
	}
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_ABORTED || len(got.Errors) != 1 || got.Errors[0].Code != "max_claims_exceeded" {
		t.Fatalf("after max_claims expiries: %v", got)
	}
	if c := h.claim("q", 1, time.Second); len(c) != 0 {
		t.Fatalf("dead task claimed: %v", c)
	}
}

func TestCancelWhileClaimed(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	c := h.claim("q", 1, time.Minute)
	if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: id})); err != nil {
		t.Fatal(err)
	}
	_, err := h.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: id, ClaimId: c[0].ClaimId}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	_, err = h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: c[0].ClaimId}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_CANCELLED || got.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_CANCELLED {
		t.Fatalf("after cancel and complete: %v", got)
	}
	// Cancel is idempotent.
	if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: id})); err != nil {
		t.Fatalf("second cancel: %v", err)
	}
}

func TestYieldAndAbort(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	c := h.claim("q", 1, time.Minute)
	if _, err := h.api.Yield(ctx, connect.NewRequest(&nornv1.YieldRequest{Id: id, ClaimId: c[0].ClaimId, Progress: 0.25})); err != nil {
		t.Fatal(err)
	}
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_READY || got.Progress != 0.25 ||
		got.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_YIELDED {
		t.Fatalf("after yield: %v", got)
	}
	c = h.claim("q", 1, time.Minute)
	_, err := h.api.Abort(ctx, connect.NewRequest(&nornv1.AbortRequest{Id: id, ClaimId: c[0].ClaimId,
		Errors: []*nornv1.TaskError{{Code: "bad_input", Description: "no", Args: []string{"x"}}}}))
	if err != nil {
		t.Fatal(err)
	}
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_ABORTED || got.Errors[0].Code != "bad_input" {
		t.Fatalf("after abort: %v", got)
	}
}

// TestConcurrentClaimsAreExclusive drains a queue with concurrent claimers:
// every task is granted exactly once.
func TestConcurrentClaimsAreExclusive(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	const tasks = 300
	specs := make([]*nornv1.TaskSpec, tasks)
	for i := range specs {
		specs[i] = &nornv1.TaskSpec{Queue: "q", Priority: int32(i % 4)}
	}
	if _, err := h.api.EnqueueBatch(context.Background(), connect.NewRequest(&nornv1.EnqueueBatchRequest{Tasks: specs})); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	granted := map[uint64]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				r, err := h.api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{
					Queue: "q", Worker: "w", Max: 7, Lease: durationpb.New(time.Minute)}))
				if err != nil {
					t.Error(err)
					return
				}
				if len(r.Msg.Tasks) == 0 {
					return
				}
				mu.Lock()
				for _, c := range r.Msg.Tasks {
					granted[c.Task.Id]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(granted) != tasks {
		t.Fatalf("%d tasks claimed, want %d", len(granted), tasks)
	}
	for id, n := range granted {
		if n != 1 {
			t.Fatalf("task %d granted %d times", id, n)
		}
	}
}

func TestLongPollWakesOnEnqueue(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	got := make(chan []*nornv1.ClaimedTask, 1)
	go func() {
		r, err := h.api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{
			Queue: "slow", Worker: "w", Wait: durationpb.New(30 * time.Second)}))
		if err != nil {
			t.Error(err)
		}
		got <- r.Msg.GetTasks()
	}()
	// Enqueue once the claim is waiting (it registered on the queue).
	for {
		waiting := h.node.waiters.Waiting("slow")
		if waiting {
			break
		}
		time.Sleep(time.Millisecond)
	}
	id := h.enqueue(&nornv1.TaskSpec{Queue: "slow"})
	select {
	case c := <-got:
		if len(c) != 1 || c[0].Task.Id != id {
			t.Fatalf("long poll returned %v", c)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("long poll did not wake on enqueue")
	}
}
