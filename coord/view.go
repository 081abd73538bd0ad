package coord

import (
	"errors"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// TaskState is everything this node knows of a task: its CRDT state and
// the claim FSM's record (nil when never claimed).
type TaskState struct {
	P      uint16         // the task's partition
	Task   *crdt.Task     // the CRDT state, with its spec
	Claims *claims.Record // nil when never claimed
	// NoLeader: a read that reached no leader of the partition; Claims is
	// a replica's record, which may be behind (Task.claim_state_unknown).
	NoLeader bool
}

// Load reads a task's CRDT state and FSM record. It returns
// storage.ErrNotFound when the node has not seen the task's spec.
func (c *Coordinator) Load(id uint64) (*TaskState, error) {
	p := c.host.Partition(id)
	t, err := c.store.TaskState(p, id)
	if err != nil {
		return nil, err
	}
	return c.withClaims(p, t)
}

// withClaims completes a task state read by the caller with its claim
// record. A task whose enqueue has not reached this replica (no spec) is
// not found.
func (c *Coordinator) withClaims(p uint16, t *crdt.Task) (*TaskState, error) {
	if t.Spec == nil {
		return nil, storage.ErrNotFound
	}
	rec, err := c.ClaimRecord(p, t.ID)
	if err != nil {
		return nil, err
	}
	return &TaskState{P: p, Task: t, Claims: rec}, nil
}

// ClaimRecord reads the claim FSM's record of id (nil when never claimed).
func (c *Coordinator) ClaimRecord(p uint16, id uint64) (*claims.Record, error) {
	b, err := c.store.ClaimFSMRecord(p, id)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return claims.DecodeRecord(b)
}

// Status derives a task's status at nowMs. deps reports whether all
// dependencies are completed (nil: do not check, treat as done).
func (ts *TaskState) Status(nowMs int64, depsDone func([]uint64) bool) nornv1.TaskStatus {
	if ev, ok := ts.Task.Terminal(); ok {
		switch ev.Kind {
		case crdt.Completed:
			return nornv1.TaskStatus_TASK_STATUS_COMPLETED
		case crdt.Aborted:
			return nornv1.TaskStatus_TASK_STATUS_ABORTED
		case crdt.Dead:
			return nornv1.TaskStatus_TASK_STATUS_DEAD
		default:
			return nornv1.TaskStatus_TASK_STATUS_CANCELLED
		}
	}
	retryAt := int64(0)
	if ts.Claims != nil {
		if ts.Claims.Dead {
			if ts.Claims.Retry != nil {
				return nornv1.TaskStatus_TASK_STATUS_DEAD
			}
			return nornv1.TaskStatus_TASK_STATUS_ABORTED
		}
		if _, live := ts.Claims.Live(); live {
			return nornv1.TaskStatus_TASK_STATUS_CLAIMED
		}
		retryAt = ts.Claims.RetryAtMs
	}
	spec := ts.Task.Spec
	if spec.NotBeforeMs > nowMs || retryAt > nowMs || (depsDone != nil && len(spec.DependsOn) > 0 && !depsDone(spec.DependsOn)) {
		return nornv1.TaskStatus_TASK_STATUS_DELAYED
	}
	return nornv1.TaskStatus_TASK_STATUS_READY
}

// msTime is a wall time in ms as a protobuf timestamp (nil for 0).
func msTime(ms int64) *timestamppb.Timestamp {
	if ms == 0 {
		return nil
	}
	return timestamppb.New(time.UnixMilli(ms))
}

// msDurationPB is ms as an API duration, nil for 0.
func msDurationPB(ms int64) *durationpb.Duration {
	if ms == 0 {
		return nil
	}
	return durationpb.New(msDuration(ms))
}

// View renders a task for the API.
func (c *Coordinator) View(ts *TaskState) *nornv1.Task {
	t, spec := ts.Task, ts.Task.Spec
	v := &nornv1.Task{
		Id: t.ID,
		Spec: &nornv1.TaskSpec{
			Queue: spec.Queue, Priority: spec.Priority, Payload: spec.Payload,
			NotBefore: msTime(spec.NotBeforeMs), DependsOn: spec.DependsOn, MaxClaims: spec.MaxClaims,
			Retry: RetryToAPI(spec.Retry), Deadline: msTime(spec.DeadlineMs),
			UniqueKey: spec.UniqueKey, UniqueFor: msDurationPB(spec.UniqueForMs),
			FairnessKey: spec.FairnessKey, FairnessWeight: spec.FairnessWeight,
		},
		Status:    ts.Status(c.cfg.Clock.Now().UnixMilli(), c.cfg.DepsDone),
		CreatedAt: msTime(spec.CreatedAt.WallMs),
		Life:      ts.Life(),
	}
	if _, terminal := t.Terminal(); ts.NoLeader && !terminal {
		v.ClaimStateUnknown = true
	}
	updated := spec.CreatedAt
	for _, u := range t.Updates {
		v.Updates = append(v.Updates, &nornv1.TaskUpdate{ClaimId: u.Claim, Seq: u.Seq, At: msTime(u.At.WallMs),
			Progress: u.Progress, Message: u.Message, Data: u.Data})
		if updated.Less(u.At) {
			updated = u.At
		}
	}
	if last, ok := t.LastUpdate(); ok {
		v.Progress = last.Progress
	}
	v.Errors = failureErrors(t, ts.Claims)
	if ts.Claims != nil {
		v.FailedAttempts = ts.Claims.FailedAttempts()
		if v.Status == nornv1.TaskStatus_TASK_STATUS_DELAYED && ts.Claims.RetryAtMs > c.cfg.Clock.Now().UnixMilli() {
			v.RetryAt = msTime(ts.Claims.RetryAtMs)
		}
	}
	for _, f := range t.Failures {
		if updated.Less(f.At) {
			updated = f.At
		}
	}
	if ev, ok := t.Terminal(); ok {
		v.Result = ev.Result
		for _, e := range ev.Errors {
			v.Errors = append(v.Errors, &nornv1.TaskError{Code: e.Code, Description: e.Description, Args: e.Args})
		}
		if updated.Less(ev.At) {
			updated = ev.At
		}
		v.FinishedAt = msTime(ev.At.WallMs)
		if ev.Kind == crdt.Completed {
			v.Progress = 1
		}
	}
	if ts.Claims != nil {
		if ts.Claims.Dead && ts.Claims.Retry == nil && len(v.Errors) == 0 {
			v.Errors = append(v.Errors, MaxClaimsError(ts.Claims.MaxClaims))
		}
		ev, terminal := t.Terminal()
		for i := range ts.Claims.History {
			c := &ts.Claims.History[i]
			if c.End == claims.EndNone && terminal {
				// The terminal event decided; the claim FSM has not
				// recorded the end yet (it is proposed in the background).
				ended := *c
				ended.End, ended.EndedMs = EndReason(ev.Kind), ev.At.WallMs
				c = &ended
			}
			ci := &nornv1.ClaimInfo{ClaimId: c.Token, Seq: uint32(c.Seq), Worker: c.Worker,
				Start: msTime(c.StartMs), Expiry: msTime(c.ExpiryMs),
				EndReason: nornv1.ClaimEnd(c.End), EndedAt: msTime(c.EndedMs)}
			v.Claims = append(v.Claims, ci)
			if c.End == claims.EndNone {
				v.CurrentClaim = ci
			}
			if last := max(c.StartMs, c.EndedMs); last > updated.WallMs {
				updated = crdt.Timestamp{WallMs: last}
			}
		}
	}
	v.UpdatedAt = msTime(updated.WallMs)
	return v
}

// MaxClaimsError is the error of a task whose claims expired limit times.
func MaxClaimsError(limit uint32) *nornv1.TaskError {
	return &nornv1.TaskError{Code: "max_claims_exceeded",
		Description: "the task's claims expired max_claims times", Args: []string{strconv.FormatUint(uint64(limit), 10)}}
}

// DependencyFailedError is the error of a task aborted because dep
// failed.
func DependencyFailedError(dep uint64) *nornv1.TaskError {
	return &nornv1.TaskError{Code: "dependency_failed",
		Description: "a task this one depends on was aborted or cancelled", Args: []string{strconv.FormatUint(dep, 10)}}
}

// DeadlineError is the error of a task cancelled because its deadline
// (Unix ms) passed.
func DeadlineError(deadlineMs int64) *nornv1.TaskError {
	return &nornv1.TaskError{Code: "deadline",
		Description: "the task was not completed by its deadline", Args: []string{time.UnixMilli(deadlineMs).UTC().Format(time.RFC3339Nano)}}
}

// EndReason is the claim end a terminal event of kind k makes.
func EndReason(k crdt.TerminalKind) claims.EndReason {
	switch k {
	case crdt.Completed:
		return claims.EndCompleted
	case crdt.Aborted:
		return claims.EndAborted
	case crdt.Dead:
		return claims.EndFailed
	}
	return claims.EndCancelled
}
