package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// churnLoad is enqueue and claim+complete load through every live node:
// what was acked and how often each task was granted.
type churnLoad struct {
	mu     sync.Mutex
	acked  []uint64
	grants map[uint64]int
	// held is each task's last grant's lease end; overlaps are second
	// grants before it (an uncompleted claim expires after its minute and
	// may be granted again: that is no overlap).
	held     map[uint64]time.Time
	overlaps []string
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startChurnLoad(nodes func() []*clusterNode) *churnLoad {
	l := &churnLoad{grants: map[uint64]int{}, held: map[uint64]time.Time{}, stop: make(chan struct{})}
	ctx := context.Background()
	for w := range 2 {
		l.wg.Add(2)
		go func() { // enqueuer
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				ns := nodes()
				c := ns[(i+w)%len(ns)]
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				r, err := c.tasks.Enqueue(cctx, connect.NewRequest(&nornv1.EnqueueRequest{
					Task: &nornv1.TaskSpec{Queue: "churn", Payload: []byte(fmt.Sprint(i))}, W: 2}))
				cancel()
				if err == nil {
					l.mu.Lock()
					l.acked = append(l.acked, r.Msg.Id)
					l.mu.Unlock()
				} else {
					time.Sleep(20 * time.Millisecond)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
		go func() { // worker
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				ns := nodes()
				c := ns[(i+w+1)%len(ns)]
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				r, err := c.tasks.Claim(cctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "churn", Worker: fmt.Sprint("w", w), Max: 8,
					Lease: durationpb.New(time.Minute), Wait: durationpb.New(200 * time.Millisecond)}))
				cancel()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				now := time.Now()
				for _, ct := range r.Msg.Tasks {
					l.mu.Lock()
					l.grants[ct.Task.Id]++
					if end, ok := l.held[ct.Task.Id]; ok && now.Before(end) {
						l.overlaps = append(l.overlaps, fmt.Sprintf("task %d granted again %s before its lease ended",
							ct.Task.Id, end.Sub(now).Round(time.Millisecond)))
					}
					l.held[ct.Task.Id] = ct.Expiry.AsTime()
					l.mu.Unlock()
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, _ = c.tasks.Complete(cctx, connect.NewRequest(&nornv1.CompleteRequest{Id: ct.Task.Id, ClaimId: ct.ClaimId}))
					cancel()
				}
			}
		}()
	}
	return l
}

// status asks node c for its Status.
func (c *clusterNode) status(t *testing.T, counts bool) *nornv1.StatusResponse {
	t.Helper()
	resp, err := c.admin.Status(context.Background(), connect.NewRequest(&nornv1.StatusRequest{SkipCounts: !counts}))
	if err != nil {
		t.Fatalf("status of %s: %v", c.id, err)
	}
	return resp.Msg
}

// waitRebalanced waits until c has the ring of the plan applied at epoch
// (or a later one) and every move of it is done (none failed).
func waitRebalanced(t *testing.T, c *clusterNode, epoch uint64, timeout time.Duration) {
	t.Helper()
	waitUntil(t, timeout, "every move done", func() bool {
		resp, err := c.admin.Status(context.Background(), connect.NewRequest(&nornv1.StatusRequest{SkipCounts: true}))
		if err != nil || resp.Msg.RingEpoch < epoch {
			return false
		}
		for _, m := range resp.Msg.Moves {
			if m.State == "failed" {
				t.Fatalf("move failed: %v", m)
			}
			if m.State != "done" {
				return false
			}
		}
		return len(resp.Msg.Moves) > 0
	})
}

