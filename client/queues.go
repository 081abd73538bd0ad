package client

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// GetQueue returns a queue's settings and its tasks by status
// (QueueService.GetQueue).
func (c *Client) GetQueue(ctx context.Context, queue string) (*nornv1.Queue, error) {
	var out *nornv1.Queue
	err := c.call(ctx, "get queue", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.queue.GetQueue(ctx, connect.NewRequest(&nornv1.GetQueueRequest{Queue: queue}))
		if err == nil {
			out = resp.Msg.GetQueue()
		}
		return err
	})
	return out, err
}

// ListQueues returns every queue the cluster knows, with its settings and
// its tasks by status, in name order (QueueService.ListQueues).
func (c *Client) ListQueues(ctx context.Context) ([]*nornv1.Queue, error) {
	var out []*nornv1.Queue
	err := c.call(ctx, "list queues", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.queue.ListQueues(ctx, connect.NewRequest(&nornv1.ListQueuesRequest{}))
		if err == nil {
			out = resp.Msg.GetQueues()
		}
		return err
	})
	return out, err
}

// SetQueue changes a queue's settings (QueueService.SetQueue): the fields
// set in req.Settings change, the ones named in req.Clear go back to
// their defaults. Retried like a read: setting the same values again
// changes nothing.
func (c *Client) SetQueue(ctx context.Context, req *nornv1.SetQueueRequest) (*nornv1.SetQueueResponse, error) {
	var out *nornv1.SetQueueResponse
	err := c.call(ctx, "set queue", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.queue.SetQueue(ctx, connect.NewRequest(req))
		if err == nil {
			out = resp.Msg
		}
		return err
	})
	return out, err
}

// PauseQueue pauses a queue: its claims get nothing, and long polls wait,
// until ResumeQueue; enqueues and the tasks already claimed go on.
func (c *Client) PauseQueue(ctx context.Context, queue string) error {
	_, err := c.SetQueue(ctx, &nornv1.SetQueueRequest{Queue: queue, Settings: &nornv1.QueueSettings{Paused: new(true)}})
	return err
}

// ResumeQueue ends a queue's pause.
func (c *Client) ResumeQueue(ctx context.Context, queue string) error {
	_, err := c.SetQueue(ctx, &nornv1.SetQueueRequest{Queue: queue, Clear: []string{"paused"}})
	return err
}

// QueueDefaults are a queue's defaults for SetQueueDefaults: a nil field
// is left as it is.
type QueueDefaults struct {
	// Retry is the retry policy of an enqueue that names none (taken
	// at enqueue).
	Retry *nornv1.RetryPolicy
	// Lease is the lease of a claim that names none; 0 leaves it.
	Lease time.Duration
}

// SetQueueDefaults sets a queue's default retry policy and lease.
func (c *Client) SetQueueDefaults(ctx context.Context, queue string, d QueueDefaults) error {
	s := &nornv1.QueueSettings{}
	s.DefaultRetry = d.Retry
	if d.Lease != 0 {
		s.DefaultLease = durationpb.New(d.Lease)
	}
	_, err := c.SetQueue(ctx, &nornv1.SetQueueRequest{Queue: queue, Settings: s})
	return err
}

// SetQueueRetention sets how long a queue's finished tasks are kept
// (an hour to 366 days); 0 gives the queue the node's retention again.
func (c *Client) SetQueueRetention(ctx context.Context, queue string, retention time.Duration) error {
	req := &nornv1.SetQueueRequest{Queue: queue, Clear: []string{"retention"}}
	if retention != 0 {
		req = &nornv1.SetQueueRequest{Queue: queue, Settings: &nornv1.QueueSettings{Retention: durationpb.New(retention)}}
	}
	_, err := c.SetQueue(ctx, req)
	return err
}
