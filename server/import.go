package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// MaxImportBatch bounds the tasks of one ImportTasks call.
const MaxImportBatch = 1000

// ImportClaimID is the claim id of an imported completion or abort. The
// claim that ended the task belongs to the cluster it was exported from
// (claim ids are Raft indexes there); 1 is never a claim's id (a
// partition group's first log entry is its configuration), and a
// terminal task is never claimed again.
const ImportClaimID = 1

// importFutureSlack is how far after this node's clock an imported time
// may be (the exporting cluster's clocks may run a little ahead).
const importFutureSlack = time.Minute

// importLookups bounds the concurrent id lookups of one ImportTasks.
const importLookups = 16

func (a adminService) ImportTasks(ctx context.Context, req *connect.Request[nornv1.ImportTasksRequest]) (*connect.Response[nornv1.ImportTasksResponse], error) {
	sv, m := a.sv, req.Msg
	if _, err := sv.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	in := m.GetTasks()
	if len(in) == 0 || len(in) > MaxImportBatch {
		return nil, apierr.Invalid("tasks", "must hold 1 to %d tasks, got %d", MaxImportBatch, len(in))
	}
	seen := make(map[uint64]int, len(in))
	writes := make([]*crdt.Task, len(in))
	for i, t := range in {
		field := fmt.Sprintf("tasks[%d]", i)
		if j, dup := seen[t.GetId()]; dup && t.GetId() != 0 {
			return nil, apierr.Invalid(field+".id", "repeats tasks[%d].id", j)
		}
		seen[t.GetId()] = i
		w, err := sv.importFromAPI(field, t)
		if err != nil {
			return nil, err
		}
		writes[i] = w
	}
	if err := sv.mergeWithStored(ctx, writes); err != nil {
		return nil, err
	}
	if m.GetValidateOnly() {
		return connect.NewResponse(&nornv1.ImportTasksResponse{Imported: uint32(len(writes))}), nil
	}
	ids := make([]uint64, len(writes))
	for i, w := range writes {
		ids[i] = w.ID
	}
	acks, err := sv.coord.Write(ctx, writes, m.GetW(), ids)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.ImportTasksResponse{Imported: uint32(len(writes)), Acks: acks}), nil
}

