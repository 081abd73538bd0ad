package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// taskService implements norn.v1.TaskService on a node.
type taskService struct {
	n *Node
}

var _ nornv1connect.TaskServiceHandler = taskService{}

// specFromAPI validates and converts a TaskSpec.
func (n *Node) specFromAPI(field string, s *nornv1.TaskSpec) (*crdt.Spec, error) {
	if s == nil {
		return nil, apierr.Invalid(field, "required")
	}
	spec := &crdt.Spec{Queue: s.GetQueue(), Priority: s.GetPriority(), Payload: s.GetPayload(),
		DependsOn: s.GetDependsOn(), MaxClaims: s.GetMaxClaims()}
	if nb := s.GetNotBefore(); nb != nil {
		if err := nb.CheckValid(); err != nil {
			return nil, apierr.Invalid(field+".notBefore", "%v", err)
		}
		spec.NotBeforeMs = nb.AsTime().UnixMilli()
	}
	if err := spec.Validate(n.cfg.Limits); err != nil {
		var fe *crdt.FieldError
		if errors.As(err, &fe) {
			fe.Field = field + fe.Field[len("spec"):]
		}
		return nil, apierr.From(err)
	}
	if len(spec.Payload) == 0 {
		spec.Payload = nil
	}
	return spec, nil
}

// sameSpec compares the user-given fields of two specs.
func sameSpec(a, b *crdt.Spec) bool {
	return a.Queue == b.Queue && a.Priority == b.Priority && bytes.Equal(a.Payload, b.Payload) &&
		a.NotBeforeMs == b.NotBeforeMs && slices.Equal(a.DependsOn, b.DependsOn) && a.MaxClaims == b.MaxClaims
}

// prepareEnqueue turns a spec into a task state to merge, or reports that an
// idempotent retry found it stored already (existing).
// A retry found the task stored already: its stored state is written again
// (so that it reaches the quorum it may have missed).
func (n *Node) prepareEnqueue(ctx context.Context, field string, spec *crdt.Spec, id uint64) (t *crdt.Task, err error) {
	for i, d := range spec.DependsOn {
		if _, err := n.coord.Lookup(ctx, d); err != nil {
			if errors.Is(err, storage.ErrNotFound) {
				return nil, apierr.Invalid(fmt.Sprintf("%s.dependsOn[%d]", field, i), "task %d does not exist", d)
			}
			return nil, apierr.From(err)
		}
	}
	if id == 0 {
		if id, err = n.ids.NextID(); err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
	} else if stored, err := n.coord.Lookup(ctx, id); err == nil {
		if !sameSpec(stored.Spec, spec) {
			return nil, connect.NewError(connect.CodeAlreadyExists,
				fmt.Errorf("id: task %d exists with a different spec", id))
		}
		return stored, nil
	} else if !errors.Is(err, storage.ErrNotFound) {
		return nil, apierr.From(err)
	}
	spec.CreatedAt = n.hlc.Now()
	return &crdt.Task{ID: id, Spec: spec}, nil
}

func (s taskService) Enqueue(ctx context.Context, req *connect.Request[nornv1.EnqueueRequest]) (*connect.Response[nornv1.EnqueueResponse], error) {
	n, m := s.n, req.Msg
	if _, err := n.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	spec, err := n.specFromAPI("task", m.GetTask())
	if err != nil {
		return nil, err
	}
	t, err := n.prepareEnqueue(ctx, "task", spec, m.GetId())
	if err != nil {
		return nil, err
	}
	acks, err := n.coord.Write(ctx, []*crdt.Task{t}, m.GetW(), []uint64{t.ID})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.EnqueueResponse{Id: t.ID, Acks: acks}), nil
}

// maxBatch bounds EnqueueBatch.
const maxBatch = 10_000

