package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// clusterNode is one nornd process of a test cluster, with fixed ports so
// that it restarts where it was.
type clusterNode struct {
	id                  string
	dir                 string
	api, raftA, gossipA string
	join                []string
	proc                *process
	tasks               nornv1connect.TaskServiceClient
	admin               nornv1connect.AdminServiceClient
	flags               []string // more nornd flags
	// hc and scheme reach the API over TLS (tls_test.go); nil and "":
	// http.DefaultClient and http.
	hc     *http.Client
	scheme string
}

func (c *clusterNode) start(t *testing.T, i int) {
	t.Helper()
	cmd := exec.Command(norndBin, "-node-id", c.id, "-machine-id", fmt.Sprint(i+1), "-data-dir", c.dir,
		"-listen", c.api, "-raft-addr", c.raftA, "-gossip-addr", c.gossipA,
		"-bootstrap-expect", "3", "-join", strings.Join(c.join, ","),
		"-partitions", "8", "-raft-timeout", "300ms", "-write-timeout", "2s", "-log-level", "warn")
	cmd.Args = append(cmd.Args, c.flags...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, addr: c.api}
	c.proc = p
	t.Cleanup(p.kill)
}

func (c *clusterNode) healthy() bool {
	hc, scheme := http.DefaultClient, "http"
	if c.hc != nil {
		hc, scheme = c.hc, c.scheme
	}
	resp, err := hc.Get(scheme + "://" + c.api + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startCluster starts three nornd processes that form a cluster (P=8,
// N=3) and waits until each is healthy.
func startCluster(t *testing.T) []*clusterNode {
	t.Helper()
	return startClusterWith(t)
}

// startClusterWith is startCluster with more nornd flags on every node
// (a flag given again wins over startCluster's).
func startClusterWith(t *testing.T, flags ...string) []*clusterNode {
	t.Helper()
	ns := make([]*clusterNode, 3)
	addrs := freeAddrs(t, 3*len(ns))
	for i := range ns {
		ns[i] = &clusterNode{id: fmt.Sprintf("n%d", i+1), dir: t.TempDir(),
			api: addrs[3*i], raftA: addrs[3*i+1], gossipA: addrs[3*i+2], flags: flags}
		ns[i].tasks = client(ns[i].api)
		ns[i].admin = nornv1connect.NewAdminServiceClient(http.DefaultClient, "http://"+ns[i].api)
	}
	joinAndStart(t, ns)
	return ns
}

// joinAndStart has every node join the others' gossip, starts them all
// and waits until each is healthy.
func joinAndStart(t *testing.T, ns []*clusterNode) {
	t.Helper()
	for i, n := range ns {
		for j, o := range ns {
			if i != j {
				n.join = append(n.join, o.gossipA)
			}
		}
	}
	for i, n := range ns {
		n.start(t, i)
	}
	waitAllHealthy(t, ns)
}

func waitAllHealthy(t *testing.T, ns []*clusterNode) {
	t.Helper()
	waitUntil(t, 30*time.Second, "a healthy cluster", func() bool {
		for _, n := range ns {
			if n.proc.cmd.ProcessState == nil && !n.healthy() {
				return false
			}
		}
		return true
	})
}

// leaders returns each partition's leader as n sees it.
func (c *clusterNode) leaders(t *testing.T) []string {
	t.Helper()
	resp, err := c.admin.Status(context.Background(), connect.NewRequest(&nornv1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range resp.Msg.Partitions {
		out = append(out, p.Leader)
	}
	return out
}

func enqueueN(t *testing.T, api nornv1connect.TaskServiceClient, queue string, count int, w uint32) []uint64 {
	t.Helper()
	var ids []uint64
	for i := range count {
		r, err := api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{
			Task: &nornv1.TaskSpec{Queue: queue, Payload: []byte(fmt.Sprint(i))}, W: w}))
		if err != nil {
			t.Fatalf("enqueue %d: %v", i, err)
		}
		ids = append(ids, r.Msg.Id)
	}
	return ids
}

// TestClusterKillOneNode kills (SIGKILL) the node that leads the most
// partitions: writes with W=2 and claims keep working through the other
// two, every partition has a leader again within 10 s, no acked task is
// lost, every unclaimed one is claimed within 10 s, and no task is handed
// out twice while its lease holds.
func TestClusterKillOneNode(t *testing.T) {
	ns := startCluster(t)
	ctx := context.Background()
	before := enqueueN(t, ns[0].tasks, "q", 30, 2)
	// Claim a third with a long lease before the kill.
	held := claimAll(t, ns[1:2], 10, nil)
	if len(held) != 10 {
		t.Fatalf("claimed %d of 10 tasks before the kill", len(held))
	}
	count := map[string]int{}
	for _, l := range ns[0].leaders(t) {
		count[l]++
	}
	victim := 0
	for i, n := range ns {
		if count[n.id] > count[ns[victim].id] {
			victim = i
		}
	}
	t.Logf("killing %s, leader of %d of 8 partitions", ns[victim].id, count[ns[victim].id])
	killed := time.Now()
	ns[victim].proc.kill()
	var alive []*clusterNode
	for i, n := range ns {
		if i != victim {
			alive = append(alive, n)
		}
	}
	waitUntil(t, 10*time.Second, "a leader for every partition", func() bool {
		for _, l := range alive[0].leaders(t) {
			if l == "" || l == ns[victim].id {
				return false
			}
		}
		return true
	})
	t.Logf("every partition has a leader %s after the kill", time.Since(killed).Round(time.Millisecond))
	after := enqueueN(t, alive[1].tasks, "q", 30, 2)
	// Everything acked is readable from the survivors.
	for _, id := range append(before, after...) {
		if _, err := alive[0].tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id})); err != nil {
			t.Fatalf("acked task %d: %v", id, err)
		}
	}
	// The rest is claimable, each task once; the held ones are not.
	got := claimAll(t, alive, 50, held)
	if len(got) != 50 {
		t.Fatalf("claimed %d of the 50 unclaimed tasks in 10 s after the kill; the partitions' leaders as the survivors see them: %v, %v",
			len(got), alive[0].leaders(t), alive[1].leaders(t))
	}
}

