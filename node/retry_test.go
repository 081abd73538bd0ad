package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

func (h *harness) fail(id, claimID uint64, code string) {
	h.t.Helper()
	_, err := h.api.Abort(context.Background(), connect.NewRequest(&nornv1.AbortRequest{
		Id: id, ClaimId: claimID, Retry: true, Errors: []*nornv1.TaskError{{Code: code}}}))
	if err != nil {
		h.t.Fatal(err)
	}
}

// claimIDs claims from queue after a monitor pass (which promotes the
// delayed tasks whose time came) and returns the tasks' ids.
func (h *harness) claimAfterPass(queue string) []*nornv1.ClaimedTask {
	h.t.Helper()
	h.node.dispatch.MonitorOnce()
	return h.claim(queue, 10, time.Minute)
}

// A failed attempt delays its task by its backoff, growing by the
// multiplier; nothing claims it before; the last allowed attempt makes
// it DEAD, with every attempt's error; a task in its backoff keeps it
// across a restart.
func TestRetryBackoffThenDead(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, nil)
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q", Retry: &nornv1.RetryPolicy{
		MaxAttempts: 3, InitialBackoff: durationpb.New(10 * time.Second), MaxBackoff: durationpb.New(time.Minute), Multiplier: 2}})
	c := h.claim("q", 1, time.Minute)
	if len(c) != 1 {
		t.Fatalf("first claim: %v", c)
	}
	start := h.clock.Now()
	h.fail(id, c[0].ClaimId, "boom")
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_DELAYED || got.FailedAttempts != 1 ||
		!got.RetryAt.AsTime().Equal(start.Add(10*time.Second)) || got.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_FAILED {
		t.Fatalf("after the first failure: %v", got)
	}
	if len(got.Errors) != 1 || got.Errors[0].Code != "boom" || got.Errors[0].Attempt != 1 {
		t.Fatalf("errors after the first failure: %v", got.Errors)
	}
	h.clock.advance(10*time.Second - time.Millisecond)
	if c := h.claimAfterPass("q"); len(c) != 0 {
		t.Fatalf("claimed before the backoff ended: %v", c)
	}
	// Across a restart the task is still in its backoff.
	clock := h.clock
	h.close()
	h = newHarness(t, dir, clock)
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_DELAYED {
		t.Fatalf("after a restart: %v", got)
	}
	if c := h.claimAfterPass("q"); len(c) != 0 {
		t.Fatalf("claimed before the backoff ended, after a restart: %v", c)
	}
	h.clock.advance(time.Millisecond)
	c = h.claimAfterPass("q")
	if len(c) != 1 || c[0].Task.Id != id {
		t.Fatalf("claim at the backoff's end: %v", c)
	}
	h.fail(id, c[0].ClaimId, "boom2")
	if got := h.get(id); !got.RetryAt.AsTime().Equal(h.clock.Now().Add(20 * time.Second)) {
		t.Fatalf("second backoff: %v, want 20 s", got.RetryAt.AsTime().Sub(h.clock.Now()))
	}
	h.clock.advance(20 * time.Second)
	c = h.claimAfterPass("q")
	if len(c) != 1 {
		t.Fatalf("third claim: %v", c)
	}
	h.fail(id, c[0].ClaimId, "boom3")
	got = h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_DEAD || got.FailedAttempts != 3 || got.FinishedAt == nil {
		t.Fatalf("after the last attempt: %v", got)
	}
	var codes []string
	for _, e := range got.Errors {
		codes = append(codes, e.Code)
	}
	if len(codes) != 4 || codes[0] != "boom" || codes[2] != "boom3" || codes[3] != "max_attempts_exceeded" || got.Errors[2].Attempt != 3 {
		t.Fatalf("errors of the dead task: %v", got.Errors)
	}
	h.clock.advance(time.Hour)
	if c := h.claimAfterPass("q"); len(c) != 0 {
		t.Fatalf("a dead task was claimed: %v", c)
	}
	counts, err := h.api.CountTasks(context.Background(), connect.NewRequest(&nornv1.CountTasksRequest{Queue: "q"}))
	if err != nil || counts.Msg.ByStatus["DEAD"] != 1 {
		t.Fatalf("counts: %v, %v", counts, err)
	}
	// A failure of a dead task's claim again is the same answer (a retry).
	_, err = h.api.Abort(context.Background(), connect.NewRequest(&nornv1.AbortRequest{
		Id: id, ClaimId: c[0].ClaimId, Retry: true, Errors: []*nornv1.TaskError{{Code: "boom3"}}}))
	if err != nil {
		t.Fatalf("the last failure again: %v", err)
	}
}

// A lease that runs out is a failed attempt of a task with a retry
// policy: its backoff and its error (lease_expired) as a worker's.
func TestRetryAfterExpiry(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q", Retry: &nornv1.RetryPolicy{MaxAttempts: 2, InitialBackoff: durationpb.New(time.Minute)}})
	c := h.claim("q", 1, time.Second)
	h.clock.advance(time.Second + testSkew + time.Millisecond)
	h.node.dispatch.MonitorOnce()
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_DELAYED || got.FailedAttempts != 1 || len(got.Errors) != 1 ||
		got.Errors[0].Code != "lease_expired" || got.Errors[0].Attempt != 1 {
		t.Fatalf("after the expiry: %v", got)
	}
	if _, err := h.api.Renew(context.Background(), connect.NewRequest(&nornv1.RenewRequest{Id: id, ClaimId: c[0].ClaimId})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("renew of the expired claim: %v", err)
	}
	h.clock.advance(time.Minute)
	c = h.claimAfterPass("q")
	if len(c) != 1 {
		t.Fatalf("claim after the backoff: %v", c)
	}
	h.clock.advance(time.Minute + testSkew + time.Millisecond)
	h.node.dispatch.MonitorOnce()
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_DEAD {
		t.Fatalf("after the second expiry: %v", got)
	}
}

