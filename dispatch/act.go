package dispatch

import (
	"errors"
	"fmt"
	"sync"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/replicas"
)

// Act is one thing a worker does under its claim: complete, abort, yield
// or update a task.
type Act struct {
	ID      uint64
	ClaimID uint64
	// End is how it ends the claim: claims.EndCompleted or EndAborted
	// (the task becomes terminal), EndFailed (a retryable abort),
	// EndYielded, or EndNone (an update).
	End claims.EndReason
	// State is the task's delta it writes (the terminal event, a progress
	// update), merged into the task on every replica when the act takes
	// effect; nil for none.
	State *crdt.Task
	// Retry (EndFailed) is the retry policy the attempt fails under if
	// the task's claim record has none yet (claims.Act.Retry).
	Retry *crdt.RetryPolicy
}

// ActResult is what became of one Act.
type ActResult struct {
	// Err is nil when the act took effect (or had, Repeated), else an
	// API error: FAILED_PRECONDITION when the claim is not the task's
	// live claim or the task is terminal, UNAVAILABLE when this node
	// cannot have the partition's group decide (it does not lead it).
	Err error
	// Repeated: the same act took effect before (a retry whose first
	// answer was lost); nothing was merged again.
	Repeated bool
	// Died (EndFailed): the act failed the task's last allowed attempt;
	// the DEAD event the group merged into the task's replicas.
	Died *crdt.Task
}

// Acts has each act decided by its partition's Raft group, fenced by its
// claim (claims.OpAct): one entry per partition, the partitions
// concurrently, and returns a result per act, in order. The act takes
// effect only if its claim is the task's live claim when the entry is
// applied; then the claim's end and the task's new state are one
// decision, applied on every replica. This node must lead the acts'
// partitions: the API forwards to the leader first, and a node that cannot
// reach one refuses (UNAVAILABLE) rather than judge from its own copy.
func (d *Dispatcher) Acts(acts []Act) []ActResult {
	out := make([]ActResult, len(acts))
	byPart := map[uint16][]int{}
	var parts []uint16
	for i, a := range acts {
		p := d.host.Partition(a.ID)
		if _, ok := byPart[p]; !ok {
			parts = append(parts, p)
		}
		byPart[p] = append(byPart[p], i)
	}
	var wg sync.WaitGroup
	for _, p := range parts {
		idx := byPart[p]
		wg.Go(func() { d.actOn(p, acts, idx, out) })
	}
	wg.Wait()
	return out
}

// actOn proposes the acts idx of partition p in one entry and fills their
// results.
func (d *Dispatcher) actOn(p uint16, acts []Act, idx []int, out []ActResult) {
	failAll := func(err error) {
		for _, i := range idx {
			out[i].Err = err
		}
	}
	g := d.host.Group(p)
	if g == nil || !g.IsLeader() {
		failAll(connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"partition %d has no reachable leader here: a claim's complete, abort, yield or update must be decided by it (retry)", p)))
		return
	}
	cmd := &claims.Command{Op: claims.OpAct, NowMs: d.cfg.Clock.Now().UnixMilli(), Acts: make([]claims.Act, len(idx))}
	for k, i := range idx {
		a := acts[i]
		cmd.Acts[k] = claims.Act{ID: a.ID, Token: a.ClaimID, End: a.End, Retry: a.Retry}
		if a.State != nil {
			cmd.Acts[k].State = a.State.Encode()
		}
	}
	outs, err := g.Propose(cmd, replicas.ProposeTimeout)
	if err != nil {
		failAll(apierr.From(err))
		return
	}
	// An entry names each act's task once per act, in order: match them
	// by position among the outcomes of the same task.
	next := map[uint64]int{}
	for _, i := range idx {
		id := acts[i].ID
		o, ok := nthOutcome(outs, id, next[id])
		next[id]++
		switch {
		case !ok:
			out[i].Err = connect.NewError(connect.CodeInternal, fmt.Errorf("no outcome for task %d", id))
		case o.Err != nil:
			out[i].Err = actError(id, acts[i].ClaimID, o.Err)
		default:
			out[i].Repeated, out[i].Died = o.Repeated, o.Died
		}
	}
}

// nthOutcome returns the n-th (from 0) outcome of task id.
func nthOutcome(outs []claims.Outcome, id uint64, n int) (claims.Outcome, bool) {
	for _, o := range outs {
		if o.ID != id {
			continue
		}
		if n == 0 {
			return o, true
		}
		n--
	}
	return claims.Outcome{}, false
}

// actError is the API error of an act the FSM refused.
func actError(id, claimID uint64, err error) error {
	switch {
	case errors.Is(err, claims.ErrClaimSuperseded):
		return connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("claimId: %d is not the live claim of task %d (%w)", claimID, id, err))
	case errors.Is(err, claims.ErrTaskTerminal):
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d is terminal: %w", id, err))
	case errors.Is(err, claims.ErrPastDeadline):
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d passed its deadline (it is being cancelled): %w", id, err))
	}
	return apierr.From(err)
}

// Revive begins life of task id (a Retry of it, claims.OpRevive) through
// its partition's group, which this node must lead (UNAVAILABLE
// otherwise), and returns the revival state the group merged into the
// task's replicas, for the caller's quorum write; repeated when the task
// had reached life already (a retried Retry: nothing changed, and the
// state is nil). A task that is not terminal, or was completed, is
// FAILED_PRECONDITION.
func (d *Dispatcher) Revive(id uint64, life uint32) (state *crdt.Task, repeated bool, err error) {
	p := d.host.Partition(id)
	g := d.host.Group(p)
	if g == nil || !g.IsLeader() {
		return nil, false, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"partition %d has no reachable leader here: a Retry must be decided by it (retry)", p))
	}
	now := d.cfg.Clock.Now().UnixMilli()
	outs, err := g.Propose(&claims.Command{Op: claims.OpRevive, NowMs: now, ID: id, Life: life}, replicas.ProposeTimeout)
	if err != nil {
		return nil, false, apierr.From(err)
	}
	o, ok := nthOutcome(outs, id, 0)
	switch {
	case !ok:
		return nil, false, connect.NewError(connect.CodeInternal, fmt.Errorf("no outcome for task %d", id))
	case errors.Is(o.Err, claims.ErrCompleted):
		return nil, false, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"task %d was COMPLETED: its result was accepted, so it is not retried (enqueue it again)", id))
	case errors.Is(o.Err, claims.ErrNotTerminal):
		return nil, false, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"task %d is not terminal: only a DEAD, ABORTED or CANCELLED task is retried", id))
	case o.Err != nil:
		return nil, false, apierr.From(o.Err)
	case o.Repeated:
		return nil, true, nil
	}
	return claims.RevivalEvent(id, life, now), false, nil
}