// claimAll claims from nodes in turn, with a long lease, until it holds
// want tasks or 10 s pass, and fails on a task handed out twice or one in
// held. A claim hands out the tasks of the partitions that have a leader
// at that moment, and on a loaded machine a node that stalls past the
// leader lease (half the Raft timeout) steps down: its partitions have no
// leader for a while. So it long-polls (a new leader wakes the claim).
func claimAll(t *testing.T, nodes []*clusterNode, want int, held map[uint64]bool) map[uint64]bool {
	t.Helper()
	got := map[uint64]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for round := 0; len(got) < want && time.Now().Before(deadline); round++ {
		r, err := nodes[round%len(nodes)].tasks.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{
			Queue: "q", Worker: "w", Max: uint32(want - len(got)), Lease: durationpb.New(time.Hour), Wait: durationpb.New(time.Second)}))
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		for _, c := range r.Msg.Tasks {
			if got[c.Task.Id] || held[c.Task.Id] {
				t.Fatalf("task %d handed out twice while its lease holds", c.Task.Id)
			}
			got[c.Task.Id] = true
		}
	}
	return got
}

// TestClusterRestartAll kills all three processes and starts them again
// from their data dirs: the cluster re-forms by itself and every acked
// task, claim and completion is still there.
func TestClusterRestartAll(t *testing.T) {
	ns := startCluster(t)
	ctx := context.Background()
	ids := enqueueN(t, ns[2].tasks, "q", 40, 2)
	r, err := ns[0].tasks.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "q", Worker: "w", Max: 20, Lease: durationpb.New(time.Hour)}))
	if err != nil || len(r.Msg.Tasks) != 20 {
		t.Fatalf("claim: %d, %v", len(r.Msg.GetTasks()), err)
	}
	completed, claimed := map[uint64]bool{}, map[uint64]uint64{}
	for i, c := range r.Msg.Tasks {
		if i%2 == 0 {
			if _, err := ns[1].tasks.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: c.Task.Id, ClaimId: c.ClaimId})); err != nil {
				t.Fatal(err)
			}
			completed[c.Task.Id] = true
		} else {
			claimed[c.Task.Id] = c.ClaimId
		}
	}
	for _, n := range ns {
		n.proc.kill()
	}
	for i, n := range ns {
		n.start(t, i)
	}
	waitAllHealthy(t, ns)
	for _, id := range ids {
		g, err := ns[1].tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id}))
		if err != nil {
			t.Fatalf("acked task %d after restart: %v", id, err)
		}
		st := g.Msg.Task.Status
		switch {
		case completed[id] && st != nornv1.TaskStatus_TASK_STATUS_COMPLETED:
			t.Fatalf("completed task %d is %v", id, st)
		case claimed[id] != 0 && (st != nornv1.TaskStatus_TASK_STATUS_CLAIMED || g.Msg.Task.CurrentClaim.GetClaimId() != claimed[id]):
			t.Fatalf("claimed task %d is %v", id, st)
		case !completed[id] && claimed[id] == 0 && st != nornv1.TaskStatus_TASK_STATUS_READY:
			t.Fatalf("ready task %d is %v", id, st)
		}
	}
	// The claims still hold: only the 20 unclaimed tasks come out.
	got := 0
	for round := 0; round < 10; round++ {
		r, err := ns[round%3].tasks.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "q", Worker: "w", Max: 50}))
		if err != nil {
			t.Fatal(err)
		}
		got += len(r.Msg.Tasks)
	}
	if got != 20 {
		t.Fatalf("claimed %d tasks after the restart, want the 20 unclaimed", got)
	}
}