func (s taskService) EnqueueBatch(ctx context.Context, req *connect.Request[nornv1.EnqueueBatchRequest]) (*connect.Response[nornv1.EnqueueBatchResponse], error) {
	n, m := s.n, req.Msg
	if _, err := n.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	if len(m.GetTasks()) == 0 || len(m.GetTasks()) > maxBatch {
		return nil, apierr.Invalid("tasks", "must hold 1-%d tasks, got %d", maxBatch, len(m.GetTasks()))
	}
	if len(m.GetIds()) != 0 && len(m.GetIds()) != len(m.GetTasks()) {
		return nil, apierr.Invalid("ids", "must be empty or one per task (%d), got %d", len(m.GetTasks()), len(m.GetIds()))
	}
	seen := make(map[uint64]int, len(m.GetIds()))
	for i, id := range m.GetIds() {
		if j, dup := seen[id]; dup && id != 0 {
			return nil, apierr.Invalid(fmt.Sprintf("ids[%d]", i), "repeats ids[%d]", j)
		}
		seen[id] = i
	}
	ids := make([]uint64, len(m.GetTasks()))
	writes := make([]*crdt.Task, 0, len(m.GetTasks()))
	for i, ts := range m.GetTasks() {
		field := fmt.Sprintf("tasks[%d]", i)
		spec, err := n.specFromAPI(field, ts)
		if err != nil {
			return nil, err
		}
		var id uint64
		if len(m.GetIds()) > 0 {
			id = m.GetIds()[i]
		}
		t, err := n.prepareEnqueue(ctx, field, spec, id)
		if err != nil {
			return nil, err
		}
		ids[i] = t.ID
		writes = append(writes, t)
	}
	acks, err := n.coord.Write(ctx, writes, m.GetW(), ids)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.EnqueueBatchResponse{Ids: ids, Acks: acks}), nil
}

func (s taskService) GetTask(ctx context.Context, req *connect.Request[nornv1.GetTaskRequest]) (*connect.Response[nornv1.GetTaskResponse], error) {
	n := s.n
	if req.Msg.GetId() == 0 {
		return nil, apierr.Invalid("id", "required")
	}
	ts, err := n.coord.Read(ctx, req.Msg.GetId(), int(req.Msg.GetR()))
	if err != nil {
		return nil, apierr.From(err)
	}
	return connect.NewResponse(&nornv1.GetTaskResponse{Task: n.coord.View(ts)}), nil
}

// leaseArg validates a lease duration; nil means the default.
func (n *Node) leaseArg(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return n.cfg.DefaultLease, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, apierr.Invalid("lease", "%v", err)
	}
	l := d.AsDuration()
	if l <= 0 || l > n.cfg.MaxLease {
		return 0, apierr.Invalid("lease", "must be in (0, %s], got %s", n.cfg.MaxLease, l)
	}
	if l < time.Millisecond {
		return 0, apierr.Invalid("lease", "must be at least 1ms, got %s", l)
	}
	return l, nil
}

func requireClaim(id, claimID uint64) error {
	if id == 0 {
		return apierr.Invalid("id", "required")
	}
	if claimID == 0 {
		return apierr.Invalid("claimId", "required")
	}
	return nil
}

func (s taskService) Renew(ctx context.Context, req *connect.Request[nornv1.RenewRequest]) (*connect.Response[nornv1.RenewResponse], error) {
	n, m := s.n, req.Msg
	if err := requireClaim(m.GetId(), m.GetClaimId()); err != nil {
		return nil, err
	}
	if resp, done, err := coord.Forward(n.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Renew); done {
		return resp, err
	}
	lease, err := n.leaseArg(m.GetLease())
	if err != nil {
		return nil, err
	}
	ts, err := n.dispatch.LoadClaimed(ctx, m.GetId(), m.GetClaimId())
	if err != nil {
		return nil, apierr.From(err)
	}
	if n.dispatch.EndIfTerminal(ts) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d is terminal", m.GetId()))
	}
	o, err := n.dispatch.Propose(m.GetId(), &claims.Command{Op: claims.OpRenew, NowMs: n.cfg.Clock.Now().UnixMilli(),
		ID: m.GetId(), Token: m.GetClaimId(), LeaseMs: lease.Milliseconds()})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.RenewResponse{Expiry: timestamppb.New(time.UnixMilli(o.Claim.ExpiryMs))}), nil
}

