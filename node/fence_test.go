package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
	"github.com/norn-dev/norn/transport"
)

// fenceCluster is a 3-node cluster whose leases end soon after their
// expiry in real time: a 300 ms skew buffer (with max clock offset 50 ms)
// and a 300 ms new-leader grace. The nodes share the process's clock, so
// the clock guard sees them in bound, and no test moves a clock (a moved
// clock makes every node lead nothing until it has measured its peers
// again).
func fenceCluster(t *testing.T) []*member {
	t.Helper()
	return fenceClusterWith(t, TestBugs{})
}

// fenceClusterWith is fenceCluster with the seeded bugs bugs.
func fenceClusterWith(t *testing.T, bugs TestBugs) []*member {
	t.Helper()
	return testClusterWith(t, 3, func(_ int, cfg *Config) {
		cfg.SkewBuffer, cfg.MaxClockOffset, cfg.LeaseGrace = fenceSkew, 50*time.Millisecond, 300*time.Millisecond
		cfg.TestBugs = bugs
	})
}

// fenceSkew is fenceCluster's skew buffer; fenceLease the short lease its
// tests claim with.
const (
	fenceSkew  = 300 * time.Millisecond
	fenceLease = 500 * time.Millisecond
	// supersedeLease is worker A's lease in supersede.
	supersedeLease = 2 * time.Second
)

// superseded is a task whose claim A was superseded by B's while a replica
// of its partition (cut) was cut off from its group.
type superseded struct {
	id          uint64
	leader, cut *member
	a, b        *nornv1.ClaimedTask
}

// supersede sets up superseded: worker A holds a short claim; a replica
// of the partition is cut off from its group (its claim state stays where
// A's claim is live, as on a node behind a network partition); the leader
// expires A's claim after expiry plus the skew buffer and grants the
// task to B.
func supersede(t *testing.T, ms []*member) superseded {
	t.Helper()
	ctx := context.Background()
	id, leader := enqueueEverywhere(t, ms, "fence")
	p := leader.node.partition(id)
	_, others := partitionRoles(t, ms, p)
	// A's lease is long enough (supersedeLease) for the replica to apply
	// its claim and be cut off before the leader expires it, on a loaded
	// machine too (with fenceLease the replica once applied the expiry
	// first, in CI, and had nothing stale left to judge from).
	a := claimFor(t, leader, "fence", "A", supersedeLease)
	if a.Task.Id != id {
		t.Fatalf("claimed task %d, want %d", a.Task.Id, id)
	}
	cut := others[0]
	waitFor(t, 5*time.Second, "the replica to apply A's claim", func() bool {
		return cut.node.group(p).AppliedIndex() >= a.ClaimId
	})
	if err := cut.node.group(p).Shutdown(); err != nil {
		t.Fatal(err)
	}
	if ts, err := cut.node.coord.Load(id); err != nil || ts.Claims == nil {
		t.Fatalf("the cut-off replica's state of the task: %v, %v", ts, err)
	} else if c, live := ts.Claims.Live(); !live || c.Token != a.ClaimId {
		t.Fatalf("the cut-off replica applied more than A's claim before it was cut off (its live claim: %v): the setup took longer than A's lease", c)
	}
	// A's lease and the skew buffer pass; the leader's monitor expires it.
	var b *nornv1.ClaimedTask
	waitFor(t, 10*time.Second, "A's claim expired and the task granted to B", func() bool {
		c, err := leader.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "fence", Worker: "B", Max: 1, Lease: durationpb.New(time.Minute)}))
		if err == nil && len(c.Msg.Tasks) == 1 {
			b = c.Msg.Tasks[0]
			return true
		}
		return false
	})
	if b.ClaimId <= a.ClaimId {
		t.Fatalf("B's claim %d is not after A's %d", b.ClaimId, a.ClaimId)
	}
	return superseded{id: id, leader: leader, cut: cut, a: a, b: b}
}

// claimFor claims the one ready task of queue at m for worker, with lease.
func claimFor(t *testing.T, m *member, queue, worker string, lease time.Duration) *nornv1.ClaimedTask {
	t.Helper()
	c, err := m.api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{Queue: queue, Worker: worker, Max: 1, Lease: durationpb.New(lease)}))
	if err != nil || len(c.Msg.Tasks) != 1 {
		t.Fatalf("claim of %s for %s: %v, %v", queue, worker, c, err)
	}
	return c.Msg.Tasks[0]
}

// stuck is a request that a client forces to be answered by the node it
// reaches (Norn-Hops at the limit: no forwarding).
func stuck[T any](msg *T) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set(transport.HeaderHops, "2")
	return req
}

