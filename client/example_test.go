package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
)

func ExampleClient_Enqueue() {
	node := newFake() // stands in for a nornd node at node.addr, e.g. "127.0.0.1:7400"
	defer node.Close()

	c, err := client.New(node.addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	id, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "emails", Payload: []byte("to: ada@example.com")})
	if err != nil {
		// When the write quorum was not reached, id may be set: the task may
		// be stored, and c.Enqueue(ctx, spec, client.WithID(id)) is a safe retry.
		log.Fatal(err)
	}
	task, err := c.GetTask(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(id, task.GetStatus(), task.GetSpec().GetQueue())
	// Output: 1 TASK_STATUS_READY emails
}

// A task that must be done within the hour: if no worker completes it
// by then it ends CANCELLED with the error code "deadline", whether it
// is waiting or claimed (its worker's next renew fails, and the Worker
// cancels its handler's context).
func ExampleClient_Enqueue_deadline() {
	node := newFake() // stands in for a nornd node
	defer node.Close()
	c, err := client.New(node.addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	id, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "invoices", Deadline: timestamppb.New(time.Now().Add(time.Hour))})
	if err != nil {
		log.Fatal(err)
	}
	task, err := c.GetTask(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(task.GetStatus(), time.Until(task.GetSpec().GetDeadline().AsTime()).Round(time.Minute))
	// Output: TASK_STATUS_READY 1h0m0s
}

