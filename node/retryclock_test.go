package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestRetryBackoffClockStep: the leader that decided a retry's backoff
// has its clock stepped forward by far more than the backoff; no claim,
// through it or another node, gets the task before the backoff has run on
// the real clock, less the skew buffer (the clock guard: a leader whose
// clock stepped proposes nothing until it is judged again, and out of
// bound it hands its leaderships over).
func TestRetryBackoffClockStep(t *testing.T) {
	clk := &shiftClock{}
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		cfg.MaxClockOffset = 500 * time.Millisecond
		if i == 0 {
			cfg.Clock = clk
		}
	})
	n1 := ms[0]
	waitFor(t, 10*time.Second, "n1 to measure both other clocks", func() bool {
		all, _, _ := n1.node.clockGuard.PeerOffsets(time.Time{})
		return len(all) >= 2
	})
	ctx := context.Background()
	const backoff = 4 * time.Second
	r, err := n1.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{W: 3, Task: &nornv1.TaskSpec{Queue: "stepq",
		Retry: &nornv1.RetryPolicy{MaxAttempts: 5, InitialBackoff: durationpb.New(backoff)}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := r.Msg.Id
	p := n1.node.partition(id)
	// n1 leads the task's partition.
	waitFor(t, 10*time.Second, "n1 to lead the task's partition", func() bool {
		if n1.node.group(p).IsLeader() {
			return true
		}
		for _, m := range ms[1:] {
			if g := m.node.group(p); g != nil && g.IsLeader() {
				g.TransferLeadershipTo(n1.cfg.NodeID, n1.node.RaftAddr())
			}
		}
		return false
	})
	c := claimOne(t, n1, "stepq")
	failed := time.Now()
	if _, err := n1.api.Abort(ctx, connect.NewRequest(&nornv1.AbortRequest{Id: id, ClaimId: c, Retry: true})); err != nil {
		t.Fatal(err)
	}
	clk.off.Store(int64(time.Minute)) // far past the backoff on n1's clock
	// n1 promotes the task at once on its clock, and is asked for it at
	// once, before its clock guard's next judgement.
	n1.node.dispatch.MonitorOnce()
	var got *nornv1.ClaimedTask
	for i := 0; got == nil && time.Since(failed) < 20*time.Second; i++ {
		resp, err := ms[min(i/5, i%3)].api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "stepq", Worker: "w", Max: 1,
			Lease: durationpb.New(time.Minute), Wait: durationpb.New(200 * time.Millisecond)}))
		if err == nil && len(resp.Msg.Tasks) == 1 {
			got = resp.Msg.Tasks[0]
		}
	}
	if got == nil {
		t.Fatal("the task was not claimed again within 20 s")
	}
	if early := backoff - time.Since(failed); early > testSkew {
		t.Fatalf("claimed again %s early (granted by %s), beyond the %s skew buffer", early, nodeIDAt(ms, got.Leader), testSkew)
	}
	if l := nodeIDAt(ms, got.Leader); l == "n1" {
		t.Fatalf("granted by n1, whose clock is a minute off")
	}
}

// TestRetriesWaitForEveryNode: while a ring member has not said it
// applies retries (a node of an older build, in a rolling upgrade), a
// retry policy, a retryable abort and a deadline are refused, naming it, and the rest
// works as before: the gate keeps entries that node cannot read out of
// its groups.
func TestRetriesWaitForEveryNode(t *testing.T) {
	ms := testClusterWith(t, 3, func(i int, cfg *Config) { cfg.olderBuild = i == 2 })
	ctx := context.Background()
	_, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "gate",
		Retry: &nornv1.RetryPolicy{MaxAttempts: 2}}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "task.retry") || !strings.Contains(err.Error(), "n3") {
		t.Fatalf("an enqueue with a retry policy in a mixed cluster: %v", err)
	}
	// Deadlines too (FeatureDeadlines): that node cannot decode a task
	// with one.
	_, err = ms[1].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "gate",
		Deadline: timestamppb.New(time.Now().Add(time.Hour))}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "task.deadline") || !strings.Contains(err.Error(), "n3") {
		t.Fatalf("an enqueue with a deadline in a mixed cluster: %v", err)
	}
	id, _ := enqueueEverywhere(t, ms, "gate")
	c := claimOne(t, ms[0], "gate")
	_, err = ms[0].api.Abort(ctx, connect.NewRequest(&nornv1.AbortRequest{Id: id, ClaimId: c, Retry: true}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "n3") {
		t.Fatalf("a retryable abort in a mixed cluster: %v", err)
	}
	if _, err := ms[0].api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: c})); err != nil {
		t.Fatalf("the claim after the refused retry: %v", err)
	}
}