// liveClaim checks that claimID is the task's live claim.
func liveClaim(ts *coord.TaskState, claimID uint64) error {
	if ts.Claims != nil {
		if c, ok := ts.Claims.Live(); ok && c.Token == claimID {
			return nil
		}
	}
	return connect.NewError(connect.CodeFailedPrecondition,
		fmt.Errorf("claimId: %d is not the live claim of task %d: %w", claimID, ts.Task.ID, claims.ErrClaimSuperseded))
}

func (s taskService) Update(ctx context.Context, req *connect.Request[nornv1.UpdateRequest]) (*connect.Response[nornv1.UpdateResponse], error) {
	n, m := s.n, req.Msg
	if _, err := n.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	if err := requireClaim(m.GetId(), m.GetClaimId()); err != nil {
		return nil, err
	}
	if resp, done, err := coord.Forward(n.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Update); done {
		return resp, err
	}
	if m.GetSeq() == 0 {
		return nil, apierr.Invalid("seq", "must be at least 1")
	}
	u := crdt.Update{Claim: m.GetClaimId(), Seq: m.GetSeq(), Progress: m.GetProgress(), Message: m.GetMessage(), Data: m.GetData()}
	if len(u.Data) == 0 {
		u.Data = nil
	}
	if err := u.Validate(n.cfg.Limits); err != nil {
		return nil, apierr.From(err)
	}
	ts, err := n.dispatch.LoadClaimed(ctx, m.GetId(), m.GetClaimId())
	if err != nil {
		return nil, apierr.From(err)
	}
	if _, terminal := ts.Task.Terminal(); terminal {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d is terminal", m.GetId()))
	}
	if err := liveClaim(ts, m.GetClaimId()); err != nil {
		return nil, err
	}
	u.At = n.hlc.Now()
	acks, err := n.coord.Write(ctx, []*crdt.Task{{ID: m.GetId(), Updates: []crdt.Update{u}}}, m.GetW(), []uint64{m.GetId()})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.UpdateResponse{Acks: acks}), nil
}

// finish records a terminal event for a claimed task (complete or abort):
// the claim must be the live one, or the one that already ended the task
// the same way (an idempotent retry). It returns the acks.
func (n *Node) finish(ctx context.Context, id, claimID uint64, w uint32, ev crdt.Terminal) (uint32, error) {
	if _, err := n.coord.Quorum(w); err != nil {
		return 0, err
	}
	t, err := n.prepareFinish(ctx, id, claimID, ev)
	if err != nil {
		return 0, err
	}
	// A retry of the same call writes the stored state again, so that it
	// reaches the quorum it may have missed.
	return n.coord.Write(ctx, []*crdt.Task{t}, w, []uint64{id})
}

// prepareFinish checks that the terminal event ev may end task id under
// claim claimID and returns the state to write: the event, or the task's
// state when the same event already took effect (a retry).
func (n *Node) prepareFinish(ctx context.Context, id, claimID uint64, ev crdt.Terminal) (*crdt.Task, error) {
	if err := requireClaim(id, claimID); err != nil {
		return nil, err
	}
	ev.Claim = claimID
	if err := ev.Validate(n.cfg.Limits); err != nil {
		return nil, apierr.From(err)
	}
	ts, err := n.dispatch.LoadClaimed(ctx, id, claimID)
	if err != nil {
		return nil, apierr.From(err)
	}
	if prev, terminal := ts.Task.Terminal(); terminal {
		n.dispatch.EndIfTerminal(ts)
		if prev.Kind == ev.Kind && prev.Claim == claimID {
			return ts.Task, nil
		}
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d is already %v", id, prev.Kind))
	}
	if err := liveClaim(ts, claimID); err != nil {
		return nil, err
	}
	ev.At = n.hlc.Now()
	return &crdt.Task{ID: id, Terminals: []crdt.Terminal{ev}}, nil
}

