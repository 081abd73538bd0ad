package server

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/transport"
)

// finish records a terminal event for a claimed task (complete or abort):
// the claim must be the live one, or the one that already ended the task
// the same way (an idempotent retry). It returns the acks and the task's
// queue.
func (sv *Server) finish(ctx context.Context, id, claimID uint64, w uint32, ev crdt.Terminal) (uint32, string, error) {
	if _, err := sv.coord.Quorum(w); err != nil {
		return 0, "", err
	}
	t, queue, err := sv.prepareFinish(ctx, id, claimID, ev)
	if err != nil {
		return 0, "", err
	}
	// A retry of the same call writes the stored state again, so that it
	// reaches the quorum it may have missed.
	acks, err := sv.coord.Write(ctx, []*crdt.Task{t}, w, []uint64{id})
	return acks, queue, err
}

// prepareFinish checks that the terminal event ev may end task id under
// claim claimID and returns the state to write: the event, or the task's
// state when the same event already took effect (a retry); and the task's
// queue.
func (sv *Server) prepareFinish(ctx context.Context, id, claimID uint64, ev crdt.Terminal) (*crdt.Task, string, error) {
	if err := requireClaim(id, claimID); err != nil {
		return nil, "", err
	}
	ev.Claim = claimID
	if err := ev.Validate(sv.cfg.Limits); err != nil {
		return nil, "", apierr.From(err)
	}
	ts, err := sv.dispatch.LoadClaimed(ctx, id, claimID)
	if err != nil {
		return nil, "", apierr.From(err)
	}
	if prev, terminal := ts.Task.Terminal(); terminal {
		sv.dispatch.EndIfTerminal(ts)
		if prev.Kind == ev.Kind && prev.Claim == claimID {
			return ts.Task, queueOf(ts.Task), nil
		}
		return nil, "", connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d is already %v", id, prev.Kind))
	}
	if err := LiveClaim(ts, claimID); err != nil {
		return nil, "", err
	}
	ev.At = sv.hlc.Now()
	return &crdt.Task{ID: id, Terminals: []crdt.Terminal{ev}}, queueOf(ts.Task), nil
}

func (s taskService) Complete(ctx context.Context, req *connect.Request[nornv1.CompleteRequest]) (*connect.Response[nornv1.CompleteResponse], error) {
	m := req.Msg
	if resp, done, err := coord.Forward(s.sv.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Complete); done {
		return resp, err
	}
	result := m.GetResult()
	if len(result) == 0 {
		result = nil
	}
	acks, queue, err := s.sv.finish(ctx, m.GetId(), m.GetClaimId(), m.GetW(), crdt.Terminal{Kind: crdt.Completed, Result: result})
	if err != nil {
		return nil, err
	}
	s.sv.events.Completed(queue)
	return connect.NewResponse(&nornv1.CompleteResponse{Acks: acks}), nil
}

// MaxCompleteBatch bounds the completions of one CompleteBatch.
const MaxCompleteBatch = 10_000