// TestFenceSupersededWorkerThroughCutOffReplica: worker A holds a short
// claim; a replica of the partition is cut off from its group (its claim
// state stops where A's claim is live); the leader expires A's claim
// after expiry plus the skew buffer and grants the task to B. A, stalled,
// then completes (w=1) through the cut-off replica, forcing it to answer
// itself: the replica must refuse (it cannot reach the leader, which alone
// decides), and so must the leader (A's claim is superseded); likewise
// A's abort, yield and update. B still holds the task and completes it.
// (Before the fence, the replica checked A's claim against its own stale
// copy and accepted the completion.)
func TestFenceSupersededWorkerThroughCutOffReplica(t *testing.T) {
	ms := fenceCluster(t)
	ctx := context.Background()
	sp := supersede(t, ms)
	id, leader, cut, a, b := sp.id, sp.leader, sp.cut, sp.a, sp.b
	// A completes, aborts, yields and updates through the cut-off replica.
	for what, call := range map[string]func() error{
		"complete": func() error {
			_, err := cut.api.Complete(ctx, stuck(&nornv1.CompleteRequest{Id: id, ClaimId: a.ClaimId, W: 1, Result: []byte("A")}))
			return err
		},
		"abort": func() error {
			_, err := cut.api.Abort(ctx, stuck(&nornv1.AbortRequest{Id: id, ClaimId: a.ClaimId, W: 1}))
			return err
		},
		"yield": func() error {
			_, err := cut.api.Yield(ctx, stuck(&nornv1.YieldRequest{Id: id, ClaimId: a.ClaimId, Progress: 0.5}))
			return err
		},
		"update": func() error {
			_, err := cut.api.Update(ctx, stuck(&nornv1.UpdateRequest{Id: id, ClaimId: a.ClaimId, Seq: 1, Progress: 0.5, W: 1}))
			return err
		},
	} {
		if err := call(); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Errorf("A's %s through the cut-off replica: %v, want UNAVAILABLE", what, err)
		}
	}
	// The leader refuses A's acts: its claim is superseded.
	if _, err := leader.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: a.ClaimId, Result: []byte("A")})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("A's complete at the leader: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := leader.api.Update(ctx, connect.NewRequest(&nornv1.UpdateRequest{Id: id, ClaimId: a.ClaimId, Seq: 1, Progress: 0.5})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("A's update at the leader: %v, want FAILED_PRECONDITION", err)
	}
	// B still holds the task, renews and completes it.
	if _, err := leader.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: id, ClaimId: b.ClaimId, Lease: durationpb.New(time.Minute)})); err != nil {
		t.Fatalf("B's renew: %v", err)
	}
	g, err := leader.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 2}))
	if err != nil || g.Msg.Task.Status != nornv1.TaskStatus_TASK_STATUS_CLAIMED || len(g.Msg.Task.Updates) != 0 {
		t.Fatalf("before B's complete: %v, %v; want CLAIMED by B, no update of A's", g, err)
	}
	if _, err := leader.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: b.ClaimId, Result: []byte("B")})); err != nil {
		t.Fatalf("B's complete: %v", err)
	}
	g, err = leader.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 2}))
	if err != nil || g.Msg.Task.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED || string(g.Msg.Task.Result) != "B" {
		t.Fatalf("after B's complete: %v, %v; want COMPLETED with B's result", g, err)
	}
}

// TestCompletedTaskNotReclaimedAfterLeaderChange: a completion acked with
// W=2 whose write the third replica missed, then the leadership moved to
// that replica at once, anti-entropy off: the new leader must never
// expire the finished claim or grant the task again. The group decided
// the completion, so every replica's claim state knows it, whatever its
// copy of the task says. (Before the fence the group learned of a
// completion only from the old leader's ender, up to 1 s later, and a
// leader change dropped it.) A control task of the same partition,
// claimed and never finished, shows that the new leader does expire and
// grant again what is not finished. With the seeded bug end-after-write
// (the path before the fence: the completion written as a CRDT, the
// claim's end proposed a second later and dropped by a leader that no
// longer leads) the new leader does grant the completed task again.
func TestCompletedTaskNotReclaimedAfterLeaderChange(t *testing.T) {
	for _, bug := range testhooks.BugCases() {
		t.Run(fmt.Sprintf("end-after-write=%v", bug), func(t *testing.T) {
			again := completeThenMoveLeadership(t, TestBugs{EndAfterWrite: bug})
			if again != bug {
				t.Fatalf("the completed task claimed again: %v (bug %v)", again, bug)
			}
		})
	}
}

