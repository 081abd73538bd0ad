package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/durationpb"

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
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
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
	waitFor(t, 20*time.Second, m.cfg.NodeID+" has the ring", func() bool { return m.node.host.Ring() != nil })
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
		r = m.node.host.Meta().Ring()
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
			if m.node != nil && m.node.host.Meta().IsLeader() {
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
			if got := m.node.host.Ring(); got == nil || got.Epoch < r.Epoch {
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
				if m.node == nil {
					continue
				}
				g := m.node.group(uint16(p))
				if g == nil || !g.IsLeader() {
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

// checkAllReadable reads every id through m with a majority read.
func checkAllReadable(t *testing.T, m *member, ids []uint64) {
	t.Helper()
	for _, id := range ids {
		if _, err := m.api.GetTask(context.Background(), connect.NewRequest(&nornv1.GetTaskRequest{Id: id})); err != nil {
			t.Fatalf("task %d: %v", id, err)
		}
	}
}

// loadRun is continuous enqueue and claim+complete load on a cluster:
// what it acked and how often each task was granted.
type loadRun struct {
	mu      sync.Mutex
	acked   []uint64
	grants  map[uint64]int
	failed  int // enqueues not acked (retried by a real client)
	stop    chan struct{}
	stopped sync.WaitGroup
}

// startLoad runs 2 enqueuers and 2 workers against the members in turn
// (leases of a minute: no claim may expire during a test, so a second
// grant of a task is a double claim).
func startLoad(t *testing.T, coords func() []*member) *loadRun {
	l := &loadRun{grants: map[uint64]int{}, stop: make(chan struct{})}
	ctx := context.Background()
	for w := range 2 {
		l.stopped.Add(2)
		go func() {
			defer l.stopped.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				cs := coords()
				c := cs[(i+w)%len(cs)]
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := c.api.Enqueue(cctx, connect.NewRequest(&nornv1.EnqueueRequest{
					Task: &nornv1.TaskSpec{Queue: "load", Payload: []byte(fmt.Sprint(i))}}))
				cancel()
				l.mu.Lock()
				if err == nil {
					l.acked = append(l.acked, resp.Msg.GetId())
				} else {
					l.failed++
				}
				l.mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
		go func() {
			defer l.stopped.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				cs := coords()
				c := cs[(i+w+1)%len(cs)]
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := c.api.Claim(cctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "load", Worker: fmt.Sprint("w", w),
					Max: 8, Lease: durationpb.New(time.Minute), Wait: durationpb.New(200 * time.Millisecond)}))
				cancel()
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				for _, ct := range resp.Msg.GetTasks() {
					l.mu.Lock()
					l.grants[ct.GetTask().GetId()]++
					l.mu.Unlock()
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, _ = c.api.Complete(cctx, connect.NewRequest(&nornv1.CompleteRequest{Id: ct.GetTask().GetId(), ClaimId: ct.GetClaimId()}))
					cancel()
				}
			}
		}()
	}
	return l
}

// finish stops the load and checks its promises: every acked task is
// readable, no task was granted twice, and enough happened to mean
// something.
func (l *loadRun) finish(t *testing.T, reader *member) {
	t.Helper()
	close(l.stop)
	l.stopped.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("load: %d enqueues acked, %d not; %d tasks claimed", len(l.acked), l.failed, len(l.grants))
	if len(l.acked) < 100 || len(l.grants) < 50 {
		t.Fatalf("too little load to judge: %d acked, %d claimed", len(l.acked), len(l.grants))
	}
	for id, n := range l.grants {
		if n > 1 {
			t.Errorf("task %d was granted %d times while its first lease (1 min) held", id, n)
		}
	}
	checkAllReadable(t, reader, l.acked)
}

// checkRootsAgree waits until every replica of every partition has the
// same Merkle root.
func checkRootsAgree(t *testing.T, ms []*member, r *cluster.Ring) {
	t.Helper()
	waitFor(t, 30*time.Second, "replicas agree", func() bool {
		for p := range r.Partitions {
			var roots []uint64
			for _, m := range ms {
				if m.node == nil || !r.Hosts(p, m.cfg.NodeID) {
					continue
				}
				tr := m.node.ae.Tree(uint16(p))
				if tr == nil {
					return false
				}
				roots = append(roots, tr.Root())
			}
			if len(roots) != r.Replication || slices.Min(roots) != slices.Max(roots) {
				return false
			}
		}
		return true
	})
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

// restartMember stops m and starts it again on the same data dir and
// addresses (the Raft and gossip ports it was given are fixed first).
func restartMember(t *testing.T, m *member) *member {
	t.Helper()
	cfg := m.cfg
	cfg.RaftAddr, cfg.GossipAddr = m.node.RaftAddr(), m.node.GossipAddr()
	m.stop()
	return startMember(t, cfg)
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
	ctx := context.Background()
	if _, err := admin.Join(ctx, connect.NewRequest(&nornv1.JoinRequest{Node: "n4"})); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Apply: true})); err != nil {
		t.Fatal(err)
	}
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

// enqueueN enqueues n tasks through the members in turn and returns their
// ids.
func enqueueN(t *testing.T, ms []*member, n int) []uint64 {
	t.Helper()
	ids := make([]uint64, 0, n)
	for i := range n {
		resp, err := ms[i%len(ms)].api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{
			Task: &nornv1.TaskSpec{Queue: "q", Payload: []byte(fmt.Sprint(i))}}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Msg.GetId())
	}
	return ids
}

// waitMovesEnded waits until no move of m's meta ring is queued or under
// way and returns that ring.
func waitMovesEnded(t *testing.T, ms []*member, timeout time.Duration) *cluster.Ring {
	t.Helper()
	var r *cluster.Ring
	waitFor(t, timeout, "every move ended", func() bool {
		r = metaLeader(t, ms).node.host.Meta().Ring()
		for _, mv := range r.Moves {
			if !mv.State.Ended() {
				return false
			}
		}
		return true
	})
	return r
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
	if _, err := admin.Join(ctx, connect.NewRequest(&nornv1.JoinRequest{Node: "n4"})); err != nil {
		t.Fatal(err)
	}
	plan, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Apply: true}))
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Msg.GetPlan().GetMoves()) < 2 {
		t.Fatalf("the plan moves %d replicas; the test needs queued ones", len(plan.Msg.GetPlan().GetMoves()))
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
