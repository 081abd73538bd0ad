package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/dispatch"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
	"github.com/norn-dev/norn/transport"
)

// finish ends task id under claim claimID with the terminal event ev
// (complete or abort), decided by the partition's Raft group (see
// decide). It returns the acks and the task's queue.
func (sv *Server) finish(ctx context.Context, id, claimID uint64, w uint32, ev crdt.Terminal) (uint32, string, error) {
	act, err := sv.finishAct(id, claimID, ev)
	if err != nil {
		return 0, "", err
	}
	res, err := sv.decide(ctx, []dispatch.Act{act}, w)
	if err != nil {
		return 0, "", err
	}
	return res[0].acks, res[0].queue, res[0].err
}

// finishAct checks a complete or abort's fields and returns its act.
func (sv *Server) finishAct(id, claimID uint64, ev crdt.Terminal) (dispatch.Act, error) {
	if err := requireClaim(id, claimID); err != nil {
		return dispatch.Act{}, err
	}
	ev.Claim = claimID
	if err := ev.Validate(sv.cfg.Limits); err != nil {
		return dispatch.Act{}, apierr.From(err)
	}
	ev.At = sv.hlc.Now()
	return dispatch.Act{ID: id, ClaimID: claimID, End: coord.EndReason(ev.Kind),
		State: &crdt.Task{ID: id, Terminals: []crdt.Terminal{ev}}}, nil
}

// decided is what became of one act, for the API.
type decided struct {
	acks  uint32
	queue string // the task's queue, "" when this replica lacks its spec
	err   error
}

// decide has acts decided by their partitions' Raft groups, fenced by
// their claims (dispatch.Acts): this node leads the partitions (the call
// was forwarded to the leader), or it refuses them UNAVAILABLE. A task
// whose replica here is terminal by another decision is refused at once
// when that settles the act's claim (dispatch.TerminalSettles: a claim of
// a life this replica has not seen begin is the group's to judge). An act that took effect is durable on a
// majority of the cohort's Raft logs and applied on every replica as it
// learns the commit; the CRDT write of its state (its result, progress)
// then follows at w, as an enqueue's (idempotent: the same event), so
// that reads of R replicas with R + w > N see it at once; acks are that
// write's. The error is for the whole call (w out of range); each act
// has its own.
func (sv *Server) decide(ctx context.Context, acts []dispatch.Act, w uint32) ([]decided, error) {
	w, err := sv.coord.Quorum(w)
	if err != nil {
		return nil, err
	}
	majority := uint32(sv.host.Ring().Replication)/2 + 1 // the group's quorum
	out := make([]decided, len(acts))
	var propose []dispatch.Act
	var at []int                       // index in acts of each of propose
	missing := make([]bool, len(acts)) // acts whose task this replica lacks
	for i, a := range acts {
		ts, err := sv.coord.Load(a.ID)
		missing[i] = errors.Is(err, storage.ErrNotFound)
		if err == nil {
			out[i].queue = queueOf(ts.Task)
			if life := ts.Life(); life != 0 && a.State != nil {
				// The act ends the life its claim was granted in (the
				// claim FSM stamps the decided copy the same way).
				for k := range a.State.Terminals {
					a.State.Terminals[k].Life = life
				}
			}
			if err := refuseTerminal(ts, a); err != nil {
				sv.dispatch.EndIfTerminal(ts)
				out[i].err = err
				continue
			}
		}
		propose = append(propose, a)
		at = append(at, i)
	}
	if len(propose) == 0 {
		return out, nil
	}
	var follow []*crdt.Task // states to write to w replicas
	var followAt []int
	var results []dispatch.ActResult
	if testhooks.Built && sv.cfg.EndAfterWrite {
		results = sv.actAfterWrite(propose)
	} else {
		results = sv.dispatch.Acts(propose)
	}
	if testhooks.Built && sv.cfg.ActLocal {
		sv.actLocally(ctx, propose, results, w)
	}
	for k, r := range results {
		i := at[k]
		if r.Err != nil {
			out[i].err = r.Err
			if missing[i] && connect.CodeOf(r.Err) == connect.CodeFailedPrecondition {
				// No live claim of a task this replica lacks: only a
				// majority can say whether the task exists.
				if _, err := sv.coord.Read(ctx, acts[i].ID, 0); errors.Is(err, storage.ErrNotFound) || connect.CodeOf(err) == connect.CodeNotFound {
					out[i].err = apierr.From(err)
				}
			}
			continue
		}
		// The CRDT write that carries the decided state follows, at w:
		// the followers apply the entry only once they learn it committed
		// (with the leader's next append, up to a commit timeout later
		// when the group is idle), and a read of R replicas with R + w > N
		// must see what was acknowledged. The state is the entry's own
		// delta (the same event: merging it again changes nothing); for
		// a repeated act, the state this replica holds.
		st := acts[i].State
		if r.Died != nil && st != nil {
			// The last attempt failed: the DEAD event the group decided
			// goes with the attempt's errors.
			j, _, err := crdt.Join(st, r.Died)
			if err != nil {
				out[i].err = apierr.From(err)
				continue
			}
			st = j
		}
		if r.Repeated {
			st = nil
			if acts[i].End == claims.EndCompleted || acts[i].End == claims.EndAborted || acts[i].End == claims.EndFailed {
				if ts, err := sv.coord.Load(acts[i].ID); err == nil {
					if err := refuseChange(ts.Task, acts[i]); err != nil {
						out[i].err = err
						continue
					}
					st = ts.Task
				}
			}
		}
		if st == nil {
			out[i].acks = majority // nothing to write (a yield): decided, in the group's log
			continue
		}
		follow = append(follow, st)
		followAt = append(followAt, i)
	}
	if len(follow) > 0 {
		acks, w, lastErr, err := sv.coord.WriteEach(ctx, follow, w)
		if err != nil {
			return nil, err
		}
		for k, i := range followAt {
			if acks[k] >= w {
				out[i].acks = acks[k]
			} else {
				out[i].err = sv.coord.QuorumError([]uint64{acts[i].ID}, acks[k], w, lastErr)
			}
		}
	}
	return out, nil
}

