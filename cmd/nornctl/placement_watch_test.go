package main

import (
	"context"
	"io"
	"strings"
	"testing"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestRebalanceWatch applies with a yes answer and watches the moves to
// their end: one line per change, none for a poll that changes nothing.
func TestRebalanceWatch(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	f.statuses = progress()
	r := runFake(t, f, "y\n", "rebalance")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	want := "queued 2 moves at ring epoch 12\n" +
		"watching 2 moves (Ctrl-C stops watching, not the moves)\n" +
		"p3 n1 -> n4: filling\n" +
		"p3 n1 -> n4: catching-up\n" +
		"p3 n1 -> n4: done\n" +
		"p12 n2 -> n4: filling\n" +
		"p12 n2 -> n4: done\n" +
		"2 of 2 moves done\n"
	if !strings.HasSuffix(r.stdout, want) {
		t.Errorf("stdout ends:\n%s\nwant:\n%s", r.stdout, want)
	}
	// The plan printed once, before the question: the applied one is the same.
	if n := strings.Count(r.stdout, "PARTITION  FROM  TO"); n != 1 {
		t.Errorf("the plan printed %d times, want once:\n%s", n, r.stdout)
	}
	wantCalls(t, f, "Rebalance apply=false", "Rebalance apply=true", "Status", "Status", "Status", "Status", "Status")
}

// TestRebalanceWatchFailed ends the watch with exit 1 when a move failed,
// once every move has ended; the error of a step being retried is shown.
func TestRebalanceWatchFailed(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	f.statuses = []*nornv1.StatusResponse{
		statusWith(move(3, "n1", "n4", "filling", "n4: connection refused"), move(12, "n2", "n4", "filling", "")),
		statusWith(move(3, "n1", "n4", "failed", "n4 unreachable for 5m"), move(12, "n2", "n4", "catching-up", "")),
		statusWith(move(3, "n1", "n4", "failed", "n4 unreachable for 5m"), move(12, "n2", "n4", "done", "")),
	}
	r := runFake(t, f, "", "rebalance", "--yes")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1: %s", r.code, r.stderr)
	}
	mustContain(t, "stdout", r.stdout,
		"p3 n1 -> n4: filling (n4: connection refused)\n",
		"p3 n1 -> n4: failed (n4 unreachable for 5m)\n",
		"p12 n2 -> n4: done\n")
	mustNotContain(t, "stdout", r.stdout, "moves done")
	mustContain(t, "stderr", r.stderr, "nornctl: rebalance: 1 of 2 moves failed")
	wantCalls(t, f, "Rebalance apply=false", "Rebalance apply=true", "Status", "Status", "Status")
}

// TestRebalanceWatchStatusErrors: the watch rides out failed Status calls,
// and gives up after maxWatchErrors in a row.
func TestRebalanceWatchStatusErrors(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	f.statuses = []*nornv1.StatusResponse{statusWith(move(3, "n1", "n4", "done", ""), move(12, "n2", "n4", "done", ""))}
	f.statusErrs = maxWatchErrors - 1
	r := runFake(t, f, "", "rebalance", "--yes")
	if r.code != 0 || strings.Count(r.stderr, "UNAVAILABLE: node restarting (retrying)") != maxWatchErrors-1 {
		t.Errorf("exit %d, stderr %q; want exit 0 after %d retries", r.code, r.stderr, maxWatchErrors-1)
	}
	mustContain(t, "stdout", r.stdout, "2 of 2 moves done")

	f = newFakeAdmin(t)
	f.plan = testPlan()
	f.statusErrs = maxWatchErrors
	r = runFake(t, f, "", "rebalance", "--yes")
	if r.code != 1 || !strings.Contains(r.stderr, "watching the moves: UNAVAILABLE: node restarting") {
		t.Errorf("exit %d, stderr %q; want exit 1 after %d failures", r.code, r.stderr, maxWatchErrors)
	}
}

// TestRebalanceWatchReplaced: the node's ring reached the plan's epoch
// without the plan's moves, so a later plan replaced them; a ring behind
// the plan's epoch is waited for.
func TestRebalanceWatchReplaced(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	f.statuses = []*nornv1.StatusResponse{
		{NodeId: "n1", RingEpoch: 11, Moves: []*nornv1.MoveStatus{move(7, "n1", "n2", "done", "")}}, // behind
		{NodeId: "n1", RingEpoch: 15, Moves: []*nornv1.MoveStatus{move(3, "n1", "n4", "done", ""), move(9, "n2", "n3", "filling", "")}},
	}
	r := runFake(t, f, "", "rebalance", "--yes")
	if r.code != 1 || !strings.Contains(r.stderr, "lacks 1 of the plan's 2 moves: a later plan replaced it") {
		t.Errorf("exit %d, stderr %q; want exit 1, replaced", r.code, r.stderr)
	}
	wantCalls(t, f, "Rebalance apply=false", "Rebalance apply=true", "Status", "Status")
}

// blockingStdin is a terminal nobody answers: Read cancels the run's
// context (Ctrl-C), then blocks until the test ends.
type blockingStdin struct {
	cancel context.CancelFunc
	done   <-chan struct{}
}

func (b blockingStdin) Read([]byte) (int, error) {
	b.cancel()
	<-b.done
	return 0, io.EOF
}

// TestRebalanceInterrupted: Ctrl-C at the question applies nothing, and
// during the watch stops the watch only.
func TestRebalanceInterrupted(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	defer close(done)
	r := runFakeCtx(ctx, f, blockingStdin{cancel, done}, "rebalance")
	if r.code != 1 || !strings.Contains(r.stderr, "nornctl: rebalance: not applied: interrupted") {
		t.Errorf("Ctrl-C at the question: exit %d, stderr %q", r.code, r.stderr)
	}
	wantCalls(t, f, "Rebalance apply=false")

	f = newFakeAdmin(t)
	f.plan = testPlan()
	f.statuses = progress()
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	f.onStatus = func() {
		if len(f.calls) == 2+3 { // the third Status call
			cancel()
		}
	}
	r = runFakeCtx(ctx, f, strings.NewReader(""), "rebalance", "--yes")
	if r.code != 1 || !strings.Contains(r.stderr, "stopped watching: context canceled; the moves go on") {
		t.Errorf("Ctrl-C in the watch: exit %d, stderr %q", r.code, r.stderr)
	}
	mustContain(t, "stdout", r.stdout, "p3 n1 -> n4: filling\n")
	mustNotContain(t, "stdout", r.stdout, "catching-up")
}

func TestRebalanceNoWatch(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	r := runFake(t, f, "", "rebalance", "--yes", "--watch=false")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	mustNotContain(t, "stdout", r.stdout, "watching")
	wantCalls(t, f, "Rebalance apply=false", "Rebalance apply=true")
}
