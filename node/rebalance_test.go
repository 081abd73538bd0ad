package node

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cluster"
)

func TestRebalanceGrowDrainDecommission(t *testing.T) {
	ms := testClusterWith(t, 3, rebalanceTune)
	ids := enqueueN(t, ms, 200)
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
	if r := metaLeader(t, all).node.host.Meta().Ring(); len(r.Moves) != 0 {
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
		_, ok := metaLeader(t, all).node.host.Meta().Ring().Node("n2")
		return !ok
	})
	r = metaLeader(t, all).node.host.Meta().Ring()
	checkPlacement(t, all, r)
	voters, err := metaLeader(t, all).node.host.Meta().Voters()
	if err != nil || slices.Contains(voters, "n2") {
		t.Fatalf("meta voters %v after decommissioning n2 (%v)", voters, err)
	}
	checkAllReadable(t, n4, ids)
}

func TestRebalanceUnderLoad(t *testing.T) {
	ms := testClusterWith(t, 3, rebalanceTune)
	n4, n5 := startJoiner(t, ms, 4), startJoiner(t, ms, 5)
	all := append(slices.Clone(ms), n4, n5)
	var coordMu sync.Mutex
	coords := slices.Clone(all)
	load := startLoad(t, func() []*member {
		coordMu.Lock()
		defer coordMu.Unlock()
		return coords
	})
	admin := adminClient(ms[1])
	ctx := context.Background()
	time.Sleep(300 * time.Millisecond) // some tasks before the first move
	for _, j := range []*member{n4, n5} {
		if _, err := admin.Join(ctx, connect.NewRequest(&nornv1.JoinRequest{Node: j.cfg.NodeID})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Apply: true})); err != nil {
		t.Fatal(err)
	}
	waitMovesDone(t, metaLeader(t, all), 2*time.Minute)
	if _, err := admin.Drain(ctx, connect.NewRequest(&nornv1.DrainRequest{Node: "n3", Apply: true})); err != nil {
		t.Fatal(err)
	}
	r := waitMovesDone(t, metaLeader(t, all), 2*time.Minute)
	load.finish(t, n4)
	checkPlacement(t, all, r)
	checkRootsAgree(t, all, r)
}

// TestRebalanceResumesAfterRestarts restarts a move's target and then the
// meta leader while moves are under way: the moves finish and the
// placement is the planned one.
func TestRebalanceResumesAfterRestarts(t *testing.T) {
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		rebalanceTune(i, cfg)
		cfg.MaxMovesPerNode = 1 // slower: the restarts land mid-rebalance
	})
	n4 := startJoiner(t, ms, 4)
	admin := adminClient(ms[0])
	joinAndRebalance(t, admin, "n4")
	all := append(slices.Clone(ms), n4)
	underway := func() bool {
		r := metaLeader(t, all).node.host.Meta().Ring()
		return len(r.MovesUnderway()) > 0
	}
	waitFor(t, 20*time.Second, "a move under way", underway)
	n4 = restartMember(t, n4)
	all[3] = n4
	waitFor(t, 30*time.Second, "a move under way after the restart", func() bool {
		r := metaLeader(t, all).node.host.Meta().Ring()
		done := 0
		for _, m := range r.Moves {
			if m.State == cluster.MoveDone {
				done++
			}
		}
		return len(r.MovesUnderway()) > 0 && done > 0
	})
	l := metaLeader(t, all)
	i := slices.Index(all, l)
	all[i] = restartMember(t, l)
	r := waitMovesDone(t, metaLeader(t, all), 2*time.Minute)
	if r.Holds("n4") == 0 {
		t.Fatal("n4 holds nothing after the rebalance")
	}
	checkPlacement(t, all, r)
}

// TestRebalanceRollsBackWhenTargetDown stops the target of a rebalance
// mid-move for good: the moves not yet promoted roll back (or, queued,
// fail) after MoveTargetTimeout, the cohorts and groups are as before
// them, and remove --dead then takes the node out.
func TestRebalanceRollsBackWhenTargetDown(t *testing.T) {
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		rebalanceTune(i, cfg)
		cfg.MaxMovesPerNode = 1
		cfg.MoveTargetTimeout = 2 * time.Second
	})
	ids := enqueueN(t, ms, 100)
	n4 := startJoiner(t, ms, 4)
	admin := adminClient(ms[0])
	ctx := context.Background()
	plan := joinAndRebalance(t, admin, "n4")
	if len(plan.GetPlan().GetMoves()) < 2 {
		t.Fatalf("the plan moves %d replicas; the test needs queued ones", len(plan.GetPlan().GetMoves()))
	}
	waitFor(t, 20*time.Second, "a move to n4 filling or catching up", func() bool {
		for _, m := range metaLeader(t, ms).node.host.Meta().Ring().MovesUnderway() {
			if m.State.CanRollBack() {
				return true
			}
		}
		return false
	})
	n4.stop()
	r := waitMovesEnded(t, ms, time.Minute)
	rolledBack, failedQueued := 0, 0
	for _, m := range r.Moves {
		switch {
		case m.State == cluster.MoveDone:
		case strings.HasPrefix(m.Error, "rolled back: target n4 down for"):
			rolledBack++
		case strings.HasPrefix(m.Error, "target n4 down for"):
			failedQueued++
		default:
			t.Fatalf("move %+v", m)
		}
	}
	t.Logf("%d moves: %d rolled back, %d queued failed", len(r.Moves), rolledBack, failedQueued)
	if rolledBack == 0 || failedQueued == 0 {
		t.Fatalf("want a rolled back move and a failed queued one: %+v", r.Moves)
	}
	for p := range r.Partitions {
		if r.HostsReplica(p, "n4") != r.Hosts(p, "n4") {
			t.Fatalf("n4 still receives partition %d after the rollback", p)
		}
	}
	checkPlacement(t, ms, r)
	checkAllReadable(t, ms[1], ids)

	// The operator removes the dead node: its replicas (of moves done
	// before it died) are made again on the others, and it leaves.
	if _, err := admin.Remove(ctx, connect.NewRequest(&nornv1.RemoveRequest{Node: "n4", Dead: true, Apply: true})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "n4 removed from the ring", func() bool {
		_, ok := metaLeader(t, ms).node.host.Meta().Ring().Node("n4")
		return !ok
	})
	checkPlacement(t, ms, metaLeader(t, ms).node.host.Meta().Ring())
	checkAllReadable(t, ms[2], ids)
}

