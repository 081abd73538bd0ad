package node

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
)

// TestRevivedClaimThroughStaleReplica: a task is claimed (A), cancelled
// on every replica, retried (a revival: its second life) and claimed
// again (B), while one replica of its partition is cut off from its
// group and keeps its copy from before the Retry (terminal: CANCELLED).
// B's renew and complete sent through that replica, which must answer
// itself, cannot be refused from its copy ("terminal"): the replica
// never saw the new life begin, so it must say it cannot judge
// (UNAVAILABLE), as for any claim it does not know (found by the Jepsen
// harness, unique-under-partition seed 31137: a renew of a live claim of
// a retried task refused "task is terminal" by a cut-off node). A's
// renew there is still refused at once: the replica's claim record knows
// A's claim, which the cancel ended. Likewise a follower whose claim
// record applied the revival and B's claim but whose copy is the old
// terminal one does not refuse B's renew. B then completes.
func TestRevivedClaimThroughStaleReplica(t *testing.T) {
	ms := fenceCluster(t)
	ctx := context.Background()
	rv := reviveWithCutReplica(t, ms, "revive")
	id, p, leader, cut, follower, a, b, stale := rv.id, rv.p, rv.leader, rv.cut, rv.follower, rv.a, rv.b, rv.stale
	waitFor(t, 5*time.Second, "the follower to apply B's claim", func() bool {
		return follower.node.group(p).AppliedIndex() >= b.ClaimId
	})
	// The revival reached the replicas' copies with the Retry's write:
	// put the copy from before it back on the cut replica and the
	// follower (a copy the write missed).
	for _, m := range []*member{cut, follower} {
		restoreCopy(t, m, p, stale)
	}

	renew := func(m *member, claimID uint64) error {
		_, err := m.api.Renew(ctx, stuck(&nornv1.RenewRequest{Id: id, ClaimId: claimID, Lease: durationpb.New(time.Minute)}))
		return err
	}
	complete := func(m *member, claimID uint64) error {
		_, err := m.api.Complete(ctx, stuck(&nornv1.CompleteRequest{Id: id, ClaimId: claimID, Result: []byte("B")}))
		return err
	}
	// The cut replica can never lead: it must answer UNAVAILABLE.
	if err := renew(cut, b.ClaimId); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("B's renew through the cut replica (copy terminal in the old life): %v, want UNAVAILABLE", err)
	}
	if err := complete(cut, b.ClaimId); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("B's complete through the cut replica (copy terminal in the old life): %v, want UNAVAILABLE", err)
	}
	if err := renew(cut, a.ClaimId); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("A's renew through the cut replica (A's claim ended by the cancel it applied): %v, want FAILED_PRECONDITION", err)
	}
	// The follower answers UNAVAILABLE (it cannot propose), unless it
	// won an election meanwhile (a loaded machine): then it decides, by
	// its claim record, and the renew takes effect. Never "terminal".
	if err := renew(follower, b.ClaimId); connect.CodeOf(err) != connect.CodeUnavailable &&
		!(err == nil && follower.node.group(p).IsLeader()) {
		t.Errorf("B's renew through the follower (copy terminal in the old life): %v, want UNAVAILABLE", err)
	}
	// B completes through the partition's leader, whichever of the two
	// in the group it is now (the cut replica knows none).
	try := 0
	waitFor(t, 10*time.Second, "B's complete through the leader", func() bool {
		try++
		m := []*member{leader, follower}[try%2]
		_, err := m.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: b.ClaimId, Result: []byte("B")}))
		if err != nil && connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("B's complete: %v", err)
		}
		return err == nil
	})
	g, err := leader.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 2}))
	if err != nil || g.Msg.Task.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED || g.Msg.Task.Life != 1 {
		t.Fatalf("after B's complete: %v, %v; want COMPLETED in life 1", g, err)
	}
}

