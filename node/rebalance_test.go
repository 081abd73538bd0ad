package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/ring"
)

// rebalanceTune makes anti-entropy (which fills a move's new replica) run
// often enough for a test.
func rebalanceTune(_ int, cfg *Config) {
	cfg.AntiEntropyInterval = time.Second
	cfg.AntiEntropySettle = 50 * time.Millisecond
}

// startJoiner starts a node that gossips with ms's cluster without being a
// member of its ring.
func startJoiner(t *testing.T, ms []*member, i int) *member {
	t.Helper()
	cfg := ms[0].cfg
	cfg.DataDir, cfg.NodeID, cfg.MachineID = t.TempDir(), fmt.Sprintf("n%d", i), uint16(i)
	cfg.APIAddr, cfg.BootstrapExpect = "", 0
	cfg.Join = []string{ms[0].node.GossipAddr()}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.RaftLogger = hclog.NewNullLogger()
	m := startMember(t, cfg)
	waitFor(t, 20*time.Second, m.cfg.NodeID+" has the ring", func() bool { return m.node.ring.Load() != nil })
	return m
}

func adminClient(m *member) nornv1connect.AdminServiceClient {
	return nornv1connect.NewAdminServiceClient(h2cClient(), "http://"+m.cfg.APIAddr, connect.WithGRPC())
}

// waitMovesDone waits until m's ring has every move of its rebalance done
// and returns that ring.
func waitMovesDone(t *testing.T, m *member, timeout time.Duration) *cluster.Ring {
	t.Helper()
	var r *cluster.Ring
	waitFor(t, timeout, "every move done", func() bool {
		r = m.node.meta.Ring()
		for _, mv := range r.Moves {
			if mv.State == cluster.MoveFailed {
				t.Fatalf("move failed: %+v", mv)
			}
			if mv.State != cluster.MoveDone {
				return false
			}
		}
		return true
	})
	return r
}

// metaLeader returns the member leading the meta group.
func metaLeader(t *testing.T, ms []*member) *member {
	t.Helper()
	var l *member
	waitFor(t, 10*time.Second, "a meta leader", func() bool {
		for _, m := range ms {
			if m.node != nil && m.node.meta.IsLeader() {
				l = m
				return true
			}
		}
		return false
	})
	return l
}

// checkPlacement checks that the members run exactly the groups ring r
// places on them, that each group's Raft voters are its cohort, and that
// a node that gave a partition up stores nothing of it.
func checkPlacement(t *testing.T, ms []*member, r *cluster.Ring) {
	t.Helper()
	waitFor(t, 20*time.Second, "groups match the ring", func() bool {
		for _, m := range ms {
			if m.node == nil {
				continue
			}
			if got := m.node.ring.Load(); got == nil || got.Epoch < r.Epoch {
				return false
			}
			for p := range r.Partitions {
				if (m.node.group(uint16(p)) != nil) != r.Hosts(p, m.cfg.NodeID) {
					return false
				}
			}
		}
		return true
	})
	for p := range r.Partitions {
		cohort := slices.Clone(r.Cohort(p))
		slices.Sort(cohort)
		waitFor(t, 10*time.Second, fmt.Sprintf("partition %d's voters are its cohort %v", p, cohort), func() bool {
			for _, m := range ms {
				g := m.node.group(uint16(p))
				if m.node == nil || g == nil || !g.IsLeader() {
					continue
				}
				servers, err := g.Servers()
				if err != nil {
					return false
				}
				var voters []ring.NodeID
				for _, s := range servers {
					if s.Voter {
						voters = append(voters, ring.NodeID(s.ID))
					}
				}
				slices.Sort(voters)
				return slices.Equal(voters, cohort)
			}
			return false
		})
		for _, m := range ms {
			if m.node == nil || r.Hosts(p, m.cfg.NodeID) {
				continue
			}
			tasks, _, _, err := m.node.store.ScanTasks(uint16(p), 0, 1)
			if err != nil || len(tasks) > 0 {
				t.Fatalf("%s still stores tasks of partition %d it handed over (%d, %v)", m.cfg.NodeID, p, len(tasks), err)
			}
		}
	}
}