// refuseTerminal refuses act on a task ts shows terminal, unless ts's
// deciding event is the act's own (a retry, which the group answers), and
// an update that would change one the task has (refuseChange).
func refuseTerminal(ts *coord.TaskState, a dispatch.Act) error {
	prev, terminal := ts.Task.Terminal()
	if !terminal || !dispatch.TerminalSettles(ts, a.ClaimID) {
		// Not terminal for this claim here: a claim of a life this
		// replica has not seen begin (a Retry's revival) is the group's.
		return refuseChange(ts.Task, a)
	}
	if prev.Claim == a.ClaimID && a.End != claims.EndNone && coord.EndReason(prev.Kind) == a.End {
		return refuseChange(ts.Task, a)
	}
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d is already %v", a.ID, prev.Kind))
}

// refuseChange refuses an act that repeats one the task has taken, under
// the same claim, with other content: a complete with another result, an
// abort with other errors (the first is final), an update with the seq of
// one it has and another progress, message or data (seq must grow). The
// same content again is a retry, answered as the first was.
func refuseChange(t *crdt.Task, a dispatch.Act) error {
	if a.State == nil {
		return nil
	}
	if prev, ok := t.Terminal(); ok && len(a.State.Terminals) > 0 && prev.Claim == a.ClaimID {
		ev := a.State.Terminals[0]
		if prev.Kind == ev.Kind && (!bytes.Equal(prev.Result, ev.Result) || !slices.EqualFunc(prev.Errors, ev.Errors, sameTaskError)) {
			what := "result"
			if ev.Kind == crdt.Aborted {
				what = "errors"
			}
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
				"task %d is already %v under claim %d with other %s: the first is final", a.ID, prev.Kind, a.ClaimID, what))
		}
	}
	for _, u := range a.State.Updates {
		for _, have := range t.Updates {
			if have.Claim == u.Claim && have.Seq == u.Seq && !sameUpdate(have, u) {
				return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
					"seq: update %d of claim %d of task %d exists with another progress, message or data: each update needs a greater seq", u.Seq, u.Claim, a.ID))
			}
		}
	}
	return nil
}

func sameTaskError(a, b crdt.TaskError) bool {
	return a.Code == b.Code && a.Description == b.Description && slices.Equal(a.Args, b.Args)
}

// sameUpdate: the same report (its time is the coordinator's, not the
// worker's).
func sameUpdate(a, b crdt.Update) bool {
	return a.Progress == b.Progress && a.Message == b.Message && bytes.Equal(a.Data, b.Data)
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
	var acts []dispatch.Act
	var decidedAt []int // index in cs of each of acts
	for _, i := range local {
		c := cs[i]
		result := c.GetResult()
		if len(result) == 0 {
			result = nil
		}
		act, err := sv.finishAct(c.GetId(), c.GetClaimId(), crdt.Terminal{Kind: crdt.Completed, Result: result})
		if err != nil {
			fail(i, err)
			continue
		}
		acts = append(acts, act)
		decidedAt = append(decidedAt, i)
	}
	if len(acts) > 0 {
		// One Raft entry per partition for the whole batch.
		res, err := sv.decide(ctx, acts, m.GetW())
		if err != nil {
			return nil, err
		}
		for k, i := range decidedAt {
			if res[k].err != nil {
				fail(i, res[k].err)
				continue
			}
			results[i] = &nornv1.CompletionResult{Acks: res[k].acks}
			sv.events.Completed(res[k].queue)
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
	if m.GetRetry() {
		acks, queue, err := s.sv.failAttempt(ctx, m.GetId(), m.GetClaimId(), m.GetW(), ev)
		if err != nil {
			return nil, err
		}
		s.sv.events.Failed(queue)
		return connect.NewResponse(&nornv1.AbortResponse{Acks: acks}), nil
	}
	acks, queue, err := s.sv.finish(ctx, m.GetId(), m.GetClaimId(), m.GetW(), ev)
	if err != nil {
		return nil, err
	}
	s.sv.events.Aborted(queue)
	return connect.NewResponse(&nornv1.AbortResponse{Acks: acks}), nil
}
