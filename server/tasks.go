package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// taskService implements norn.v1.TaskService on a node.
type taskService struct {
	sv *Server
}

var _ nornv1connect.TaskServiceHandler = taskService{}

// specFromAPI validates and converts a TaskSpec. imported marks the spec
// of a task ImportTasks carries over, whose deadline may have passed.
func (sv *Server) specFromAPI(field string, s *nornv1.TaskSpec, imported bool) (*crdt.Spec, error) {
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
	retry, err := sv.retryFromAPI(field, "retry", s.GetRetry())
	if err != nil {
		return nil, err
	}
	spec.Retry = retry
	if dl := s.GetDeadline(); dl != nil {
		if spec.DeadlineMs, err = sv.deadlineFromAPI(field+".deadline", dl, imported); err != nil {
			return nil, err
		}
	}
	if spec.UniqueKey, spec.UniqueForMs, err = sv.uniqueFromAPI(field, s); err != nil {
		return nil, err
	}
	spec.FairnessKey, spec.FairnessWeight = s.GetFairnessKey(), s.GetFairnessWeight()
	if spec.FairnessKey != "" || spec.FairnessWeight > 1 {
		// One encoding per meaning: a key's weight 0 is 1, and a task
		// without a key has none.
		if spec.FairnessKey != "" && spec.FairnessWeight == 0 {
			spec.FairnessWeight = 1
		}
		if spec.FairnessKey != "" {
			if err := sv.featureGate(field+".fairnessKey", cluster.FeatureFairness, "fairness keys"); err != nil {
				return nil, err
			}
		}
	} else {
		spec.FairnessWeight = 0
	}
	if err := spec.Validate(sv.cfg.Limits); err != nil {
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

// queueDefaults gives an enqueued spec that names no retry policy its
// queue's default one (QueueSettings.default_retry), if it has one.
func (sv *Server) queueDefaults(spec *crdt.Spec) {
	if spec.Retry != nil {
		return
	}
	if p := sv.queueSettings(spec.Queue).DefaultRetry; p != nil {
		cp := *p
		spec.Retry = &cp
	}
}

// queueOf is t's queue, "" when its spec is not known here.
func queueOf(t *crdt.Task) string {
	if t == nil || t.Spec == nil {
		return ""
	}
	return t.Spec.Queue
}

// sameSpec compares the user-given fields of two specs.
func sameSpec(a, b *crdt.Spec) bool {
	return a.Queue == b.Queue && a.Priority == b.Priority && bytes.Equal(a.Payload, b.Payload) &&
		a.NotBeforeMs == b.NotBeforeMs && slices.Equal(a.DependsOn, b.DependsOn) && a.MaxClaims == b.MaxClaims &&
		(a.Retry == nil) == (b.Retry == nil) && (a.Retry == nil || *a.Retry == *b.Retry) && a.DeadlineMs == b.DeadlineMs &&
		a.UniqueKey == b.UniqueKey && a.UniqueForMs == b.UniqueForMs &&
		a.FairnessKey == b.FairnessKey && a.FairnessWeight == b.FairnessWeight
}

// prepareEnqueue turns a spec into a task state to merge, or reports that an
// idempotent retry found it stored already (existing).
// A retry found the task stored already: its stored state is written again
// (so that it reaches the quorum it may have missed).
func (sv *Server) prepareEnqueue(ctx context.Context, field string, spec *crdt.Spec, id uint64) (t *crdt.Task, err error) {
	for i, d := range spec.DependsOn {
		if _, err := sv.coord.Lookup(ctx, d); err != nil {
			if errors.Is(err, storage.ErrNotFound) {
				return nil, apierr.Invalid(fmt.Sprintf("%s.dependsOn[%d]", field, i), "task %d does not exist", d)
			}
			return nil, apierr.From(err)
		}
	}
	if id == 0 {
		if id, err = sv.ids.NextID(); err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
	} else if stored, err := sv.coord.Lookup(ctx, id); err == nil {
		if !sameSpec(stored.Spec, spec) {
			return nil, connect.NewError(connect.CodeAlreadyExists,
				fmt.Errorf("id: task %d exists with a different spec", id))
		}
		return stored, nil
	} else if !errors.Is(err, storage.ErrNotFound) {
		return nil, apierr.From(err)
	}
	spec.CreatedAt = sv.hlc.Now()
	return &crdt.Task{ID: id, Spec: spec}, nil
}

func (s taskService) Enqueue(ctx context.Context, req *connect.Request[nornv1.EnqueueRequest]) (*connect.Response[nornv1.EnqueueResponse], error) {
	sv, m := s.sv, req.Msg
	if _, err := sv.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	spec, err := sv.specFromAPI("task", m.GetTask(), false)
	if err != nil {
		return nil, err
	}
	sv.queueDefaults(spec)
	t, err := sv.prepareEnqueue(ctx, "task", spec, m.GetId())
	if err != nil {
		return nil, err
	}
	if spec.UniqueKey != "" {
		ans, err := sv.enqueueUnique(ctx, t, m.GetW())
		if err != nil {
			return nil, err
		}
		if !ans.duplicate {
			sv.events.Enqueued(spec.Queue, 1)
		}
		return connect.NewResponse(&nornv1.EnqueueResponse{Id: ans.id, Acks: ans.acks, Duplicate: ans.duplicate}), nil
	}
	acks, err := sv.coord.Write(ctx, []*crdt.Task{t}, m.GetW(), []uint64{t.ID})
	if err != nil {
		return nil, err
	}
	sv.events.Enqueued(spec.Queue, 1)
	return connect.NewResponse(&nornv1.EnqueueResponse{Id: t.ID, Acks: acks}), nil
}

// maxBatch bounds EnqueueBatch.
const maxBatch = 10_000

func (s taskService) EnqueueBatch(ctx context.Context, req *connect.Request[nornv1.EnqueueBatchRequest]) (*connect.Response[nornv1.EnqueueBatchResponse], error) {
	sv, m := s.sv, req.Msg
	if _, err := sv.coord.Quorum(m.GetW()); err != nil {
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
		spec, err := sv.specFromAPI(field, ts, false)
		if err != nil {
			return nil, err
		}
		sv.queueDefaults(spec)
		var id uint64
		if len(m.GetIds()) > 0 {
			id = m.GetIds()[i]
		}
		t, err := sv.prepareEnqueue(ctx, field, spec, id)
		if err != nil {
			return nil, err
		}
		ids[i] = t.ID
		writes = append(writes, t)
	}
	writes, dups, uacks, err := sv.enqueueUniques(ctx, writes, ids, m.GetW())
	if err != nil {
		return nil, err
	}
	acks := uacks
	if len(writes) > 0 {
		wids := ids
		if dups != nil {
			wids = make([]uint64, len(writes))
			for i, t := range writes {
				wids[i] = t.ID
			}
		}
		if acks, err = sv.coord.Write(ctx, writes, m.GetW(), wids); err != nil {
			return nil, err
		}
		if uacks != 0 {
			acks = min(acks, uacks)
		}
	}
	// One call per run of tasks of one queue (a batch is mostly one).
	for i := 0; i < len(writes); {
		j := i + 1
		for j < len(writes) && writes[j].Spec.Queue == writes[i].Spec.Queue {
			j++
		}
		sv.events.Enqueued(writes[i].Spec.Queue, j-i)
		i = j
	}
	return connect.NewResponse(&nornv1.EnqueueBatchResponse{Ids: ids, Acks: acks, Duplicates: dups}), nil
}

func (s taskService) GetTask(ctx context.Context, req *connect.Request[nornv1.GetTaskRequest]) (*connect.Response[nornv1.GetTaskResponse], error) {
	sv := s.sv
	if req.Msg.GetId() == 0 {
		return nil, apierr.Invalid("id", "required")
	}
	ts, err := sv.coord.Read(ctx, req.Msg.GetId(), int(req.Msg.GetR()))
	if err != nil {
		return nil, apierr.From(err)
	}
	return connect.NewResponse(&nornv1.GetTaskResponse{Task: sv.coord.View(ts)}), nil
}

func (s taskService) Cancel(ctx context.Context, req *connect.Request[nornv1.CancelRequest]) (*connect.Response[nornv1.CancelResponse], error) {
	sv, m := s.sv, req.Msg
	if _, err := sv.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	if m.GetId() == 0 {
		return nil, apierr.Invalid("id", "required")
	}
	if resp, done, err := coord.Forward(sv.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Cancel); done {
		return resp, err
	}
	ts, err := sv.coord.Load(m.GetId())
	if errors.Is(err, storage.ErrNotFound) {
		// This replica may have missed the enqueue (W < N, a power loss):
		// only a majority can say the task does not exist.
		ts, err = sv.coord.Read(ctx, m.GetId(), 0)
	}
	if err != nil {
		return nil, apierr.From(err)
	}
	if prev, terminal := ts.Task.Terminal(); terminal && prev.Kind != crdt.Completed && !sv.leads(m.GetId()) {
		// A Retry may have given the task a new life that this replica
		// has not seen (its leader, which decided the Retry, could not
		// be reached): a majority of the replicas say, a Retry acked at
		// W of a majority among them, so that the cancel ends the life
		// the caller saw. Without a majority, this copy answers.
		if fresh, err := sv.coord.Read(ctx, m.GetId(), 0); err == nil {
			ts = fresh
		}
	}
	if prev, terminal := ts.Task.Terminal(); terminal {
		sv.dispatch.EndIfTerminal(ts)
		if prev.Kind == crdt.Cancelled {
			acks, err := sv.coord.Write(ctx, []*crdt.Task{ts.Task}, m.GetW(), []uint64{m.GetId()})
			if err != nil {
				return nil, err
			}
			return connect.NewResponse(&nornv1.CancelResponse{Acks: acks}), nil
		}
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d is already %v", m.GetId(), prev.Kind))
	}
	ev := crdt.Terminal{At: sv.hlc.Now(), Kind: crdt.Cancelled, Life: ts.Life()}
	acks, err := sv.coord.Write(ctx, []*crdt.Task{{ID: m.GetId(), Terminals: []crdt.Terminal{ev}}}, m.GetW(), []uint64{m.GetId()})
	if err != nil {
		return nil, err
	}
	sv.dispatch.EndNow(m.GetId(), ev)
	sv.events.Cancelled(queueOf(ts.Task))
	return connect.NewResponse(&nornv1.CancelResponse{Acks: acks}), nil
}

// leads reports whether this node leads the partition of task id (its
// copy then has every life the group decided).
func (sv *Server) leads(id uint64) bool {
	g := sv.host.Group(sv.host.Partition(id))
	return g != nil && g.IsLeader()
}

func (s taskService) ListTasks(ctx context.Context, req *connect.Request[nornv1.ListTasksRequest]) (*connect.Response[nornv1.ListTasksResponse], error) {
	resp, err := s.sv.coord.List(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (s taskService) CountTasks(ctx context.Context, req *connect.Request[nornv1.CountTasksRequest]) (*connect.Response[nornv1.CountTasksResponse], error) {
	resp, err := s.sv.coord.Count(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}