func (s taskService) Complete(ctx context.Context, req *connect.Request[nornv1.CompleteRequest]) (*connect.Response[nornv1.CompleteResponse], error) {
	m := req.Msg
	if resp, done, err := coord.Forward(s.n.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Complete); done {
		return resp, err
	}
	result := m.GetResult()
	if len(result) == 0 {
		result = nil
	}
	acks, err := s.n.finish(ctx, m.GetId(), m.GetClaimId(), m.GetW(), crdt.Terminal{Kind: crdt.Completed, Result: result})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.CompleteResponse{Acks: acks}), nil
}

// maxCompleteBatch bounds the completions of one CompleteBatch.
const maxCompleteBatch = 10_000

func (s taskService) CompleteBatch(ctx context.Context, req *connect.Request[nornv1.CompleteBatchRequest]) (*connect.Response[nornv1.CompleteBatchResponse], error) {
	n, m := s.n, req.Msg
	if _, err := n.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	cs := m.GetCompletions()
	if len(cs) == 0 || len(cs) > maxCompleteBatch {
		return nil, apierr.Invalid("completions", "must hold 1 to %d completions, got %d", maxCompleteBatch, len(cs))
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
		if target := n.coord.RouteTarget(n.host.Partition(c.GetId()), transport.Hops(req)); target != "" && c.GetId() != 0 {
			remote[target] = append(remote[target], i)
		} else {
			local = append(local, i)
		}
	}
	var wg sync.WaitGroup
	var localMu sync.Mutex
	for target, idx := range remote {
		wg.Go(func() {
			back := n.forwardCompletions(ctx, req, target, idx, results)
			localMu.Lock()
			local = append(local, back...)
			localMu.Unlock()
		})
	}
	wg.Wait()
	var tasks []*crdt.Task
	var written []int // index in cs of each of tasks
	for _, i := range local {
		c := cs[i]
		result := c.GetResult()
		if len(result) == 0 {
			result = nil
		}
		t, err := n.prepareFinish(ctx, c.GetId(), c.GetClaimId(), crdt.Terminal{Kind: crdt.Completed, Result: result})
		if err != nil {
			fail(i, err)
			continue
		}
		tasks = append(tasks, t)
		written = append(written, i)
	}
	if len(tasks) > 0 {
		// One write (one synced commit per replica) for the whole batch.
		acks, w, lastErr, err := n.coord.WriteEach(ctx, tasks, m.GetW())
		if err != nil {
			return nil, err
		}
		for k, i := range written {
			if acks[k] >= w {
				results[i] = &nornv1.CompletionResult{Acks: acks[k]}
			} else {
				fail(i, n.coord.QuorumError([]uint64{cs[i].GetId()}, acks[k], w, lastErr))
			}
		}
	}
	return connect.NewResponse(&nornv1.CompleteBatchResponse{Results: results}), nil
}