// A task with a unique key: while it is not finished, enqueues with the
// same key in its queue create nothing and answer its id, so a producer
// may retry an enqueue from any process. With UniqueFor the key stays
// held that long after the enqueue, finished or not ("at most one an
// hour").
func ExampleClient_Enqueue_unique() {
	node := newFake() // stands in for a nornd node
	defer node.Close()
	c, err := client.New(node.addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	spec := &nornv1.TaskSpec{Queue: "reports", UniqueKey: "monthly:2026-11", Payload: []byte("build it")}
	first, err := c.Enqueue(ctx, spec)
	if err != nil {
		log.Fatal(err)
	}
	var dup bool
	again, err := c.Enqueue(ctx, spec, client.WithDuplicate(&dup))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(first == again, dup)
	// Output: true true
}

func ExampleWorker() {
	node := newFake() // stands in for a nornd node
	defer node.Close()
	c, err := client.New(node.addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	id, err := c.Enqueue(context.Background(), &nornv1.TaskSpec{Queue: "greetings", Payload: []byte("world")})
	if err != nil {
		log.Fatal(err)
	}

	ctx, shutdown := context.WithCancel(context.Background())
	handled := make(chan struct{})
	w, err := client.NewWorker(c, client.WorkerConfig{
		Queue:       "greetings",
		Concurrency: 4,
		Handler: func(ctx context.Context, t *client.Task) ([]byte, error) {
			fmt.Printf("handling %s\n", t.Payload)
			if err := t.Progress(ctx, 0.5, "halfway"); err != nil {
				return nil, err // the claim ended: the worker gives the task up
			}
			defer close(handled)
			return []byte("hello, " + string(t.Payload)), nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		<-handled
		shutdown() // as on SIGTERM: Run settles the tasks it holds, then returns
	}()
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}

	task, err := c.GetTask(context.Background(), id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%v %q\n", task.GetStatus(), task.GetResult())
	// Output:
	// handling world
	// TASK_STATUS_COMPLETED "hello, world"
}

// A handler's error fails the attempt: the task is claimed again after
// its backoff (here none: the example's stand-in node has no clock to
// wait on) until its retry policy's attempts run out, then it is DEAD.
// An error wrapped in client.Permanent aborts it for good instead.
func ExampleWorker_retries() {
	node := newFake() // stands in for a nornd node
	defer node.Close()
	c, err := client.New(node.addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	id, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "webhooks", Payload: []byte("https://example.com/hook"),
		Retry: &nornv1.RetryPolicy{MaxAttempts: 3, InitialBackoff: durationpb.New(time.Second), Multiplier: 2, MaxBackoff: durationpb.New(time.Minute)}})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, shutdown := context.WithCancel(ctx)
	w, err := client.NewWorker(c, client.WorkerConfig{
		Queue: "webhooks",
		Handler: func(ctx context.Context, t *client.Task) ([]byte, error) {
			attempt := t.Info.GetFailedAttempts() + 1
			fmt.Println("attempt", attempt)
			if attempt < 3 {
				return nil, fmt.Errorf("POST %s: 503 Service Unavailable", t.Payload) // retried
			}
			return nil, client.Permanent(&client.TaskError{Code: "gone", Description: "the hook was removed"})
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() { // shut the worker down once the task has ended
		for {
			if task, err := c.GetTask(ctx, id); err == nil && task.GetStatus() == nornv1.TaskStatus_TASK_STATUS_ABORTED {
				shutdown()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if err := w.Run(runCtx); err != nil {
		log.Fatal(err)
	}
	task, err := c.GetTask(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(task.GetStatus(), task.GetFailedAttempts())
	for _, e := range task.GetErrors() {
		fmt.Println(e.GetAttempt(), e.GetCode())
	}
	// Output:
	// attempt 1
	// attempt 2
	// attempt 3
	// TASK_STATUS_ABORTED 2
	// 1 handler_error
	// 2 handler_error
	// 0 gone
}

func ExampleClient_PauseQueue() {
	node := newFake() // stands in for a nornd node
	defer node.Close()
	c, err := client.New(node.addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "payments"}); err != nil {
		log.Fatal(err)
	}

	// During an incident downstream: workers get nothing, producers go on.
	if err := c.PauseQueue(ctx, "payments"); err != nil {
		log.Fatal(err)
	}
	got, err := c.Claim(ctx, client.ClaimRequest{Queue: "payments", Worker: "w1", Max: 10})
	if err != nil {
		log.Fatal(err)
	}
	q, err := c.GetQueue(ctx, "payments")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("paused:", q.GetSettings().GetPaused(), "claimed:", len(got), "ready:", q.GetByStatus()["READY"])

	if err := c.ResumeQueue(ctx, "payments"); err != nil {
		log.Fatal(err)
	}
	got, err = c.Claim(ctx, client.ClaimRequest{Queue: "payments", Worker: "w1", Max: 10})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("resumed, claimed:", len(got))
	// Output:
	// paused: true claimed: 0 ready: 1
	// resumed, claimed: 1
}

func ExampleClient_SetQueueDefaults() {
	node := newFake() // stands in for a nornd node
	defer node.Close()
	c, err := client.New(node.addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	// Tasks of "webhooks" that name no retry policy or lease get these.
	err = c.SetQueueDefaults(ctx, "webhooks", client.QueueDefaults{
		Retry: &nornv1.RetryPolicy{MaxAttempts: 8, InitialBackoff: durationpb.New(time.Second), Multiplier: 2, MaxBackoff: durationpb.New(10 * time.Minute)},
		Lease: 2 * time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
	qs, err := c.ListQueues(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, q := range qs {
		fmt.Println(q.GetName(), q.GetSettings().GetDefaultRetry().GetMaxAttempts(), q.GetSettings().GetDefaultLease().AsDuration())
	}
	// Output: webhooks 8 2m0s
}

func ExampleClient_SetQueueRetention() {
	node := newFake() // stands in for a nornd node
	defer node.Close()
	c, err := client.New(node.addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	// Finished tasks of "thumbnails" are deleted two days after they
	// end; other queues keep theirs for the node's -retention.
	if err := c.SetQueueRetention(ctx, "thumbnails", 48*time.Hour); err != nil {
		log.Fatal(err)
	}
	q, err := c.GetQueue(ctx, "thumbnails")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(q.GetName(), q.GetSettings().GetRetention().AsDuration())
	// Output: thumbnails 48h0m0s
}