// TestClusterRebalanceUnderLoad grows a cluster of nornd processes from 3
// to 5 under continuous load, kills -9 a move's target in the middle of
// its move and restarts it, then drains one node and decommissions
// another. Afterwards no acked task is lost, no task was granted twice
// while its lease held, every partition has its N replicas on the planned
// nodes with the planned Raft leaders among them, and replicas agree.
func TestClusterRebalanceUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process rebalance: skipped in -short")
	}
	start := time.Now()
	ns := startCluster(t)
	addrs := freeAddrs(t, 6)
	for i := range 2 {
		j := &clusterNode{id: fmt.Sprintf("n%d", 4+i), dir: t.TempDir(),
			api: addrs[3*i], raftA: addrs[3*i+1], gossipA: addrs[3*i+2],
			join:  []string{ns[0].gossipA, ns[1].gossipA},
			flags: []string{"-antientropy-interval", "1s", "-max-moves-per-node", "1"}}
		j.tasks = client(j.api)
		j.admin = nornv1connect.NewAdminServiceClient(http.DefaultClient, "http://"+j.api)
		j.start(t, 3+i)
		ns = append(ns, j)
	}
	waitAllHealthy(t, ns)
	var liveMu sync.Mutex
	live := append([]*clusterNode(nil), ns...)
	load := startChurnLoad(func() []*clusterNode {
		liveMu.Lock()
		defer liveMu.Unlock()
		return live
	})
	defer func() {
		select {
		case <-load.stop:
		default:
			close(load.stop)
		}
		load.wg.Wait()
	}()
	ctx := context.Background()
	admin := ns[0].admin
	for _, j := range ns[3:] {
		if _, err := admin.Join(ctx, connect.NewRequest(&nornv1.JoinRequest{Node: j.api})); err != nil {
			t.Fatalf("join %s: %v", j.id, err)
		}
	}
	grow, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Apply: true}))
	if err != nil {
		t.Fatal(err)
	}
	// kill -9 n4 while a move to it is under way; restart it.
	n4 := ns[3]
	waitUntil(t, 30*time.Second, "a move to n4 under way", func() bool {
		for _, m := range ns[0].status(t, false).Moves {
			if m.ToNode == "n4" && (m.State == "filling" || m.State == "catching-up") {
				return true
			}
		}
		return false
	})
	liveMu.Lock()
	live = []*clusterNode{ns[0], ns[1], ns[2], ns[4]}
	liveMu.Unlock()
	n4.proc.kill()
	time.Sleep(time.Second)
	n4.start(t, 3)
	waitAllHealthy(t, ns)
	liveMu.Lock()
	live = append([]*clusterNode(nil), ns...)
	liveMu.Unlock()
	waitRebalanced(t, ns[1], grow.Msg.Plan.RingEpoch, 3*time.Minute)
	t.Logf("%s: grown to 5 nodes (%d moves)", time.Since(start).Round(time.Second), len(grow.Msg.Plan.Moves))

	drain, err := ns[2].admin.Drain(ctx, connect.NewRequest(&nornv1.DrainRequest{Node: "n1", Apply: true}))
	if err != nil {
		t.Fatal(err)
	}
	waitRebalanced(t, ns[2], drain.Msg.Plan.RingEpoch, 3*time.Minute)
	t.Logf("%s: n1 drained", time.Since(start).Round(time.Second))
	if _, err := ns[2].admin.Decommission(ctx, connect.NewRequest(&nornv1.DecommissionRequest{Node: "n2", Apply: true})); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 3*time.Minute, "n2 decommissioned", func() bool {
		for _, nd := range ns[2].status(t, false).Nodes {
			if nd.Id == "n2" {
				return nd.Role == "not a member" && nd.Replicas == 0
			}
		}
		return false
	})
	t.Logf("%s: n2 decommissioned", time.Since(start).Round(time.Second))
	close(load.stop)
	load.wg.Wait()

	t.Logf("load: %d enqueues acked, %d tasks claimed", len(load.acked), len(load.grants))
	if len(load.acked) < 100 || len(load.grants) < 50 {
		t.Fatalf("too little load to judge: %d acked, %d claimed", len(load.acked), len(load.grants))
	}
	regranted := 0
	for _, n := range load.grants {
		if n > 1 {
			regranted++
		}
	}
	t.Logf("%d tasks granted again after their lease ended (their complete failed)", regranted)
	for _, o := range load.overlaps {
		t.Error(o)
	}
	for _, id := range load.acked {
		if _, err := ns[4].tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id})); err != nil {
			t.Fatalf("acked task %d: %v", id, err)
		}
	}
	// Every partition: N replicas, on the ring's cohort, with one Raft
	// configuration, and agreeing roots. n1 is drained (a member holding
	// nothing), n2 is out.
	members := map[string]*clusterNode{"n3": ns[2], "n4": ns[3], "n5": ns[4]}
	waitUntil(t, 60*time.Second, "every partition on n3, n4, n5 with agreeing replicas", func() bool {
		seen := map[uint32]int{}
		for id, c := range members {
			st, err := c.admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{}))
			if err != nil {
				return false
			}
			for _, p := range st.Msg.Partitions {
				if !p.ReplicasAgree || len(p.Cohort) != 3 || p.Leader == "" || members[p.Leader] == nil {
					return false
				}
				for _, m := range p.Cohort {
					if members[m] == nil {
						t.Fatalf("partition %d on %s has cohort member %s", p.Id, id, m)
					}
				}
				seen[p.Id]++
			}
		}
		for p := range uint32(8) {
			if seen[p] != 3 {
				return false
			}
		}
		return true
	})
	t.Logf("%s: checked", time.Since(start).Round(time.Second))
	if st := ns[0].status(t, false); len(st.Partitions) != 0 {
		t.Fatalf("drained n1 still replicates %d partitions", len(st.Partitions))
	}
}