// forwardCompletions sends the completions idx of a CompleteBatch to the
// node at target and fills their results. It returns the completions to
// handle here instead: all of them when target could not be reached and
// this node replicates their partitions.
func (n *Node) forwardCompletions(ctx context.Context, req *connect.Request[nornv1.CompleteBatchRequest], target string, idx []int, results []*nornv1.CompletionResult) (here []int) {
	cs := req.Msg.GetCompletions()
	sub := &nornv1.CompleteBatchRequest{W: req.Msg.GetW()}
	for _, i := range idx {
		sub.Completions = append(sub.Completions, cs[i])
	}
	resp, err := n.peers.Get(target).Tasks.CompleteBatch(ctx, transport.Forwarded(sub, transport.Hops(req)))
	if err == nil && len(resp.Msg.GetResults()) != len(idx) {
		err = connect.NewError(connect.CodeInternal, fmt.Errorf("node %s answered %d results for %d completions", target, len(resp.Msg.GetResults()), len(idx)))
	}
	for k, i := range idx {
		switch {
		case err != nil && coord.Unreachable(err) && n.host.Group(n.host.Partition(cs[i].GetId())) != nil:
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
	if resp, done, err := coord.Forward(s.n.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Abort); done {
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
	acks, err := s.n.finish(ctx, m.GetId(), m.GetClaimId(), m.GetW(), ev)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.AbortResponse{Acks: acks}), nil
}

func (s taskService) Yield(ctx context.Context, req *connect.Request[nornv1.YieldRequest]) (*connect.Response[nornv1.YieldResponse], error) {
	n, m := s.n, req.Msg
	if err := requireClaim(m.GetId(), m.GetClaimId()); err != nil {
		return nil, err
	}
	if resp, done, err := coord.Forward(n.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Yield); done {
		return resp, err
	}
	if p := m.GetProgress(); math.IsNaN(p) || p < 0 || p > 1 {
		return nil, apierr.Invalid("progress", "must be in [0, 1], got %v", p)
	}
	ts, err := n.dispatch.LoadClaimed(ctx, m.GetId(), m.GetClaimId())
	if err != nil {
		return nil, apierr.From(err)
	}
	if n.dispatch.EndIfTerminal(ts) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d is terminal", m.GetId()))
	}
	if err := liveClaim(ts, m.GetClaimId()); err != nil {
		return nil, err
	}
	if p := m.GetProgress(); p > 0 {
		seq := uint64(1)
		for _, u := range ts.Task.Updates {
			if u.Claim == m.GetClaimId() {
				seq = max(seq, u.Seq+1)
			}
		}
		up := crdt.Update{Claim: m.GetClaimId(), Seq: seq, At: n.hlc.Now(), Progress: p}
		if _, err := n.coord.Write(ctx, []*crdt.Task{{ID: m.GetId(), Updates: []crdt.Update{up}}}, 0, []uint64{m.GetId()}); err != nil {
			return nil, err
		}
	}
	if _, err := n.dispatch.Propose(m.GetId(), &claims.Command{Op: claims.OpYield, NowMs: n.cfg.Clock.Now().UnixMilli(),
		ID: m.GetId(), Token: m.GetClaimId()}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.YieldResponse{}), nil
}

func (s taskService) Cancel(ctx context.Context, req *connect.Request[nornv1.CancelRequest]) (*connect.Response[nornv1.CancelResponse], error) {
	n, m := s.n, req.Msg
	if _, err := n.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	if m.GetId() == 0 {
		return nil, apierr.Invalid("id", "required")
	}
	if resp, done, err := coord.Forward(n.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Cancel); done {
		return resp, err
	}
	ts, err := n.coord.Load(m.GetId())
	if errors.Is(err, storage.ErrNotFound) {
		// This replica may have missed the enqueue (W < N, a power loss):
		// only a majority can say the task does not exist.
		ts, err = n.coord.Read(ctx, m.GetId(), 0)
	}
	if err != nil {
		return nil, apierr.From(err)
	}
	if prev, terminal := ts.Task.Terminal(); terminal {
		n.dispatch.EndIfTerminal(ts)
		if prev.Kind == crdt.Cancelled {
			acks, err := n.coord.Write(ctx, []*crdt.Task{ts.Task}, m.GetW(), []uint64{m.GetId()})
			if err != nil {
				return nil, err
			}
			return connect.NewResponse(&nornv1.CancelResponse{Acks: acks}), nil
		}
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d is already %v", m.GetId(), prev.Kind))
	}
	ev := crdt.Terminal{At: n.hlc.Now(), Kind: crdt.Cancelled}
	acks, err := n.coord.Write(ctx, []*crdt.Task{{ID: m.GetId(), Terminals: []crdt.Terminal{ev}}}, m.GetW(), []uint64{m.GetId()})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.CancelResponse{Acks: acks}), nil
}