// TestRebalanceCancel cancels a rebalance under way: queued moves fail,
// moves not yet promoted roll back, promoted ones finish; the groups and
// stores match the resulting ring, and a new rebalance then completes.
func TestRebalanceCancel(t *testing.T) {
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		rebalanceTune(i, cfg)
		cfg.MaxMovesPerNode = 1
	})
	ids := enqueueN(t, ms, 100)
	n4 := startJoiner(t, ms, 4)
	all := append(slices.Clone(ms), n4)
	admin := adminClient(ms[1])
	ctx := context.Background()
	if _, err := admin.Join(ctx, connect.NewRequest(&nornv1.JoinRequest{Node: "n4"})); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Cancel: true, Apply: true})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("cancel with apply: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Apply: true})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a move under way", func() bool {
		return len(metaLeader(t, all).node.host.Meta().Ring().MovesUnderway()) > 0
	})
	resp, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Cancel: true}))
	if err != nil {
		t.Fatal(err)
	}
	cancelled := 0
	for _, m := range resp.Msg.GetPlan().GetMoves() {
		if m.GetState() == string(cluster.MoveRollingBack) || m.GetError() == "cancelled" {
			cancelled++
		}
	}
	if cancelled == 0 {
		t.Fatalf("cancel gave up no move: %v", resp.Msg.GetPlan().GetMoves())
	}
	r := waitMovesEnded(t, all, time.Minute)
	for _, m := range r.Moves {
		if m.State == cluster.MoveFailed && m.Error != "cancelled" && m.Error != "rolled back: cancelled" {
			t.Fatalf("move %+v", m)
		}
	}
	checkPlacement(t, all, r)
	checkAllReadable(t, n4, ids)

	// A new plan after the cancel goes through.
	if _, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Apply: true})); err != nil {
		t.Fatal(err)
	}
	r = waitMovesDone(t, metaLeader(t, all), time.Minute)
	if r.Holds("n4") == 0 {
		t.Fatal("n4 holds nothing after the second rebalance")
	}
	checkPlacement(t, all, r)
}

// TestAutoRebalance: with AutoRebalance the meta leader gives a joined
// node replicas by itself, and replaces a member dead for AutoDeadAfter.
func TestAutoRebalance(t *testing.T) {
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		rebalanceTune(i, cfg)
		cfg.AutoRebalance = true
		cfg.AutoDeadAfter = 3 * time.Second
	})
	ids := enqueueN(t, ms, 100)
	n4 := startJoiner(t, ms, 4)
	all := append(slices.Clone(ms), n4)
	if _, err := adminClient(ms[0]).Join(context.Background(), connect.NewRequest(&nornv1.JoinRequest{Node: "n4"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "moves to n4 planned by the meta leader", func() bool {
		return len(metaLeader(t, all).node.host.Meta().Ring().Moves) > 0
	})
	r := waitMovesDone(t, metaLeader(t, all), time.Minute)
	if r.Holds("n4") == 0 {
		t.Fatal("n4 holds nothing after the auto rebalance")
	}
	checkPlacement(t, all, r)

	// n4 dies for good: after AutoDeadAfter it is removed and its
	// replicas are made again on the others.
	n4.stop()
	waitFor(t, time.Minute, "n4 removed from the ring", func() bool {
		_, ok := metaLeader(t, ms).node.host.Meta().Ring().Node("n4")
		return !ok
	})
	r = metaLeader(t, ms).node.host.Meta().Ring()
	for p := range r.Partitions {
		if len(r.Cohort(p)) != 3 {
			t.Fatalf("partition %d has cohort %v", p, r.Cohort(p))
		}
	}
	checkPlacement(t, ms, r)
	checkAllReadable(t, ms[1], ids)
}
