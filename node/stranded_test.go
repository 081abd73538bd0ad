package node

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// A claim that finds nothing while partitions holding ready tasks have no
// reachable leader answers UNAVAILABLE (retryable, with the reason), not an
// empty list a worker would take for an empty queue; once leaders are back,
// the same claim gets the tasks.
func TestClaimWithoutLeadersIsUnavailable(t *testing.T) {
	ms := testCluster(t, 3)
	ctx := context.Background()
	const n = 12
	for range n {
		// W=3: the survivor holds every task.
		if _, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
			Task: &nornv1.TaskSpec{Queue: "s"}, W: 3})); err != nil {
			t.Fatal(err)
		}
	}
	// An empty queue is not a stranded one: an empty answer.
	resp, err := ms[0].api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "empty", Worker: "w", Max: 4}))
	if err != nil || len(resp.Msg.Tasks) != 0 {
		t.Fatalf("claim of an empty queue = %v, %v; want nothing, no error", resp, err)
	}

	// Two of three gone: no partition can elect a leader.
	back := ms[1].cfg
	back.RaftAddr, back.GossipAddr = ms[1].node.RaftAddr(), ms[1].node.GossipAddr()
	ms[1].stop()
	ms[2].stop()
	waitFor(t, 10*time.Second, "no leader on the survivor", func() bool {
		for _, g := range ms[0].node.groupList() {
			if g.IsLeader() {
				return false
			}
		}
		return true
	})
	for _, wait := range []time.Duration{0, 300 * time.Millisecond} {
		start := time.Now()
		_, err := ms[0].api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{
			Queue: "s", Worker: "w", Max: 4, Wait: durationpb.New(wait)}))
		wantCode(t, err, connect.CodeUnavailable)
		if !strings.Contains(err.Error(), "no reachable leader") || !strings.Contains(err.Error(), `"s"`) {
			t.Fatalf("wait %v: error %q does not say why", wait, err)
		}
		if took := time.Since(start); took < wait {
			t.Fatalf("wait %v: answered after %v, before its wait ended", wait, took)
		}
	}
	// No node can answer for any partition: even a queue this replica
	// holds nothing of is out of reach, not known empty.
	_, err = ms[0].api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "empty", Worker: "w", Max: 4}))
	wantCode(t, err, connect.CodeUnavailable)

	// One back: leaders are elected, and a long-polling claim started
	// before that gets tasks.
	done := make(chan int, 1)
	go func() {
		got := 0
		deadline := time.Now().Add(20 * time.Second)
		for got == 0 && time.Now().Before(deadline) {
			resp, err := ms[0].api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{
				Queue: "s", Worker: "w", Max: 4, Wait: durationpb.New(2 * time.Second)}))
			if err == nil {
				got = len(resp.Msg.Tasks)
			}
		}
		done <- got
	}()
	startMember(t, back)
	if got := <-done; got == 0 {
		t.Fatal("no task claimed after a leader came back")
	}
}

// The case: a node restarted on its data serves the API before
// its partitions have elected leaders. A claim then answers UNAVAILABLE
// (it said {} before), and a long poll gets the task once they have.
func TestClaimBeforeLeadersAfterRestart(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, nil)
	id := h.enqueue(&nornv1.TaskSpec{Queue: "r"})
	clock := h.clock
	h.close()

	// Elections take at least a second on this restart.
	cfg := Config{
		DataDir: dir, Partitions: 8, Clock: clock,
		SkewBuffer: testSkew, LeaseGrace: 5 * time.Second,
		MonitorInterval: 20 * time.Millisecond,
		RaftTimeout:     time.Second,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		RaftLogger:      hclog.NewNullLogger(),
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	srv := httptest.NewUnstartedServer(n.Handler())
	srv.Config.Protocols = serverProtocols()
	srv.Start()
	defer srv.Close()
	api := nornv1connect.NewTaskServiceClient(h2cClient(), srv.URL, connect.WithGRPC())
	ctx := context.Background()
	if n.Ready() {
		t.Skip("the partitions elected leaders before the first claim")
	}
	_, err = api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "r", Worker: "w", Max: 1}))
	if n.Ready() && err == nil {
		t.Skip("the partitions elected leaders during the first claim")
	}
	wantCode(t, err, connect.CodeUnavailable)
	resp, err := api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{
		Queue: "r", Worker: "w", Max: 1, Wait: durationpb.New(10 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Msg.Tasks) != 1 || resp.Msg.Tasks[0].Task.Id != id {
		t.Fatalf("long poll across the election = %v, want task %d", resp.Msg.Tasks, id)
	}
}

// A claim whose caller left before the answer (its context cancelled: a
// worker shutting down, a client's deadline) gives back what it claimed
// at once, as yields, rather than leaving the tasks held by nobody until
// their leases run out; the next claim gets them.
func TestClaimCallerGoneGivesBack(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q", Payload: []byte("x")})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := h.node.server.TaskService().Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "q", Worker: "gone"}))
	if connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("claim of a caller that left: %v, want CANCELED", err)
	}
	task := h.get(id)
	if task.Status != nornv1.TaskStatus_TASK_STATUS_READY || len(task.Claims) != 1 ||
		task.Claims[0].Worker != "gone" || task.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_YIELDED {
		t.Fatalf("task after its claim's caller left: %v", task)
	}
	got := h.claim("q", 1, time.Minute)
	if len(got) != 1 || got[0].GetTask().GetId() != id {
		t.Fatalf("next claim: %v", got)
	}
}