// completeThenMoveLeadership runs TestCompletedTaskNotReclaimedAfterLeaderChange
// on a cluster with bugs and reports whether any node granted the
// completed task again.
func completeThenMoveLeadership(t *testing.T, bugs TestBugs) (again bool) {
	ms := fenceClusterWith(t, bugs)
	ctx := context.Background()
	id, leader := enqueueEverywhere(t, ms, "done")
	p := leader.node.partition(id)
	// The control task: one of the same partition, in another queue.
	var control uint64
	for control == 0 {
		r, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "control"}, W: 3}))
		if err != nil {
			t.Fatal(err)
		}
		if ms[0].node.partition(r.Msg.Id) == p {
			control = r.Msg.Id
		}
	}
	_, others := partitionRoles(t, ms, p)
	next := others[1]
	c := claimFor(t, leader, "done", "w", fenceLease)
	// Every control task of other partitions is claimed for good; ours
	// is claimed with a short lease.
	var ctl *nornv1.ClaimedTask
	for ctl == nil {
		got, err := leader.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "control", Worker: "ctl", Max: 1, Lease: durationpb.New(fenceLease)}))
		if err != nil || len(got.Msg.Tasks) != 1 {
			t.Fatalf("claim of a control task: %v, %v", got, err)
		}
		if got.Msg.Tasks[0].Task.Id == control {
			ctl = got.Msg.Tasks[0]
		} else {
			renewForever(t, leader, got.Msg.Tasks[0])
		}
	}
	// The next leader misses the completion's write (it exchanges no task
	// states from now on; its Raft groups go on).
	next.node.RefuseTaskStates(true)
	if _, err := leader.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: c.ClaimId, W: 2, Result: []byte("ok")})); err != nil {
		t.Fatal(err)
	}
	if err := leader.node.group(p).TransferLeadershipTo(next.cfg.NodeID, next.node.RaftAddr()); err != nil {
		t.Fatalf("transfer to %s: %v", next.cfg.NodeID, err)
	}
	waitFor(t, 10*time.Second, "the third replica to lead", func() bool { return next.node.group(p).IsLeader() })
	// The new leader expires the control task's claim and grants it again.
	waitFor(t, 10*time.Second, "the control task granted again by the new leader", func() bool {
		got, err := next.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "control", Worker: "again", Max: 1}))
		return err == nil && len(got.Msg.Tasks) == 1 && got.Msg.Tasks[0].Task.Id == control && got.Msg.Tasks[0].ClaimId > ctl.ClaimId
	})
	// By then the completed task's lease, grace and buffer are long past.
	for _, m := range ms {
		got, err := m.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "done", Worker: "again", Max: 1}))
		if err != nil {
			t.Fatalf("claim at %s: %v", m.cfg.NodeID, err)
		}
		for _, ct := range got.Msg.Tasks {
			if ct.Task.Id != id {
				t.Fatalf("claim at %s: task %d, not of queue done", m.cfg.NodeID, ct.Task.Id)
			}
			t.Logf("the completed task %d was claimed again at %s (claim %d)", id, m.cfg.NodeID, ct.ClaimId)
			again = true
		}
	}
	return again
}

// renewForever keeps renewing ct's lease until the test ends.
func renewForever(t *testing.T, m *member, ct *nornv1.ClaimedTask) {
	t.Helper()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		tick := time.NewTicker(fenceLease / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				m.api.Renew(context.Background(), connect.NewRequest(&nornv1.RenewRequest{Id: ct.Task.Id, ClaimId: ct.ClaimId, Lease: durationpb.New(fenceLease)}))
			}
		}
	}()
}

// TestSeededBugsOfTheFence: each seeded bug that reverts a part of the
// fence lets a superseded worker's complete through, and only with the
// bug: act-local (a replica cut off from its leader decides from its own
// copy) through the cut-off replica, act-no-fence (the group takes an act
// under any claim) at the leader.
func TestSeededBugsOfTheFence(t *testing.T) {
	for _, bug := range testhooks.BugCases() {
		for _, tc := range []struct {
			name string
			bugs TestBugs
			via  func(sp superseded) *member
		}{
			{"act-local", TestBugs{ActLocal: bug}, func(sp superseded) *member { return sp.cut }},
			{"act-no-fence", TestBugs{ActNoFence: bug}, func(sp superseded) *member { return sp.leader }},
		} {
			t.Run(fmt.Sprintf("%s=%v", tc.name, bug), func(t *testing.T) {
				ms := fenceClusterWith(t, tc.bugs)
				sp := supersede(t, ms)
				_, err := tc.via(sp).api.Complete(context.Background(), stuck(&nornv1.CompleteRequest{Id: sp.id, ClaimId: sp.a.ClaimId, W: 1, Result: []byte("A")}))
				if (err == nil) != bug {
					t.Fatalf("A's complete under its superseded claim: %v (bug %v)", err, bug)
				}
			})
		}
	}
}

