package client_test

import (
	"context"
	"fmt"
	"log"

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
