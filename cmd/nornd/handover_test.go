package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestClusterSIGTERMHandsLeadershipsOver: a nornd of a balanced 3-node
// cluster that gets SIGTERM hands its partition leaderships over before
// it stops. The Raft timeout is 2 s, so a survivor elects a leader of a
// partition no sooner than 2 s after the stopped node's last heartbeat
// as its leader: read right when the process has exited, a partition
// led by a survivor was handed over, and one the stopped node kept would
// still show it as the leader. Every partition must be led by a
// survivor then, both survivors agreeing; and it exits with 0.
func TestClusterSIGTERMHandsLeadershipsOver(t *testing.T) {
	const partitions = 16
	ns := startClusterWith(t, "-partitions", fmt.Sprint(partitions), "-raft-timeout", "2s",
		"-leader-balance-interval", "200ms", "-leader-balance-rate", "20")
	waitLeadersBalanced(t, ns, float64(partitions)/3, 60*time.Second)
	gone, stay := ns[2], ns[:2]
	counts := leaderCounts(ns)
	if counts[gone.id] == 0 {
		t.Fatalf("balanced, yet %s leads nothing: %v", gone.id, counts)
	}

	exited := make(chan error, 1)
	go func() { exited <- gone.proc.cmd.Wait() }()
	signalled := time.Now()
	if err := gone.proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-time.After(60 * time.Second):
		gone.proc.cmd.Process.Signal(syscall.SIGKILL) // this test's process only
		<-exited
		t.Fatalf("%s did not exit within 60 s of SIGTERM", gone.id)
	}
	took := time.Since(signalled)
	// Right now: before any survivor's election timeout can have fired.
	problems := ""
	led := map[string]int{}
	for _, n := range stay {
		st, err := n.admin.Status(context.Background(), connect.NewRequest(&nornv1.StatusRequest{SkipCounts: true}))
		if err != nil {
			t.Fatalf("status of %s: %v", n.id, err)
		}
		for _, p := range st.Msg.Partitions {
			if p.Leader != stay[0].id && p.Leader != stay[1].id {
				problems += fmt.Sprintf("; %s sees partition %d led by %q", n.id, p.Id, p.Leader)
			}
			if p.RaftState == "Leader" {
				led[n.id]++
			}
		}
	}
	read := time.Since(signalled) - took
	t.Logf("%s led %d of %d; it exited %s after SIGTERM; the survivors, read %s later, lead %v",
		gone.id, counts[gone.id], partitions, took.Round(time.Millisecond), read.Round(time.Millisecond), led)
	if problems != "" || led[stay[0].id]+led[stay[1].id] != partitions {
		t.Fatalf("when %s exited, not every partition was led by a survivor (leaders before: %v; now %v)%s",
			gone.id, counts, led, problems)
	}
	if waitErr != nil {
		t.Fatalf("%s exited with %v after SIGTERM", gone.id, waitErr)
	}
}

// TestWatchSignals: SIGHUP reloads whenever it comes; the first SIGTERM
// or SIGINT starts the shutdown, the second cuts its waits short (the
// hand-over's and the requests' contexts end with it as the cause).
func TestWatchSignals(t *testing.T) {
	sig := make(chan os.Signal)
	done := make(chan struct{})
	defer close(done)
	stopping := make(chan os.Signal, 1)
	hurry, stopNow := context.WithCancelCause(context.Background())
	defer stopNow(nil)
	reloads := make(chan struct{}, 3)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	go watchSignals(sig, done, stopping, stopNow, func() { reloads <- struct{}{} }, logger)

	sig <- syscall.SIGHUP
	<-reloads
	sig <- syscall.SIGTERM
	if s := <-stopping; s != syscall.SIGTERM {
		t.Fatalf("stopping on %v", s)
	}
	if hurry.Err() != nil {
		t.Fatal("one signal cut the waits short")
	}
	sig <- syscall.SIGHUP // still reloads while stopping
	<-reloads
	if hurry.Err() != nil {
		t.Fatal("SIGHUP cut the waits short")
	}
	sig <- syscall.SIGINT
	<-hurry.Done()
	if cause := context.Cause(hurry); cause == nil || !strings.Contains(cause.Error(), "second signal") {
		t.Fatalf("cause %v", cause)
	}
	if len(stopping) != 0 {
		t.Fatal("the second signal went to stopping")
	}
}
