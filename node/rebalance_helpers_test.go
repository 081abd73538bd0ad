package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
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
	// Every member sees it in gossip: whichever leads the meta group
	// takes a Join of it (under load gossip may lag the ring's pull).
	waitFor(t, 20*time.Second, "every member to see "+m.cfg.NodeID+" in gossip", func() bool {
		for _, o := range ms {
			if o.node != nil && !o.node.host.Alive()[m.cfg.NodeID] {
				return false
			}
		}
		return true
	})
	return m
}

// joinAndRebalance makes node a member through admin and applies a
// rebalance; it returns the plan.
func joinAndRebalance(t *testing.T, admin nornv1connect.AdminServiceClient, node string) *nornv1.RebalanceResponse {
	t.Helper()
	ctx := context.Background()
	if _, err := admin.Join(ctx, connect.NewRequest(&nornv1.JoinRequest{Node: node})); err != nil {
		t.Fatal(err)
	}
	plan, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Apply: true}))
	if err != nil {
		t.Fatal(err)
	}
	return plan.Msg
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
		if r == nil {
			return false // m restarted and has not replayed the meta log yet
		}
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

// metaLeader returns the member leading the meta group, once it has
// applied every entry its predecessors committed (cluster.Meta.LeaderReady:
// a Raft barrier), so that its Meta().Ring() is the group's latest ring: a
// replica elected right after a restart leads before it has replayed its
// log, and its ring is nil or stale until then.
func metaLeader(t *testing.T, ms []*member) *member {
	t.Helper()
	var l *member
	waitFor(t, 10*time.Second, "a meta leader with its log applied", func() bool {
		for _, m := range ms {
			if m.node != nil && m.node.host.Meta().LeaderReady(time.Second) == nil {
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
			// A node that handed p over drops its data right after it
			// closes p's group, in the same reconcile pass (a failed drop
			// is retried every pass): it is never left behind.
			waitFor(t, 10*time.Second, fmt.Sprintf("%s to drop the tasks of partition %d it handed over", m.cfg.NodeID, p), func() bool {
				tasks, _, _, err := m.node.store.ScanTasks(uint16(p), 0, 1)
				return err == nil && len(tasks) == 0
			})
		}
	}
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

// restartMember stops m and starts it again on the same data dir and
// addresses (the Raft and gossip ports it was given are fixed first).
func restartMember(t *testing.T, m *member) *member {
	t.Helper()
	cfg := m.cfg
	cfg.RaftAddr, cfg.GossipAddr = m.node.RaftAddr(), m.node.GossipAddr()
	m.stop()
	return startMember(t, cfg)
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
