package client_test

import (
	"context"
	"errors"
	"slices"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// fakeQueues is the fake's QueueService: settings kept in memory (a
// paused queue's claims get nothing), counts from its tasks.
type fakeQueues struct{ f *fakeServer }

func (q fakeQueues) view(name string) *nornv1.Queue {
	v := &nornv1.Queue{Name: name, Settings: q.f.queues[name], ByStatus: map[string]uint64{}}
	if v.Settings == nil {
		v.Settings = &nornv1.QueueSettings{}
	}
	for _, t := range q.f.tasks {
		if t.spec.GetQueue() == name {
			v.ByStatus[t.status.String()[len("TASK_STATUS_"):]]++
			v.Total++
		}
	}
	return v
}

func (q fakeQueues) GetQueue(_ context.Context, r *connect.Request[nornv1.GetQueueRequest]) (*connect.Response[nornv1.GetQueueResponse], error) {
	q.f.mu.Lock()
	defer q.f.mu.Unlock()
	return connect.NewResponse(&nornv1.GetQueueResponse{Queue: q.view(r.Msg.GetQueue())}), nil
}

func (q fakeQueues) ListQueues(context.Context, *connect.Request[nornv1.ListQueuesRequest]) (*connect.Response[nornv1.ListQueuesResponse], error) {
	q.f.mu.Lock()
	defer q.f.mu.Unlock()
	var names []string
	for name := range q.f.queues {
		names = append(names, name)
	}
	for _, t := range q.f.tasks {
		if !slices.Contains(names, t.spec.GetQueue()) {
			names = append(names, t.spec.GetQueue())
		}
	}
	slices.Sort(names)
	resp := &nornv1.ListQueuesResponse{}
	for _, name := range names {
		resp.Queues = append(resp.Queues, q.view(name))
	}
	return connect.NewResponse(resp), nil
}

func (q fakeQueues) SetQueue(_ context.Context, r *connect.Request[nornv1.SetQueueRequest]) (*connect.Response[nornv1.SetQueueResponse], error) {
	q.f.mu.Lock()
	defer q.f.mu.Unlock()
	if r.Msg.GetQueue() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("queue: required"))
	}
	if q.f.queues == nil {
		q.f.queues = map[string]*nornv1.QueueSettings{}
	}
	cur := q.f.queues[r.Msg.GetQueue()]
	if cur == nil {
		cur = &nornv1.QueueSettings{}
	}
	proto.Merge(cur, r.Msg.GetSettings())
	for _, c := range r.Msg.GetClear() {
		switch c {
		case "paused":
			cur.Paused = nil
		case "default_retry":
			cur.DefaultRetry = nil
		case "default_lease":
			cur.DefaultLease = nil
		case "retention":
			cur.Retention = nil
		default:
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("clear[0]: not a queue setting"))
		}
	}
	q.f.queues[r.Msg.GetQueue()] = cur
	q.f.notifyLocked()
	return connect.NewResponse(&nornv1.SetQueueResponse{Queue: q.view(r.Msg.GetQueue())}), nil
}