func (s taskService) CompleteBatch(ctx context.Context, req *connect.Request[nornv1.CompleteBatchRequest]) (*connect.Response[nornv1.CompleteBatchResponse], error) {
	sv, m := s.sv, req.Msg
	if _, err := sv.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	cs := m.GetCompletions()
	if len(cs) == 0 || len(cs) > MaxCompleteBatch {
		return nil, apierr.Invalid("completions", "must hold 1 to %d completions, got %d", MaxCompleteBatch, len(cs))
	}
	results := make([]*nornv1.CompletionResult, len(cs))
	fail := func(i int, err error) {
		results[i] = &nornv1.CompletionResult{Code: connect.CodeOf(err).String(), Message: fmt.Sprintf("completions[%d]: %s", i, apierr.Message(err))}
	}
	seen := make(map[uint64]bool, len(cs))
	var local []int              // completions handled here
	remote := map[string][]int{} // by the node that should handle them
	for i, c := range cs {
		switch {
		case c.GetW() != 0:
			fail(i, apierr.Invalid("w", "must be unset in a batch; set the batch's w"))
			continue
		case seen[c.GetId()] && c.GetId() != 0:
			fail(i, apierr.Invalid("id", "task %d is completed twice in the batch", c.GetId()))
			continue
		}
		seen[c.GetId()] = true
		if target := sv.coord.RouteTarget(sv.host.Partition(c.GetId()), transport.Hops(req)); target != "" && c.GetId() != 0 {
			remote[target] = append(remote[target], i)
		} else {
			local = append(local, i)
		}
	}
	var wg sync.WaitGroup
	var localMu sync.Mutex
	for target, idx := range remote {
		wg.Go(func() {
			back := sv.forwardCompletions(ctx, req, target, idx, results)
			localMu.Lock()
			local = append(local, back...)
			localMu.Unlock()
		})
	}
	wg.Wait()
	var tasks []*crdt.Task
	var written []int   // index in cs of each of tasks
	var queues []string // the queue of each of tasks
	for _, i := range local {
		c := cs[i]
		result := c.GetResult()
		if len(result) == 0 {
			result = nil
		}
		t, queue, err := sv.prepareFinish(ctx, c.GetId(), c.GetClaimId(), crdt.Terminal{Kind: crdt.Completed, Result: result})
		if err != nil {
			fail(i, err)
			continue
		}
		tasks = append(tasks, t)
		written = append(written, i)
		queues = append(queues, queue)
	}
	if len(tasks) > 0 {
		// One write (one synced commit per replica) for the whole batch.
		acks, w, lastErr, err := sv.coord.WriteEach(ctx, tasks, m.GetW())
		if err != nil {
			return nil, err
		}
		for k, i := range written {
			if acks[k] >= w {
				results[i] = &nornv1.CompletionResult{Acks: acks[k]}
				sv.events.Completed(queues[k])
			} else {
				fail(i, sv.coord.QuorumError([]uint64{cs[i].GetId()}, acks[k], w, lastErr))
			}
		}
	}
	return connect.NewResponse(&nornv1.CompleteBatchResponse{Results: results}), nil
}

// forwardCompletions sends the completions idx of a CompleteBatch to the
// node at target and fills their results. It returns the completions to
// handle here instead: all of them when target could not be reached and
// this node replicates their partitions.
func (sv *Server) forwardCompletions(ctx context.Context, req *connect.Request[nornv1.CompleteBatchRequest], target string, idx []int, results []*nornv1.CompletionResult) (here []int) {
	cs := req.Msg.GetCompletions()
	sub := &nornv1.CompleteBatchRequest{W: req.Msg.GetW()}
	for _, i := range idx {
		sub.Completions = append(sub.Completions, cs[i])
	}
	resp, err := sv.peers.Get(target).Tasks.CompleteBatch(ctx, transport.Forwarded(sub, transport.Hops(req)))
	if err == nil && len(resp.Msg.GetResults()) != len(idx) {
		err = connect.NewError(connect.CodeInternal, fmt.Errorf("node %s answered %d results for %d completions", target, len(resp.Msg.GetResults()), len(idx)))
	}
	for k, i := range idx {
		switch {
		case err != nil && coord.Unreachable(err) && sv.host.Group(sv.host.Partition(cs[i].GetId())) != nil:
			here = append(here, i)
		case err != nil:
			results[i] = &nornv1.CompletionResult{Code: connect.CodeOf(err).String(), Message: fmt.Sprintf("completions[%d]: %s", i, apierr.Message(err))}
		default:
			r := resp.Msg.GetResults()[k]
			if r.GetCode() != "" {
				// Renumber the message to this request's index.
				msg := r.GetMessage()
				if _, rest, ok := strings.Cut(msg, ": "); ok {
					msg = rest
				}
				r.Message = fmt.Sprintf("completions[%d]: %s", i, msg)
			}
			results[i] = r
		}
	}
	return here
}

func (s taskService) Abort(ctx context.Context, req *connect.Request[nornv1.AbortRequest]) (*connect.Response[nornv1.AbortResponse], error) {
	m := req.Msg
	if resp, done, err := coord.Forward(s.sv.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Abort); done {
		return resp, err
	}
	ev := crdt.Terminal{Kind: crdt.Aborted}
	for _, e := range m.GetErrors() {
		args := e.GetArgs()
		if len(args) == 0 {
			args = nil
		}
		ev.Errors = append(ev.Errors, crdt.TaskError{Code: e.GetCode(), Description: e.GetDescription(), Args: args})
	}
	acks, queue, err := s.sv.finish(ctx, m.GetId(), m.GetClaimId(), m.GetW(), ev)
	if err != nil {
		return nil, err
	}
	s.sv.events.Aborted(queue)
	return connect.NewResponse(&nornv1.AbortResponse{Acks: acks}), nil
}
