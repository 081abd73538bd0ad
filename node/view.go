package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/storage"
)

// taskState is everything this node knows of a task: its CRDT state and
// the claim FSM's record (nil when never claimed).
type taskState struct {
	p      uint16
	task   *crdt.Task
	claims *claims.Record
}

// load reads a task's CRDT state and FSM record. It returns
// storage.ErrNotFound when the node has not seen the task's spec.
func (n *Node) load(id uint64) (*taskState, error) {
	p := n.host.Partition(id)
	t, err := n.store.TaskState(p, id)
	if err != nil {
		return nil, err
	}
	return n.withClaims(p, t)
}

// withClaims completes a task state read by the caller with its claim
// record. A task whose enqueue has not reached this replica (no spec) is
// not found.
func (n *Node) withClaims(p uint16, t *crdt.Task) (*taskState, error) {
	if t.Spec == nil {
		return nil, storage.ErrNotFound
	}
	rec, err := n.claimRecord(p, t.ID)
	if err != nil {
		return nil, err
	}
	return &taskState{p: p, task: t, claims: rec}, nil
}

// claimRecord reads the claim FSM's record of id (nil when never claimed).
func (n *Node) claimRecord(p uint16, id uint64) (*claims.Record, error) {
	b, err := n.store.ClaimFSMRecord(p, id)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return claims.DecodeRecord(b)
}

// status derives a task's status at nowMs. deps reports whether all
// dependencies are completed (nil: do not check, treat as done).
func (ts *taskState) status(nowMs int64, depsDone func([]uint64) bool) nornv1.TaskStatus {
	if ev, ok := ts.task.Terminal(); ok {
		switch ev.Kind {
		case crdt.Completed:
			return nornv1.TaskStatus_TASK_STATUS_COMPLETED
		case crdt.Aborted:
			return nornv1.TaskStatus_TASK_STATUS_ABORTED
		default:
			return nornv1.TaskStatus_TASK_STATUS_CANCELLED
		}
	}
	if ts.claims != nil {
		if ts.claims.Dead {
			return nornv1.TaskStatus_TASK_STATUS_ABORTED
		}
		if _, live := ts.claims.Live(); live {
			return nornv1.TaskStatus_TASK_STATUS_CLAIMED
		}
	}
	spec := ts.task.Spec
	if spec.NotBeforeMs > nowMs || (depsDone != nil && len(spec.DependsOn) > 0 && !depsDone(spec.DependsOn)) {
		return nornv1.TaskStatus_TASK_STATUS_DELAYED
	}
	return nornv1.TaskStatus_TASK_STATUS_READY
}

func msTime(ms int64) *timestamppb.Timestamp {
	if ms == 0 {
		return nil
	}
	return timestamppb.New(time.UnixMilli(ms))
}

// view renders a task for the API.
func (n *Node) view(ts *taskState) *nornv1.Task {
	t, spec := ts.task, ts.task.Spec
	v := &nornv1.Task{
		Id: t.ID,
		Spec: &nornv1.TaskSpec{
			Queue: spec.Queue, Priority: spec.Priority, Payload: spec.Payload,
			NotBefore: msTime(spec.NotBeforeMs), DependsOn: spec.DependsOn, MaxClaims: spec.MaxClaims,
		},
		Status:    ts.status(n.cfg.Clock.Now().UnixMilli(), n.depsDone),
		CreatedAt: msTime(spec.CreatedAt.WallMs),
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
	if ev, ok := t.Terminal(); ok {
		v.Result = ev.Result
		for _, e := range ev.Errors {
			v.Errors = append(v.Errors, &nornv1.TaskError{Code: e.Code, Description: e.Description, Args: e.Args})
		}
		if updated.Less(ev.At) {
			updated = ev.At
		}
		if ev.Kind == crdt.Completed {
			v.Progress = 1
		}
	}
	if ts.claims != nil {
		if ts.claims.Dead && len(v.Errors) == 0 {
			v.Errors = append(v.Errors, maxClaimsError(ts.claims.MaxClaims))
		}
		ev, terminal := t.Terminal()
		for i := range ts.claims.History {
			c := &ts.claims.History[i]
			if c.End == claims.EndNone && terminal {
				// The terminal event decided; the claim FSM has not
				// recorded the end yet (it is proposed in the background).
				ended := *c
				ended.End, ended.EndedMs = endReason(ev.Kind), ev.At.WallMs
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

func maxClaimsError(limit uint32) *nornv1.TaskError {
	return &nornv1.TaskError{Code: "max_claims_exceeded",
		Description: "the task's claims expired max_claims times", Args: []string{itoa(uint64(limit))}}
}

func dependencyFailedError(dep uint64) *nornv1.TaskError {
	return &nornv1.TaskError{Code: "dependency_failed",
		Description: "a task this one depends on was aborted or cancelled", Args: []string{itoa(dep)}}
}

// loadClaimed loads task id for a call made under claim claimID (Renew,
// Yield, Update, Complete, Abort), where a refusal must rest on the
// partition's authoritative claim state, not on a replica that is behind.
// The local replica is believed when it shows claimID live or the task
// terminal. Otherwise, on the partition's leader, it waits until the claim
// FSM has applied every committed entry (a new leader may not have applied
// its predecessor's yet) and, when the task's state has not reached this
// replica (a write with W < N skipped it, or a power loss took it), reads
// it from a majority of replicas. A replica that is not the leader (the
// call could not reach one) cannot refute the claim: UNAVAILABLE, which
// the caller may retry.
func (n *Node) loadClaimed(ctx context.Context, id, claimID uint64) (*taskState, error) {
	ts, err := n.load(id)
	if err == nil && claimDecided(ts, claimID) {
		return ts, nil
	}
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		return nil, err
	}
	p := n.host.Partition(id)
	g := n.host.Group(p)
	if g == nil {
		return ts, err
	}
	if !g.IsLeader() {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"claim %d of task %d cannot be checked: partition %d has no reachable leader", claimID, id, p))
	}
	if err := g.Barrier(replicas.ProposeTimeout); err != nil {
		return nil, apierr.From(err)
	}
	ts, err = n.load(id)
	if errors.Is(err, storage.ErrNotFound) {
		// The read merges a majority's states with this leader's record
		// and repairs this replica in the background.
		return n.read(ctx, id, 0)
	}
	return ts, err
}

// claimDecided reports whether ts settles a call under claimID without
// looking further: the claim is live, or the task is terminal.
func claimDecided(ts *taskState, claimID uint64) bool {
	if _, terminal := ts.task.Terminal(); terminal {
		return true
	}
	if ts.claims != nil {
		if c, ok := ts.claims.Live(); ok && c.Token == claimID {
			return true
		}
	}
	return false
}