func TestRebalanceGrowDrainDecommission(t *testing.T) {
	ms := testClusterWith(t, 3, rebalanceTune)
	ids := make([]uint64, 0, 200)
	for i := range 200 {
		resp, err := ms[i%3].api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{
			Task: &nornv1.TaskSpec{Queue: "q", Payload: []byte(fmt.Sprint(i))}}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Msg.GetId())
	}
	n4, n5 := startJoiner(t, ms, 4), startJoiner(t, ms, 5)
	all := append(slices.Clone(ms), n4, n5)
	admin := adminClient(ms[2])
	ctx := context.Background()

	// A dry run changes nothing; a plan before the joins moves nothing.
	plan, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Msg.GetPlan().GetMoves()) != 0 {
		t.Fatalf("a plan over the formed cluster moves %d replicas", len(plan.Msg.GetPlan().GetMoves()))
	}
	for _, j := range []*member{n4, n5} {
		resp, err := admin.Join(ctx, connect.NewRequest(&nornv1.JoinRequest{Node: j.cfg.APIAddr}))
		if err != nil {
			t.Fatalf("join %s: %v", j.cfg.NodeID, err)
		}
		if resp.Msg.GetNodeId() != j.cfg.NodeID {
			t.Fatalf("join resolved %s, want %s", resp.Msg.GetNodeId(), j.cfg.NodeID)
		}
	}
	dry, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(dry.Msg.GetPlan().GetMoves()) == 0 {
		t.Fatal("the plan after two joins moves nothing")
	}
	if r := metaLeader(t, all).node.meta.Ring(); len(r.Moves) != 0 {
		t.Fatalf("a dry run queued %d moves", len(r.Moves))
	}
	applied, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Apply: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("grow 3 -> 5: %d moves", len(applied.Msg.GetPlan().GetMoves()))
	r := waitMovesDone(t, metaLeader(t, all), 2*time.Minute)
	loads := r.Loads(r.Placement)
	for _, j := range []*member{n4, n5} {
		if loads[j.cfg.NodeID] == 0 {
			t.Fatalf("%s holds nothing after the rebalance: %v", j.cfg.NodeID, loads)
		}
	}
	checkPlacement(t, all, r)
	checkAllReadable(t, n5, ids)

	// Drain n1: it holds nothing afterwards and still coordinates.
	if _, err := admin.Drain(ctx, connect.NewRequest(&nornv1.DrainRequest{Node: "n1", Apply: true})); err != nil {
		t.Fatal(err)
	}
	r = waitMovesDone(t, metaLeader(t, all), 2*time.Minute)
	if h := r.Holds("n1"); h != 0 {
		t.Fatalf("drained n1 still holds %d replicas", h)
	}
	checkPlacement(t, all, r)
	checkAllReadable(t, ms[0], ids)

	// Decommission n2: it leaves the ring and the meta group.
	if _, err := admin.Decommission(ctx, connect.NewRequest(&nornv1.DecommissionRequest{Node: "n2", Apply: true})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "n2 removed from the ring", func() bool {
		_, ok := metaLeader(t, all).node.meta.Ring().Node("n2")
		return !ok
	})
	r = metaLeader(t, all).node.meta.Ring()
	checkPlacement(t, all, r)
	voters, err := metaLeader(t, all).node.meta.Voters()
	if err != nil || slices.Contains(voters, "n2") {
		t.Fatalf("meta voters %v after decommissioning n2 (%v)", voters, err)
	}
	checkAllReadable(t, n4, ids)
}

// checkAllReadable reads every id through m with a majority read.
func checkAllReadable(t *testing.T, m *member, ids []uint64) {
	t.Helper()
	for _, id := range ids {
		if _, err := m.api.GetTask(context.Background(), connect.NewRequest(&nornv1.GetTaskRequest{Id: id})); err != nil {
			t.Fatalf("task %d: %v", id, err)
		}
	}
}