// TestClusterNodeCutOff pauses two nodes (SIGSTOP) so the third is alone:
// enqueue with W=1 there succeeds, claims there fail with UNAVAILABLE
// within the request deadline, and after SIGCONT the task reaches the
// other replicas.
func TestClusterNodeCutOff(t *testing.T) {
	ns := startCluster(t)
	ctx := context.Background()
	lone := ns[0]
	for _, n := range ns[1:] {
		if err := n.proc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	resumed := false
	resume := func() {
		if !resumed {
			for _, n := range ns[1:] {
				n.proc.cmd.Process.Signal(syscall.SIGCONT)
			}
			resumed = true
		}
	}
	t.Cleanup(resume)
	r, err := lone.tasks.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
		Task: &nornv1.TaskSpec{Queue: "cut"}, W: 1}))
	if err != nil || r.Msg.Acks < 1 {
		t.Fatalf("enqueue W=1 on the lone node: %v", err)
	}
	id := r.Msg.Id
	// Let the lone node's leaderships lapse, then claim with a deadline.
	waitUntil(t, 10*time.Second, "the lone node to lead nothing", func() bool {
		for _, l := range lone.leaders(t) {
			if l == lone.id {
				return false
			}
		}
		return true
	})
	cctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	start := time.Now()
	_, err = lone.tasks.Claim(cctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "cut", Worker: "w", Max: 1}))
	cancel()
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("claim on a cut-off node: %v (after %s)", err, time.Since(start))
	}
	resume()
	// After SIGCONT, reading the task with R=3 repairs the replicas that
	// missed it; each then counts it in its own store.
	waitUntil(t, 20*time.Second, "the task on every replica", func() bool {
		_, err := lone.tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 3}))
		if err != nil {
			return false
		}
		for _, n := range ns[1:] {
			c, err := n.tasks.CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{Queue: "cut"}))
			if err != nil || c.Msg.Total != 1 {
				return false
			}
		}
		return true
	})
}
