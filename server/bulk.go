package server

import (
	"context"
	"sync"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/coord"
)

// bulkParallel is how many tasks of a BulkAction page are acted on at
// once: each action is a Raft decision or a quorum write, mostly waiting.
const bulkParallel = 8

// maxBulkFailures bounds the failures a BulkAction answer lists.
const maxBulkFailures = 100

// BulkAction lists one page of the queue's tasks (as ListTasks, with the
// queue and status filters), keeps those that match the other filters,
// and retries or cancels each through this node's own handlers (which
// forward to the task's partition leader where they must). An action the
// task no longer admits (FAILED_PRECONDITION: retried or cancelled
// already, or changed since listed) counts as skipped.
func (s taskService) BulkAction(ctx context.Context, req *connect.Request[nornv1.BulkActionRequest]) (*connect.Response[nornv1.BulkActionResponse], error) {
	sv, m := s.sv, req.Msg
	switch m.GetAction() {
	case nornv1.BulkActionRequest_ACTION_RETRY, nornv1.BulkActionRequest_ACTION_CANCEL:
	default:
		return nil, apierr.Invalid("action", "must be ACTION_RETRY or ACTION_CANCEL, got %v", m.GetAction())
	}
	if m.GetQueue() == "" {
		return nil, apierr.Invalid("queue", "required")
	}
	var after, before int64
	if t := m.GetCreatedAfter(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, apierr.Invalid("createdAfter", "%v", err)
		}
		after = t.AsTime().UnixMilli()
	}
	if t := m.GetCreatedBefore(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, apierr.Invalid("createdBefore", "%v", err)
		}
		if before = t.AsTime().UnixMilli(); m.GetCreatedAfter() != nil && before <= after {
			return nil, apierr.Invalid("createdBefore", "must be after createdAfter")
		}
	}
	if n := len(m.GetErrorContains()); n > 1024 {
		return nil, apierr.Invalid("errorContains", "at most 1024 bytes, got %d", n)
	}
	if _, err := sv.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	page, err := sv.coord.List(ctx, &nornv1.ListTasksRequest{Queue: m.GetQueue(), Status: m.GetStatus(),
		PageSize: m.GetPageSize(), PageToken: m.GetPageToken()})
	if err != nil {
		return nil, err
	}
	out := &nornv1.BulkActionResponse{Listed: uint32(len(page.GetTasks())), NextPageToken: page.GetNextPageToken()}
	var matched []*nornv1.Task
	for _, t := range page.GetTasks() {
		created := t.GetCreatedAt().AsTime().UnixMilli()
		if (m.GetCreatedAfter() != nil && created <= after) || (m.GetCreatedBefore() != nil && created >= before) ||
			!coord.HasErrorText(t, m.GetErrorContains()) {
			continue
		}
		matched = append(matched, t)
	}
	out.Matched = uint32(len(matched))
	act := func(t *nornv1.Task) error {
		if m.GetAction() == nornv1.BulkActionRequest_ACTION_RETRY {
			life := t.GetLife()
			_, err := s.Retry(ctx, connect.NewRequest(&nornv1.RetryRequest{Id: t.GetId(), Life: &life, W: m.GetW()}))
			return err
		}
		_, err := s.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: t.GetId(), W: m.GetW()}))
		return err
	}
	var mu sync.Mutex
	sem := make(chan struct{}, bulkParallel)
	var wg sync.WaitGroup
	for _, t := range matched {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := act(t)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				out.Done++
			case connect.CodeOf(err) == connect.CodeFailedPrecondition:
				out.Skipped++
			case len(out.Failures) < maxBulkFailures:
				out.Failures = append(out.Failures, &nornv1.BulkFailure{Id: t.GetId(), Error: apierr.Message(err)})
			}
		})
	}
	wg.Wait()
	return connect.NewResponse(out), nil
}