// importFromAPI validates one imported task and converts it to the state
// to write (ImportTasksRequest documents the rules). field names it in
// errors ("tasks[3]").
func (sv *Server) importFromAPI(field string, t *nornv1.Task) (*crdt.Task, error) {
	if t.GetId() == 0 {
		return nil, apierr.Invalid(field+".id", "required")
	}
	spec, err := sv.specFromAPI(field+".spec", t.GetSpec(), true)
	if err != nil {
		return nil, err
	}
	if spec.UniqueKey != "" {
		// Its key would not be held here: a later enqueue could make a
		// second live task with it (docs/SCHEDULING.md).
		return nil, apierr.Invalid(field+".spec.uniqueKey", "ImportTasks does not take tasks with unique keys yet; enqueue them instead")
	}
	now := sv.cfg.Clock.Now()
	created, err := importTime(field+".createdAt", t.GetCreatedAt(), now)
	if err != nil {
		return nil, err
	}
	if created == 0 {
		return nil, apierr.Invalid(field+".createdAt", "required")
	}
	spec.CreatedAt = crdt.Timestamp{WallMs: created}
	out := &crdt.Task{ID: t.GetId(), Spec: spec}
	// Errors with an attempt are the failed attempts' (retries): kept
	// as one failure of the import's claim (the attempts' claims belong
	// to the exporting cluster); the others are the terminal event's.
	var ended []*nornv1.TaskError
	var failed []crdt.TaskError
	for _, e := range t.GetErrors() {
		if e.GetAttempt() == 0 {
			ended = append(ended, e)
			continue
		}
		failed = append(failed, crdt.TaskError{Code: e.GetCode(), Description: e.GetDescription(), Args: e.GetArgs()})
	}
	if len(failed) > 0 {
		out.Failures = []crdt.Failure{{Claim: ImportClaimID, At: crdt.Timestamp{WallMs: created}, Errors: failed}}
		if err := (&crdt.Task{ID: out.ID, Failures: out.Failures}).Validate(sv.cfg.Limits); err != nil {
			return nil, apierr.From(prefixField(field, err))
		}
	}
	var kind crdt.TerminalKind
	switch t.GetStatus() {
	case nornv1.TaskStatus_TASK_STATUS_COMPLETED:
		kind = crdt.Completed
	case nornv1.TaskStatus_TASK_STATUS_ABORTED:
		kind = crdt.Aborted
	case nornv1.TaskStatus_TASK_STATUS_CANCELLED:
		kind = crdt.Cancelled
	case nornv1.TaskStatus_TASK_STATUS_DEAD:
		kind = crdt.Dead
	case nornv1.TaskStatus_TASK_STATUS_UNSPECIFIED, nornv1.TaskStatus_TASK_STATUS_READY,
		nornv1.TaskStatus_TASK_STATUS_DELAYED, nornv1.TaskStatus_TASK_STATUS_CLAIMED:
		// Not terminal: the spec alone (its claims and updates belong to
		// the exporting cluster's claim ids).
		switch {
		case len(t.GetResult()) > 0:
			return nil, apierr.Invalid(field+".result", "only a COMPLETED task has a result (status is %v)", t.GetStatus())
		case len(ended) > 0:
			return nil, apierr.Invalid(field+".errors", "only an ABORTED or DEAD task has errors without an attempt (status is %v)", t.GetStatus())
		}
		return out, nil
	default:
		return nil, apierr.Invalid(field+".status", "unknown status %d", t.GetStatus())
	}
	ev, err := importTerminal(field, t, ended, kind, now)
	if err != nil {
		return nil, err
	}
	if err := ev.Validate(sv.cfg.Limits); err != nil {
		return nil, apierr.From(prefixField(field, err))
	}
	out.Terminals = []crdt.Terminal{ev}
	keys := make(map[[2]uint64]int, len(t.GetUpdates()))
	for j, u := range t.GetUpdates() {
		uf := fmt.Sprintf("%s.updates[%d]", field, j)
		at, err := importTime(uf+".at", u.GetAt(), now)
		if err != nil {
			return nil, err
		}
		if at == 0 {
			return nil, apierr.Invalid(uf+".at", "required")
		}
		if u.GetSeq() == 0 {
			return nil, apierr.Invalid(uf+".seq", "must be at least 1")
		}
		key := [2]uint64{u.GetClaimId(), u.GetSeq()}
		if k, dup := keys[key]; dup {
			return nil, apierr.Invalid(uf, "repeats the claimId and seq of %s.updates[%d]", field, k)
		}
		keys[key] = j
		cu := crdt.Update{Claim: u.GetClaimId(), Seq: u.GetSeq(), At: crdt.Timestamp{WallMs: at},
			Progress: u.GetProgress(), Message: u.GetMessage(), Data: u.GetData()}
		if len(cu.Data) == 0 {
			cu.Data = nil
		}
		if err := cu.Validate(sv.cfg.Limits); err != nil {
			return nil, apierr.From(prefixField(uf, err))
		}
		out.Updates = append(out.Updates, cu)
	}
	out.Normalize()
	return out, nil
}

// importTerminal is the terminal event of an imported task of kind.
// errs are its errors without an attempt.
func importTerminal(field string, t *nornv1.Task, errs []*nornv1.TaskError, kind crdt.TerminalKind, now time.Time) (crdt.Terminal, error) {
	tsField, ts := field+".finishedAt", t.GetFinishedAt()
	if ts == nil {
		tsField, ts = field+".updatedAt", t.GetUpdatedAt()
	}
	at, err := importTime(tsField, ts, now)
	if err != nil {
		return crdt.Terminal{}, err
	}
	if at == 0 {
		return crdt.Terminal{}, apierr.Invalid(field+".finishedAt", "required for a %v task (or updatedAt)", t.GetStatus())
	}
	ev := crdt.Terminal{At: crdt.Timestamp{WallMs: at}, Kind: kind}
	if kind != crdt.Cancelled {
		ev.Claim = ImportClaimID
	}
	switch {
	case kind != crdt.Completed && len(t.GetResult()) > 0:
		return ev, apierr.Invalid(field+".result", "only a COMPLETED task has a result (status is %v)", t.GetStatus())
	case kind != crdt.Aborted && kind != crdt.Dead && len(errs) > 0:
		return ev, apierr.Invalid(field+".errors", "only an ABORTED or DEAD task has errors without an attempt (status is %v)", t.GetStatus())
	case kind == crdt.Aborted && len(errs) == 0:
		return ev, apierr.Invalid(field+".errors", "an ABORTED task needs at least one error")
	}
	if len(t.GetResult()) > 0 {
		ev.Result = t.GetResult()
	}
	for _, e := range errs {
		ev.Errors = append(ev.Errors, crdt.TaskError{Code: e.GetCode(), Description: e.GetDescription(), Args: e.GetArgs()})
	}
	return ev, nil
}

