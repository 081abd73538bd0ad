package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	norn "github.com/norn-dev/norn/client"
	"github.com/norn-dev/norn/ring"
)

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWorkerCompletesThroughAFailover: a Worker's handler finishes the
// moment the leader of its task's partition is killed (-9), with the
// default Raft timeout, so the partition has no leader for one to three
// seconds. The Worker's complete retries through the failover while its
// lease lasts: the task ends COMPLETED with the handler's result, its one
// claim the only one, and the handler ran once. (Before, the client gave
// up after 5 attempts in under a second, the Worker only logged it, and
// the finished work ran again after the lease expired.)
func TestWorkerCompletesThroughAFailover(t *testing.T) {
	ns := startClusterWith(t, "-raft-timeout", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var addrs []string
	for _, n := range ns {
		addrs = append(addrs, n.api)
	}
	c, err := norn.New(strings.Join(addrs, ","), norn.WithDiscovery(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "failover", Payload: []byte("work")})
	if err != nil {
		t.Fatal(err)
	}
	p := ring.Partition(id, 8)

	var logs syncBuffer
	var mu sync.Mutex
	runs := 0
	w, err := norn.NewWorker(c, norn.WorkerConfig{
		Queue: "failover", Lease: 30 * time.Second, Wait: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Handler: func(ctx context.Context, task *norn.Task) ([]byte, error) {
			mu.Lock()
			runs++
			mu.Unlock()
			// Kill the partition's leader, then finish at once: the
			// complete meets the failover.
			leader := ns[0].leaders(t)[p]
			for _, n := range ns {
				if n.id == leader {
					t.Logf("killing %s, the leader of partition %d of task %d", n.id, p, task.ID)
					n.proc.kill()
				}
			}
			return []byte("done once"), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		stop()
		<-done
	}()

	// Well within the lease (30 s): the complete went through.
	var task *nornv1.Task
	waitUntil(t, 15*time.Second, "the task completed", func() bool {
		for _, n := range ns {
			if n.proc.cmd.ProcessState != nil {
				continue
			}
			r, err := n.tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id}))
			if err == nil && r.Msg.Task.Status == nornv1.TaskStatus_TASK_STATUS_COMPLETED {
				task = r.Msg.Task
				return true
			}
		}
		return false
	})
	if string(task.Result) != "done once" || len(task.Claims) != 1 {
		t.Fatalf("task %d: result %q, %d claims; want the handler's result under its one claim", id, task.Result, len(task.Claims))
	}
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 {
		t.Fatalf("the handler ran %d times", runs)
	}
	if strings.Contains(logs.String(), "could not end the claim") {
		t.Fatalf("the Worker failed to complete:\n%s", logs.String())
	}
}