// A task without a policy fails under the node's default (1 s, jitter
// 0.2); with max_claims, that many attempts.
func TestRetryDefaultPolicy(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q", MaxClaims: 1})
	c := h.claim("q", 1, time.Minute)
	h.fail(id, c[0].ClaimId, "boom")
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_DEAD {
		t.Fatalf("max_claims 1, one failure: %v", got)
	}
	id = h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	c = h.claim("q", 1, time.Minute)
	h.fail(id, c[0].ClaimId, "boom")
	got := h.get(id)
	wait := got.RetryAt.AsTime().Sub(h.clock.Now())
	if got.Status != nornv1.TaskStatus_TASK_STATUS_DELAYED || wait < 800*time.Millisecond || wait > time.Second {
		t.Fatalf("default backoff %v: %v", wait, got)
	}
}

// Bad retry policies are refused, naming the field.
func TestRetryPolicyValidation(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	for field, p := range map[string]*nornv1.RetryPolicy{
		"task.retry.initialBackoff": {InitialBackoff: durationpb.New(-time.Second)},
		"task.retry.maxBackoff":     {InitialBackoff: durationpb.New(time.Minute), MaxBackoff: durationpb.New(time.Second)},
		"task.retry.multiplier":     {Multiplier: 0.5},
		"task.retry.jitter":         {Jitter: 1.5},
	} {
		_, err := h.api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q", Retry: p}}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
	}
	_, err := h.api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{
		Queue: "q", MaxClaims: 2, Retry: &nornv1.RetryPolicy{MaxAttempts: 3}}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "task.maxClaims") {
		t.Errorf("max_claims unlike max_attempts: %v", err)
	}
}

// Retry gives a DEAD or CANCELLED task a new life: READY again with a
// fresh budget, its history kept; a second Retry of the same life changes
// nothing; a COMPLETED or live task is refused.
func TestRetryRevivesTerminalTasks(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	retry := func(id uint64, life *uint32) (*nornv1.RetryResponse, error) {
		r, err := h.api.Retry(ctx, connect.NewRequest(&nornv1.RetryRequest{Id: id, Life: life}))
		if err != nil {
			return nil, err
		}
		return r.Msg, nil
	}
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q", Retry: &nornv1.RetryPolicy{MaxAttempts: 1}})
	c := h.claim("q", 1, time.Minute)
	h.fail(id, c[0].ClaimId, "boom")
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_DEAD || got.Life != 0 {
		t.Fatalf("before the retry: %v", got)
	}
	if _, err := retry(id+1<<20, nil); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("retry of a task that does not exist: %v", err)
	}
	r, err := retry(id, nil)
	if err != nil || r.Life != 1 {
		t.Fatalf("retry of the dead task: %v, %v", r, err)
	}
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_READY || got.Life != 1 || got.FailedAttempts != 0 || got.FinishedAt != nil ||
		len(got.Errors) != 1 || got.Errors[0].Code != "boom" || len(got.Claims) != 1 {
		t.Fatalf("after the retry: %v", got)
	}
	zero := uint32(0)
	if r, err := retry(id, &zero); err != nil || r.Life != 1 {
		t.Fatalf("the retry again (life 0): %v, %v", r, err)
	}
	if _, err := retry(id, nil); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("retry of a READY task: %v", err)
	}
	if got := h.get(id); got.Life != 1 {
		t.Fatalf("a refused retry changed the life: %v", got)
	}
	c = h.claim("q", 1, time.Minute)
	if len(c) != 1 || c[0].Task.Id != id {
		t.Fatalf("claim of the retried task: %v", c)
	}
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: c[0].ClaimId})); err != nil {
		t.Fatal(err)
	}
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED || got.Life != 1 {
		t.Fatalf("completed in its second life: %v", got)
	}
	if _, err := retry(id, nil); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "COMPLETED") {
		t.Fatalf("retry of a completed task: %v", err)
	}
	// A task cancelled before any claim (the claim FSM has no record of
	// it yet) is retried too.
	cancelled := h.enqueue(&nornv1.TaskSpec{Queue: "c"})
	if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: cancelled})); err != nil {
		t.Fatal(err)
	}
	if r, err := retry(cancelled, nil); err != nil || r.Life != 1 {
		t.Fatalf("retry of a cancelled task: %v, %v", r, err)
	}
	if c := h.claim("c", 1, time.Minute); len(c) != 1 || c[0].Task.Id != cancelled {
		t.Fatalf("claim of the retried cancelled task: %v", c)
	}
	counts, err := h.api.CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{}))
	if err != nil || counts.Msg.ByStatus["DEAD"] != 0 || counts.Msg.ByStatus["CANCELLED"] != 0 || counts.Msg.ByStatus["COMPLETED"] != 1 || counts.Msg.ByStatus["CLAIMED"] != 1 {
		t.Fatalf("counts after the retries: %v, %v", counts, err)
	}
	// Across a restart the lives hold.
	clock := h.clock
	h.close()
	h = newHarness(t, h.dir, clock)
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED || got.Life != 1 {
		t.Fatalf("after a restart: %v", got)
	}
}