// restoreCopy replaces m's copy of task old.ID in partition p with old,
// until it stays (a read repair of the call before may land after it).
func restoreCopy(t *testing.T, m *member, p uint16, old *crdt.Task) {
	t.Helper()
	waitFor(t, 5*time.Second, "the old copy to stay on "+m.cfg.NodeID, func() bool {
		if err := m.node.store.DeleteTasks(p, []uint64{old.ID}); err != nil {
			t.Fatal(err)
		}
		if _, err := m.node.store.MergeTask(p, old); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		got, err := m.node.store.TaskState(p, old.ID)
		return err == nil && got.Life() == 0
	})
}

// revived is reviveWithCutReplica's outcome.
type revived struct {
	id                    uint64
	p                     uint16
	leader, cut, follower *member
	a, b                  *nornv1.ClaimedTask // the claims of the first and second life
	stale                 *crdt.Task          // cut's copy from before the Retry (CANCELLED in life 0)
}

// reviveWithCutReplica enqueues a task of queue on every replica, claims
// it (A), cancels it on every replica, cuts one replica off its group
// (cut: its copy stays CANCELLED), retries the task (its second life) and
// claims it again (B) through the leader.
func reviveWithCutReplica(t *testing.T, ms []*member, queue string) revived {
	t.Helper()
	ctx := context.Background()
	id, leader := enqueueEverywhere(t, ms, queue)
	p := leader.node.partition(id)
	_, others := partitionRoles(t, ms, p)
	cut, follower := others[0], others[1]
	a := claimFor(t, leader, queue, "A", time.Minute)
	if _, err := leader.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: id, W: 3})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "every replica's claim record to end A's claim", func() bool {
		for _, m := range ms {
			ts, err := m.node.coord.Load(id)
			if err != nil || ts.Claims == nil || !ts.Claims.Done() {
				return false
			}
		}
		return true
	})
	stale, err := cut.node.store.TaskState(p, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := stale.Terminal(); !ok {
		t.Fatalf("the cut replica's copy after the cancel is not terminal: %+v", stale)
	}
	if err := cut.node.group(p).Shutdown(); err != nil {
		t.Fatal(err)
	}
	r, err := leader.api.Retry(ctx, connect.NewRequest(&nornv1.RetryRequest{Id: id}))
	if err != nil || r.Msg.Life != 1 {
		t.Fatalf("retry: %v, %v", r, err)
	}
	b := claimFor(t, leader, queue, "B", time.Minute)
	if b.Task.Id != id || b.ClaimId <= a.ClaimId {
		t.Fatalf("claim after the retry: task %d claim %d, want task %d with a claim after %d", b.Task.Id, b.ClaimId, id, a.ClaimId)
	}
	return revived{id: id, p: p, leader: leader, cut: cut, follower: follower, a: a, b: b, stale: stale}
}

// TestCancelThroughStaleReplicaEndsNewLife: a task cancelled, retried
// (its second life) and claimed again (B); a cancel then sent through a
// replica cut off from the group whose copy is from before the Retry
// (CANCELLED), forcing it to answer itself. The replica cannot take its
// copy's word that the task is already cancelled (its answer would be
// acked while the second life ran on): it reads a majority, which holds
// the revival, and cancels the second life: the task ends CANCELLED and
// B's claim with it.
func TestCancelThroughStaleReplicaEndsNewLife(t *testing.T) {
	ms := fenceCluster(t)
	ctx := context.Background()
	rv := reviveWithCutReplica(t, ms, "recancel")
	restoreCopy(t, rv.cut, rv.p, rv.stale)
	if _, err := rv.cut.api.Cancel(ctx, stuck(&nornv1.CancelRequest{Id: rv.id})); err != nil {
		t.Fatalf("cancel through the cut replica: %v", err)
	}
	waitFor(t, 5*time.Second, "the second life cancelled at the leader", func() bool {
		g, err := rv.leader.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: rv.id}))
		return err == nil && g.Msg.Task.Status == nornv1.TaskStatus_TASK_STATUS_CANCELLED && g.Msg.Task.Life == 1
	})
	_, err := rv.leader.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: rv.id, ClaimId: rv.b.ClaimId, Lease: durationpb.New(time.Minute)}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("B's renew after the cancel: %v, want FAILED_PRECONDITION", err)
	}
}