// TestMaxClaimsAbortWhenTheLeaderLacksTheTask: the last claim a task's
// max_claims allows expires on a leader whose replica lost the task's
// state (a write with W < N skipped it): the leader still aborts the
// task, reading it from a majority (before, it skipped the abort and
// the task stayed claimable by no one, for good).
func TestMaxClaimsAbortWhenTheLeaderLacksTheTask(t *testing.T) {
	ms := fenceCluster(t)
	ctx := context.Background()
	r, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "mc", MaxClaims: 1}, W: 3}))
	if err != nil {
		t.Fatal(err)
	}
	id := r.Msg.Id
	leader := groupLeader(t, ms, ms[0].node.partition(id))
	p := leader.node.partition(id)
	c := claimFor(t, leader, "mc", "w", fenceLease)
	// The replica loses the task's state; the claim FSM's claimed index
	// keeps the claim (as on a replica the task's write never reached,
	// which applies the claim all the same).
	if err := leader.node.store.DeleteTasks(p, []uint64{id}); err != nil {
		t.Fatal(err)
	}
	applied, err := leader.node.store.ClaimFSMApplied(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.node.store.ApplyClaimFSM(p, storage.ClaimFSMUpdate{AppliedIndex: applied,
		Moves: []storage.IndexMove{{ID: id, Claimed: true, ExpiryMs: c.Expiry.AsTime().UnixMilli()}}}, true); err != nil {
		t.Fatal(err)
	}
	// Watch a follower's own replica (a read through the API would repair
	// the leader's, hiding what the test is about).
	_, others := partitionRoles(t, ms, p)
	waitFor(t, 10*time.Second, "the task aborted past max_claims", func() bool {
		ts, err := others[0].node.coord.Load(id)
		if err != nil {
			return false
		}
		ev, terminal := ts.Task.Terminal()
		return terminal && ev.Kind == crdt.Aborted && len(ev.Errors) == 1 && ev.Errors[0].Code == "max_claims_exceeded"
	})
}

// TestReadWithoutALeaderSaysTheClaimStateIsUnknown: a read that reaches
// no leader of the task's partition (two of three nodes stopped) shows
// the task's status from the replica it reached, and says that its claim
// state is unknown, for a task that is not terminal; with a leader, or
// for a terminal task, it does not.
func TestReadWithoutALeaderSaysTheClaimStateIsUnknown(t *testing.T) {
	ms := fenceCluster(t)
	ctx := context.Background()
	open, leader := enqueueEverywhere(t, ms, "unknown")
	done, _ := enqueueEverywhere(t, ms, "unknown-done")
	c := claimFor(t, leader, "unknown-done", "w", time.Minute)
	if _, err := leader.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: done, ClaimId: c.ClaimId, W: 3})); err != nil {
		t.Fatal(err)
	}
	get := func(m *member, id uint64) *nornv1.Task {
		t.Helper()
		r, err := m.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 1}))
		if err != nil {
			t.Fatalf("get %d at %s: %v", id, m.cfg.NodeID, err)
		}
		return r.Msg.Task
	}
	survivor := ms[0]
	if got := get(survivor, open); got.ClaimStateUnknown || got.Status != nornv1.TaskStatus_TASK_STATUS_READY {
		t.Fatalf("with a leader: %v, claim state unknown %v", got.Status, got.ClaimStateUnknown)
	}
	ms[1].stop()
	ms[2].stop()
	for _, id := range []uint64{open, done} {
		p := survivor.node.partition(id)
		waitFor(t, 10*time.Second, "the survivor to know no leader", func() bool { return survivor.node.group(p).Leader() == "" })
	}
	if got := get(survivor, open); !got.ClaimStateUnknown || got.Status != nornv1.TaskStatus_TASK_STATUS_READY {
		t.Fatalf("without a leader: %v, claim state unknown %v; want READY and unknown", got.Status, got.ClaimStateUnknown)
	}
	if got := get(survivor, done); got.ClaimStateUnknown || got.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED {
		t.Fatalf("a completed task without a leader: %v, claim state unknown %v; want COMPLETED, known", got.Status, got.ClaimStateUnknown)
	}
}