// importTime checks an imported timestamp and returns it in Unix ms (0
// when unset): valid, not before 1970, not after now (with slack).
func importTime(field string, ts *timestamppb.Timestamp, now time.Time) (int64, error) {
	if ts == nil {
		return 0, nil
	}
	if err := ts.CheckValid(); err != nil {
		return 0, apierr.Invalid(field, "%v", err)
	}
	t := ts.AsTime()
	switch {
	case t.UnixMilli() <= 0:
		return 0, apierr.Invalid(field, "%s is not after 1970", t.Format(time.RFC3339Nano))
	case t.After(now.Add(importFutureSlack)):
		return 0, apierr.Invalid(field, "%s is after this node's clock (%s)", t.Format(time.RFC3339Nano), now.Format(time.RFC3339))
	}
	return t.UnixMilli(), nil
}

// prefixField puts prefix in front of the field a crdt validation error
// names ("errors[0].code" -> "tasks[3].errors[0].code").
func prefixField(prefix string, err error) error {
	var fe *crdt.FieldError
	if errors.As(err, &fe) {
		fe.Field = prefix + "." + fe.Field
	}
	return err
}

// mergeWithStored looks every imported task up in the cluster and makes
// its write change nothing that is already there, so that importing the
// same tasks again, or into the cluster they came from, is a no-op:
//   - a task stored with a different spec or creation time is
//     ALREADY_EXISTS; with the same, the stored spec is written (its
//     creation time to the HLC's logical counter and node);
//   - a task stored terminal keeps its terminal event (a different
//     outcome in the import is ALREADY_EXISTS), and updates it has
//     already are not written again.
func (sv *Server) mergeWithStored(ctx context.Context, writes []*crdt.Task) error {
	errs := make([]error, len(writes))
	sem := make(chan struct{}, importLookups)
	var wg sync.WaitGroup
	for i, w := range writes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = sv.mergeOneWithStored(ctx, fmt.Sprintf("tasks[%d]", i), w)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err // the first task's, as the validation reports
		}
	}
	return nil
}

func (sv *Server) mergeOneWithStored(ctx context.Context, field string, w *crdt.Task) error {
	stored, err := sv.coord.Lookup(ctx, w.ID)
	if errors.Is(err, storage.ErrNotFound) {
		return nil
	}
	if err != nil {
		return apierr.From(err)
	}
	if !sameSpec(stored.Spec, w.Spec) || stored.Spec.CreatedAt.WallMs != w.Spec.CreatedAt.WallMs {
		return connect.NewError(connect.CodeAlreadyExists,
			fmt.Errorf("%s.id: task %d exists with a different spec or creation time", field, w.ID))
	}
	w.Spec = stored.Spec
	if prev, ok := stored.Terminal(); ok {
		if ev, imported := w.Terminal(); imported && ev.Kind != prev.Kind {
			return connect.NewError(connect.CodeAlreadyExists,
				fmt.Errorf("%s.status: task %d is %v here, %v in the import", field, w.ID, prev.Kind, ev.Kind))
		}
		w.Terminals = nil
	}
	have := make(map[[2]uint64]bool, len(stored.Updates))
	for _, u := range stored.Updates {
		have[[2]uint64{u.Claim, u.Seq}] = true
	}
	kept := w.Updates[:0]
	for _, u := range w.Updates {
		if !have[[2]uint64{u.Claim, u.Seq}] {
			kept = append(kept, u)
		}
	}
	w.Updates = kept
	return nil
}
