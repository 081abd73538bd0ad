package node

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/dispatch"
	"github.com/norn-dev/norn/ring"
)

// TestClusterRemoteDependencies: on 4 nodes with N=3 a task's partition
// leader may not replicate its dependency's partition, or its replica of
// it may miss the completion. The leader learns the dependency's outcome
// from a majority of its replicas in the background: a completed one makes
// the dependant claimable (a waiting claim anywhere gets it), a cancelled
// one aborts it.
func TestClusterRemoteDependencies(t *testing.T) {
	// Leaders that stay put (the default Raft timeout, not the tests'
	// 300ms, and no leader balancing): each case needs the dependant's
	// leader to be the one that checks its dependency.
	ms := testClusterWith(t, 4, func(_ int, cfg *Config) {
		cfg.RaftTimeout = time.Second
		cfg.NoLeaderBalance = true
	})
	ctx := context.Background()
	const P = 8
	r := ms[0].node.host.Ring()
	leader := func(p int) *member {
		t.Helper()
		return groupLeader(t, ms, uint16(p))
	}
	// pair returns partitions (of a dependency, of its dependant) such that
	// the dependant's leader does (hosted) or does not replicate the
	// dependency's partition.
	pair := func(hosted bool) (pd, pc int, l *member) {
		for pc := range P {
			l := leader(pc)
			for pd := range P {
				if pd != pc && r.Hosts(pd, l.cfg.NodeID) == hosted {
					return pd, pc, l
				}
			}
		}
		t.Fatalf("no partitions with hosted=%v", hosted)
		return 0, 0, nil
	}
	next := uint64(1000)
	idIn := func(p int) uint64 {
		for ; ring.Partition(next, P) != p; next++ {
		}
		next++
		return next - 1
	}
	enqueue := func(id uint64, queue string, deps ...uint64) {
		t.Helper()
		if _, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
			Id: id, Task: &nornv1.TaskSpec{Queue: queue, DependsOn: deps}, W: 3})); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(ctx context.Context, m *member, queue string, wait time.Duration) []*nornv1.ClaimedTask {
		t.Helper()
		resp, err := m.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: queue, Worker: "w", Max: 1,
			Lease: durationpb.New(time.Minute), Wait: durationpb.New(wait)}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Tasks
	}
	status := func(m *member, id uint64) *nornv1.Task {
		t.Helper()
		resp, err := m.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Task
	}

	t.Run("completed elsewhere", func(t *testing.T) {
		pd, pc, l := pair(false)
		dep, child := idIn(pd), idIn(pc)
		enqueue(dep, "parent1")
		enqueue(child, "child1", dep)
		if got := claim(ctx, l, "child1", 0); len(got) != 0 {
			t.Fatalf("dependant of a running task claimed: %v", got)
		}
		if s := status(l, child).Status; s != nornv1.TaskStatus_TASK_STATUS_DELAYED {
			t.Fatalf("dependant of a running task is %v", s)
		}
		got := claim(ctx, ms[0], "parent1", 10*time.Second)
		if len(got) != 1 || got[0].Task.Id != dep {
			t.Fatalf("claimed %v, want the dependency %d", got, dep)
		}
		if _, err := ms[1].api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: dep, ClaimId: got[0].ClaimId, W: 3})); err != nil {
			t.Fatal(err)
		}
		// A claim at a node that leads neither partition waits for it.
		var other *member
		for _, m := range ms {
			if g := m.node.group(uint16(pd)); m != l && (g == nil || !g.IsLeader()) {
				other = m
			}
		}
		start := time.Now()
		got = claim(ctx, other, "child1", 20*time.Second)
		if len(got) != 1 || got[0].Task.Id != child {
			t.Fatalf("claimed %v after the dependency completed, want %d", got, child)
		}
		t.Logf("claimable at %s after %v (%s leads the dependant's partition, %s did)", other.cfg.NodeID, time.Since(start),
			leader(pc).cfg.NodeID, l.cfg.NodeID)
		// The dependant's leader learned it from the others (also when
		// its leadership moved meanwhile to a replica of the dependency).
		cached(t, l, dep, dispatch.DepCompleted)
	})

	t.Run("missed by the local replica", func(t *testing.T) {
		pd, pc, l := pair(true)
		dep, child := idIn(pd), idIn(pc)
		enqueue(dep, "parent2")
		enqueue(child, "child2", dep)
		// The completion reaches the two other replicas only.
		done := &crdt.Task{ID: dep, Terminals: []crdt.Terminal{{At: ms[0].node.hlc.Now(), Kind: crdt.Completed}}}
		for _, id := range r.Cohort(pd) {
			if string(id) == l.cfg.NodeID {
				continue
			}
			i := slices.IndexFunc(ms, func(m *member) bool { return m.cfg.NodeID == string(id) })
			if err := ms[i].node.coord.MergeLocal([]*crdt.Task{done}); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		got := claim(ctx, l, "child2", 20*time.Second)
		if len(got) != 1 || got[0].Task.Id != child {
			t.Fatalf("claimed %v after the dependency completed, want %d", got, child)
		}
		t.Logf("claimable after %v", time.Since(start))
		// The read repaired the leader's replica (in the background).
		waitFor(t, 5*time.Second, "read repair of the leader's replica of the dependency", func() bool {
			ts, err := l.node.coord.Load(dep)
			if err != nil {
				return false
			}
			ev, done := ts.Task.Terminal()
			return done && ev.Kind == crdt.Completed
		})
	})

	t.Run("cancelled elsewhere", func(t *testing.T) {
		pd, pc, l := pair(false)
		dep, child := idIn(pd), idIn(pc)
		enqueue(dep, "parent3")
		enqueue(child, "child3", dep)
		if _, err := ms[2].api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: dep, W: 3})); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		claimed := make(chan []*nornv1.ClaimedTask, 1)
		go func() {
			resp, err := l.api.Claim(cctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "child3", Worker: "w", Max: 1,
				Lease: durationpb.New(time.Minute), Wait: durationpb.New(20 * time.Second)}))
			if err != nil {
				claimed <- nil
				return
			}
			claimed <- resp.Msg.Tasks
		}()
		waitFor(t, 15*time.Second, "the dependant aborted", func() bool {
			return status(ms[3], child).Status == nornv1.TaskStatus_TASK_STATUS_ABORTED
		})
		cancel()
		if got := <-claimed; len(got) != 0 {
			t.Fatalf("dependant of a cancelled task claimed: %v", got)
		}
		cached(t, l, dep, dispatch.DepFailed)
		got := status(l, child)
		if len(got.Errors) != 1 || got.Errors[0].Code != "dependency_failed" || got.Errors[0].Args[0] != fmt.Sprint(dep) {
			t.Fatalf("dependant of a cancelled task: %v", got)
		}
	})
}

// cached waits until m's dependency cache holds id with outcome want.
func cached(t *testing.T, m *member, id uint64, want dispatch.DepOutcome) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%s to cache dependency %d", m.cfg.NodeID, id), func() bool {
		o, ok := m.node.dispatch.CachedDep(id)
		return ok && o == want
	})
}
