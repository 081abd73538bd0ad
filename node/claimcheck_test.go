package node

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestLiveClaimOnLeaderWithoutTheTask: the partition's leader has lost the
// task's state (a write with W < N skipped it, or a power loss took it)
// while its claim FSM holds a live claim. Renew, Update, Yield and
// Complete under that claim must not be refused (found by the Jepsen
// harness: NOT_FOUND for a live claim); the leader reads the task from a
// majority instead.
func TestLiveClaimOnLeaderWithoutTheTask(t *testing.T) {
	ms := testCluster(t, 3)
	ctx := context.Background()
	id, leader := enqueueEverywhere(t, ms, "q")
	p := leader.node.partition(id)
	claimID := claimOne(t, leader, "q")
	// The call before a loss read the task from a majority and repairs
	// the leader's replica in the background: that repair may land after
	// a delete, so delete until the task stays gone.
	lose := func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			if err := leader.node.store.DeleteTasks(p, []uint64{id}); err != nil {
				t.Fatal(err)
			}
			if _, err := leader.node.store.TaskState(p, id); err != nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the leader still has the task")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	lose()
	if _, err := leader.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: id, ClaimId: claimID, Lease: durationpb.New(time.Minute)})); err != nil {
		t.Fatalf("renew of the live claim at a leader without the task: %v", err)
	}
	lose()
	if _, err := leader.api.Update(ctx, connect.NewRequest(&nornv1.UpdateRequest{Id: id, ClaimId: claimID, Seq: 1, Progress: 0.5})); err != nil {
		t.Fatalf("update under the live claim at a leader without the task: %v", err)
	}
	lose()
	if _, err := leader.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: claimID})); err != nil {
		t.Fatalf("complete under the live claim at a leader without the task: %v", err)
	}
	g, err := leader.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 3}))
	if err != nil || g.Msg.Task.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED {
		t.Fatalf("after the complete: %v, %v", g, err)
	}

	// Yield, on a second task.
	id, leader = enqueueEverywhere(t, ms, "y")
	p = leader.node.partition(id)
	claimID = claimOne(t, leader, "y")
	lose()
	if _, err := leader.api.Yield(ctx, connect.NewRequest(&nornv1.YieldRequest{Id: id, ClaimId: claimID})); err != nil {
		t.Fatalf("yield of the live claim at a leader without the task: %v", err)
	}
}

// TestClaimCheckAuthority: a claim that is not live is refused
// (FAILED_PRECONDITION) only by the partition's leader; a replica that is
// not the leader cannot refute it and answers UNAVAILABLE (found by the
// Jepsen harness: a replica whose claim FSM was behind refused a live
// claim as superseded).
func TestClaimCheckAuthority(t *testing.T) {
	ms := testCluster(t, 3)
	ctx := context.Background()
	id, _ := enqueueEverywhere(t, ms, "q")
	leader, others := partitionRoles(t, ms, ms[0].node.partition(id))
	const bogus = 987654 // never a claim of this task
	if _, err := leader.node.dispatch.LoadClaimed(ctx, id, bogus); err != nil {
		t.Fatalf("leader's load under a dead claim: %v (the caller refuses it with server.LiveClaim)", err)
	}
	if _, err := leader.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: bogus})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("leader's check of a dead claim: %v, want FAILED_PRECONDITION", err)
	}
	for _, m := range others {
		if _, err := m.node.dispatch.LoadClaimed(ctx, id, bogus); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("%s (not the leader) on a claim it cannot see: %v, want UNAVAILABLE", m.cfg.NodeID, err)
		}
	}
	// A follower that lacks the task altogether cannot call it missing.
	p := ms[0].node.partition(id)
	if err := others[0].node.store.DeleteTasks(p, []uint64{id}); err != nil {
		t.Fatal(err)
	}
	if _, err := others[0].node.dispatch.LoadClaimed(ctx, id, bogus); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("follower without the task: %v, want UNAVAILABLE", err)
	}
}

// TestCancelAtLeaderWithoutTheTask: a cancel answered by a leader whose
// replica lacks the task (W < N skipped it) cancels it instead of
// answering NOT_FOUND: only a majority can say a task does not exist.
func TestCancelAtLeaderWithoutTheTask(t *testing.T) {
	ms := testCluster(t, 3)
	ctx := context.Background()
	id, leader := enqueueEverywhere(t, ms, "q")
	p := leader.node.partition(id)
	if err := leader.node.store.DeleteTasks(p, []uint64{id}); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: id, W: 3})); err != nil {
		t.Fatalf("cancel at a leader without the task: %v", err)
	}
	g, err := leader.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 3}))
	if err != nil || g.Msg.Task.Status != nornv1.TaskStatus_TASK_STATUS_CANCELLED {
		t.Fatalf("after the cancel: %v, %v", g, err)
	}
	// A task no replica has is still not found.
	if _, err := leader.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: 4242})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("cancel of an unknown task: %v, want NOT_FOUND", err)
	}
}

// enqueueEverywhere enqueues a task of queue with W=3 (every replica has
// it) and returns its id and its partition's leader.
func enqueueEverywhere(t *testing.T, ms []*member, queue string) (uint64, *member) {
	t.Helper()
	r, err := ms[0].api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: queue}, W: 3}))
	if err != nil {
		t.Fatal(err)
	}
	leader, _ := partitionRoles(t, ms, ms[0].node.partition(r.Msg.Id))
	return r.Msg.Id, leader
}

// claimOne claims the one task of queue at m, with a one-minute lease, and
// returns its claim id.
func claimOne(t *testing.T, m *member, queue string) uint64 {
	t.Helper()
	c, err := m.api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{Queue: queue, Worker: "w", Max: 1, Lease: durationpb.New(time.Minute)}))
	if err != nil || len(c.Msg.Tasks) != 1 {
		t.Fatalf("claim: %v, %v", c, err)
	}
	return c.Msg.Tasks[0].ClaimId
}
