package main

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestClusterRetrySurvivesLeaderKill: a task whose attempt failed waits
// its backoff in its partition's Raft state, so the kill -9 of the
// partition's leader between attempts loses nothing: the survivors show
// it DELAYED, hand it out once, only after its backoff, and take its
// completion.
func TestClusterRetrySurvivesLeaderKill(t *testing.T) {
	ns := startCluster(t)
	ctx := context.Background()
	const backoff = 3 * time.Second
	r, err := ns[0].tasks.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{W: 3, Task: &nornv1.TaskSpec{Queue: "q",
		Retry: &nornv1.RetryPolicy{MaxAttempts: 3, InitialBackoff: durationpb.New(backoff)}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := r.Msg.Id
	claim := func(api *clusterNode, wait time.Duration) []*nornv1.ClaimedTask {
		t.Helper()
		c, err := api.tasks.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "q", Worker: "w", Max: 10,
			Lease: durationpb.New(time.Hour), Wait: durationpb.New(wait)}))
		if err != nil {
			if connect.CodeOf(err) == connect.CodeUnavailable {
				return nil // between leaders: a client retries
			}
			t.Fatal(err)
		}
		return c.Msg.Tasks
	}
	var first *nornv1.ClaimedTask
	waitUntil(t, 10*time.Second, "the first claim", func() bool {
		if c := claim(ns[1], time.Second); len(c) == 1 {
			first = c[0]
		}
		return first != nil
	})
	failed := time.Now()
	waitUntil(t, 10*time.Second, "the failure decided", func() bool {
		_, err := ns[1].tasks.Abort(ctx, connect.NewRequest(&nornv1.AbortRequest{Id: id, ClaimId: first.ClaimId, Retry: true,
			Errors: []*nornv1.TaskError{{Code: "flaky_downstream"}}}))
		if err != nil && connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatal(err)
		}
		return err == nil // UNAVAILABLE: retried, as a client does
	})
	var victim int
	for i, n := range ns {
		if n.api == first.Leader {
			victim = i
		}
	}
	t.Logf("killing %s, the leader that granted the claim and decided its failure", ns[victim].id)
	ns[victim].proc.kill()
	var alive []*clusterNode
	for i, n := range ns {
		if i != victim {
			alive = append(alive, n)
		}
	}
	// Once a survivor leads the partition (the read says the claim state
	// is known), the failure it decided before the kill is there.
	var view *nornv1.Task
	waitUntil(t, 10*time.Second, "a read with a known claim state", func() bool {
		got, err := alive[0].tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 2}))
		if err == nil && !got.Msg.Task.ClaimStateUnknown {
			view = got.Msg.Task
		}
		return view != nil
	})
	if view.FailedAttempts != 1 || len(view.Errors) != 1 || view.Errors[0].Code != "flaky_downstream" ||
		(view.Status != nornv1.TaskStatus_TASK_STATUS_DELAYED && time.Since(failed) < backoff) {
		t.Fatalf("the failed task on the survivors: %v", view)
	}
	// Claimed again once, and not before its backoff.
	var second []*nornv1.ClaimedTask
	waitUntil(t, 20*time.Second, "the task claimed again", func() bool {
		second = append(second, claim(alive[len(second)%2], 500*time.Millisecond)...)
		return len(second) > 0
	})
	if since := time.Since(failed); since < backoff {
		t.Fatalf("claimed again %s after its failure, before its %s backoff", since, backoff)
	}
	if len(second) != 1 || second[0].Task.Id != id || second[0].ClaimId <= first.ClaimId {
		t.Fatalf("second claims: %v", second)
	}
	for range 4 {
		if more := claim(alive[0], 250*time.Millisecond); len(more) != 0 {
			t.Fatalf("the task handed out twice: %v", more)
		}
	}
	if _, err := alive[1].tasks.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: second[0].ClaimId})); err != nil {
		t.Fatal(err)
	}
	got, err := alive[0].tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 2}))
	if err != nil || got.Msg.Task.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED || got.Msg.Task.FailedAttempts != 1 {
		t.Fatalf("after the second attempt: %v, %v", got, err)
	}
}
