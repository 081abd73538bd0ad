package dispatch

import (
	"context"
	"errors"

	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/testhooks"
)

// Deadlines (TaskSpec.deadline, docs/JOBQUEUE.md): the claim FSM grants,
// renews and takes acts on a task only before its deadline, on the
// leader's clock (claims.ErrPastDeadline), and the partition's leader
// cancels each task whose deadline passed, ready, delayed or claimed, in
// one decision of the group with the end of its claim (claims.OpDeadline):
// its monitor looks at the store's deadline index every pass.

// cancelPastDeadlines proposes the cancel of partition p's tasks whose
// deadline is at or before now (up to monitorBatch a pass), in one
// OpDeadline entry; this node leads p. The group merges each cancel into
// the task on every replica; the write then takes the cancels to a
// quorum at once, as the DEAD events of failed attempts are.
func (d *Dispatcher) cancelPastDeadlines(p uint16) {
	now := d.cfg.Clock.Now().UnixMilli()
	due, err := d.store.DeadlinesDue(p, now, monitorBatch)
	if err != nil {
		d.cfg.Logger.Warn("scanning deadlines failed", "partition", p, "err", err)
		return
	}
	cmd := &claims.Command{Op: claims.OpDeadline, NowMs: now}
	states := map[uint64]*crdt.Task{}
	for _, e := range due {
		ts, err := d.coord.Load(e.ID)
		if err != nil || ts.Task.Spec == nil {
			continue // not stored here yet: it is in no index here either
		}
		if _, terminal := ts.Task.Terminal(); terminal {
			// Cancelled by a user while claimed: it leaves the index when
			// its claim ends, as the task did.
			d.EndIfTerminal(ts)
			continue
		}
		if testhooks.Built && d.cfg.DeadlineUnfenced && ts.Claims != nil {
			if _, live := ts.Claims.Live(); live {
				continue // the seeded bug: a claimed task runs on
			}
		}
		spec := ts.Task.Spec
		e := coord.DeadlineError(spec.DeadlineMs)
		state := &crdt.Task{ID: ts.Task.ID, Terminals: []crdt.Terminal{{At: d.cfg.HLC.Now(), Kind: crdt.Cancelled, Life: ts.Life(),
			Errors: []crdt.TaskError{{Code: e.Code, Description: e.Description, Args: e.Args}}}}}
		states[ts.Task.ID] = state
		cmd.Deadlines = append(cmd.Deadlines, claims.Deadline{ID: ts.Task.ID, Life: ts.Life(), DeadlineMs: spec.DeadlineMs, State: state.Encode()})
	}
	if len(cmd.Deadlines) == 0 {
		return
	}
	outs, err := d.host.Group(p).Propose(cmd, replicas.ProposeTimeout)
	if err != nil {
		d.cfg.Logger.Warn("cancelling tasks past their deadline failed; the next pass tries again", "partition", p, "tasks", len(cmd.Deadlines), "err", err)
		return
	}
	var write []*crdt.Task
	var ids []uint64
	for _, o := range outs {
		switch {
		case o.Err == nil:
			write, ids = append(write, states[o.ID]), append(ids, o.ID)
		case !errors.Is(o.Err, claims.ErrTaskTerminal):
			d.cfg.Logger.Warn("cancelling a task past its deadline failed", "id", o.ID, "err", o.Err)
		}
	}
	if len(write) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.WriteTimeout)
	defer cancel()
	if _, err := d.coord.Write(ctx, write, 0, ids); err != nil {
		d.cfg.Logger.Warn("writing the cancels of tasks past their deadline failed; anti-entropy carries them", "tasks", len(write), "err", err)
	}
}
