package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestClusterAntiEntropyCatchesUp kills one of three nodes, enqueues and
// completes 10,000 tasks with W=2 on the other two, and restarts it: within
// 30 s every partition's replicas report equal Merkle roots, and the node
// serves all 10,000 tasks, completed, from its own store (GetTask with R=1
// against it) — anti-entropy alone brought them, since nothing read or
// wrote those tasks after the restart.
func TestClusterAntiEntropyCatchesUp(t *testing.T) {
	const count = 10_000
	ns := startCluster(t)
	ctx := context.Background()
	behind := ns[2]
	behind.proc.kill()

	// Enqueue in batches through the two live nodes...
	var ids []uint64
	for b := 0; len(ids) < count; b++ {
		req := &nornv1.EnqueueBatchRequest{W: 2}
		for i := range min(500, count-len(ids)) {
			req.Tasks = append(req.Tasks, &nornv1.TaskSpec{Queue: "ae", Payload: []byte(fmt.Sprint(b, "-", i))})
		}
		r, err := ns[b%2].tasks.EnqueueBatch(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("enqueue batch %d with one node down: %v", b, err)
		}
		ids = append(ids, r.Msg.Ids...)
	}
	// ...then claim and complete every one of them.
	done := 0
	for round := 0; done < count; round++ {
		if round > 1000 {
			t.Fatalf("completed %d of %d tasks", done, count)
		}
		api := ns[round%2].tasks
		c, err := api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "ae", Worker: "w", Max: 500,
			Lease: durationpb.New(time.Minute), Wait: durationpb.New(time.Second)}))
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		req := &nornv1.CompleteBatchRequest{W: 2}
		for _, ct := range c.Msg.Tasks {
			req.Completions = append(req.Completions, &nornv1.CompleteRequest{Id: ct.Task.Id, ClaimId: ct.ClaimId})
		}
		if len(req.Completions) == 0 {
			continue
		}
		r, err := api.CompleteBatch(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("complete batch: %v", err)
		}
		for i, res := range r.Msg.Results {
			if res.Code != "" {
				t.Fatalf("complete %d: %s %s", req.Completions[i].Id, res.Code, res.Message)
			}
		}
		done += len(req.Completions)
	}

	behind.start(t, 2)
	start := time.Now()
	waitUntil(t, 30*time.Second, "every partition's replicas to report equal roots", func() bool {
		for _, n := range ns {
			s, err := n.admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{}))
			if err != nil {
				return false
			}
			for _, p := range s.Msg.Partitions {
				if !p.ReplicasAgree {
					return false
				}
			}
		}
		return true
	})
	t.Logf("replicas agreed %s after the restart", time.Since(start).Round(time.Millisecond))

	// The restarted node's own replica (R=1) has every task, completed.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < len(ids); i += 8 {
				g, err := behind.tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: ids[i], R: 1}))
				if err == nil && g.Msg.Task.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED {
					err = fmt.Errorf("status %v", g.Msg.Task.Status)
				}
				if err != nil {
					errs <- fmt.Errorf("task %d on the restarted node: %w", ids[i], err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
