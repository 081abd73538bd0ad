package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// A task not completed by its deadline ends CANCELLED with the error
// code "deadline", whether it was ready, delayed (by a dependency) or
// claimed; at the deadline, before the monitor's pass, nothing claims,
// renews or completes it; a task completed before stands.
func TestDeadlineInEachState(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	t0 := h.clock.Now()
	dl := timestamppb.New(t0.Add(10 * time.Second))
	ready := h.enqueue(&nornv1.TaskSpec{Queue: "q", Deadline: dl})
	plain := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	blocker := h.enqueue(&nornv1.TaskSpec{Queue: "blockers"})
	waiting := h.enqueue(&nornv1.TaskSpec{Queue: "q", DependsOn: []uint64{blocker}, Deadline: dl})
	claimed := h.enqueue(&nornv1.TaskSpec{Queue: "c", Deadline: dl})
	done := h.enqueue(&nornv1.TaskSpec{Queue: "d", Deadline: dl})
	if got := h.get(ready).Spec.Deadline; !got.AsTime().Equal(dl.AsTime()) {
		t.Fatalf("the task's deadline reads %v, want %v", got, dl)
	}
	c := h.claim("c", 1, time.Minute)
	d := h.claim("d", 1, time.Minute)
	if len(c) != 1 || c[0].Task.Id != claimed || len(d) != 1 || d[0].Task.Id != done {
		t.Fatalf("claims before the deadline: %v, %v", c, d)
	}
	h.clock.advance(5 * time.Second)
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: done, ClaimId: d[0].ClaimId})); err != nil {
		t.Fatalf("complete before the deadline: %v", err)
	}
	h.clock.advance(5*time.Second - time.Millisecond)
	h.node.dispatch.MonitorOnce()
	renew := func() error {
		_, err := h.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: claimed, ClaimId: c[0].ClaimId, Lease: durationpb.New(time.Minute)}))
		return err
	}
	if err := renew(); err != nil {
		t.Fatalf("renew a millisecond before the deadline: %v", err)
	}
	for id, want := range map[uint64]nornv1.TaskStatus{ready: nornv1.TaskStatus_TASK_STATUS_READY,
		waiting: nornv1.TaskStatus_TASK_STATUS_DELAYED, claimed: nornv1.TaskStatus_TASK_STATUS_CLAIMED} {
		if got := h.get(id).Status; got != want {
			t.Fatalf("task %d before its deadline: %v, want %v", id, got, want)
		}
	}

	// At the deadline, before the monitor's pass: the claim serves only
	// the task without one, and the claimed task's worker learns.
	h.clock.advance(time.Millisecond)
	if got := h.claim("q", 10, time.Minute); len(got) != 1 || got[0].Task.Id != plain {
		t.Fatalf("claim at the deadline: %v, want only the task without a deadline", got)
	}
	wantCode(t, renew(), connect.CodeFailedPrecondition)
	_, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: claimed, ClaimId: c[0].ClaimId}))
	wantCode(t, err, connect.CodeFailedPrecondition)

	h.node.dispatch.MonitorOnce()
	for _, id := range []uint64{ready, waiting, claimed} {
		got := h.get(id)
		if got.Status != nornv1.TaskStatus_TASK_STATUS_CANCELLED || len(got.Errors) == 0 || got.Errors[len(got.Errors)-1].Code != "deadline" {
			t.Fatalf("task %d after its deadline: %v", id, got)
		}
	}
	if got := h.get(claimed); len(got.Claims) != 1 || got.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_CANCELLED {
		t.Fatalf("the claimed task's claim: %v", got.Claims)
	}
	if got := h.get(done).Status; got != nornv1.TaskStatus_TASK_STATUS_COMPLETED {
		t.Fatalf("the task completed before its deadline is %v", got)
	}
	wantCode(t, renew(), connect.CodeFailedPrecondition)
	// A retry would be cancelled at once: refused.
	_, err = h.api.Retry(ctx, connect.NewRequest(&nornv1.RetryRequest{Id: ready}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("the retry's refusal does not say why: %v", err)
	}
}

// A deadline is refused, naming the field, when it is not in the future
// or not after not_before.
func TestDeadlineValidation(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	now := h.clock.Now()
	for name, spec := range map[string]*nornv1.TaskSpec{
		"past":             {Queue: "q", Deadline: timestamppb.New(now.Add(-time.Second))},
		"now":              {Queue: "q", Deadline: timestamppb.New(now)},
		"before notBefore": {Queue: "q", NotBefore: timestamppb.New(now.Add(time.Hour)), Deadline: timestamppb.New(now.Add(time.Minute))},
		"invalid":          {Queue: "q", Deadline: &timestamppb.Timestamp{Seconds: now.Unix() + 60, Nanos: -1}},
	} {
		_, err := h.api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{Task: spec}))
		wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.Contains(err.Error(), "task.deadline") {
			t.Errorf("%s: the error does not name task.deadline: %v", name, err)
		}
	}
}
