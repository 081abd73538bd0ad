package server

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/dispatch"
)

// The seeded bugs of the fence (node.TestBugs), test-only: each puts
// back a path from before it, for the Jepsen harness to show that its
// checkers catch what the fence prevents.

// actLocally is the seeded bug ActLocal: the acts this node could not
// have its groups decide (it leads none of their partitions) are decided
// from its own copy of the claim state and written as CRDT deltas at w,
// as before the fence: a replica cut off from its leader takes a
// superseded worker's complete.
func (sv *Server) actLocally(ctx context.Context, acts []dispatch.Act, results []dispatch.ActResult, w uint32) {
	for k, a := range acts {
		if connect.CodeOf(results[k].Err) != connect.CodeUnavailable {
			continue
		}
		ts, err := sv.coord.Load(a.ID)
		if err != nil || ts.Claims == nil {
			continue
		}
		if c, live := ts.Claims.Live(); !live || c.Token != a.ClaimID || a.State == nil {
			continue
		}
		if _, err := sv.coord.Write(ctx, []*crdt.Task{a.State}, w, []uint64{a.ID}); err == nil {
			results[k] = dispatch.ActResult{}
		}
	}
}

// endAfterWriteDelay is how long the seeded bug EndAfterWrite waits
// before it ends a finished task's claim: the ender's linger before the
// fence.
const endAfterWriteDelay = time.Second

// actAfterWrite is the seeded bug EndAfterWrite: a complete or abort is
// decided by the partition's leader from its own copy of the claim state
// (decide then writes it at w, as a CRDT), and the claim's end follows a
// second later as an entry of its own, dropped if the node no longer
// leads the partition by then, as before the fence. A leader that takes
// over in that second and missed the write (w < N) sees the claim live
// and the task not terminal: it expires the claim and hands the task out
// again. Yields and updates go to the group as usual.
func (sv *Server) actAfterWrite(acts []dispatch.Act) []dispatch.ActResult {
	out := make([]dispatch.ActResult, len(acts))
	var rest []int // acts the group decides
	for i, a := range acts {
		if a.End != claims.EndCompleted && a.End != claims.EndAborted || a.State == nil || len(a.State.Terminals) == 0 {
			rest = append(rest, i)
			continue
		}
		p := sv.host.Partition(a.ID)
		if g := sv.host.Group(p); g == nil || !g.IsLeader() {
			out[i].Err = connect.NewError(connect.CodeUnavailable, fmt.Errorf("partition %d has no reachable leader here (retry)", p))
			continue
		}
		ts, err := sv.coord.Load(a.ID)
		if err != nil || ts.Claims == nil {
			out[i].Err = connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("claimId: %d is not a claim of task %d", a.ClaimID, a.ID))
			continue
		}
		if c, live := ts.Claims.Live(); !live || c.Token != a.ClaimID {
			out[i].Err = connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("claimId: %d is not the live claim of task %d", a.ClaimID, a.ID))
			continue
		}
		ev := a.State.Terminals[0]
		time.AfterFunc(endAfterWriteDelay, func() { sv.dispatch.EndNow(a.ID, ev) })
	}
	if len(rest) > 0 {
		sub := make([]dispatch.Act, len(rest))
		for k, i := range rest {
			sub[k] = acts[i]
		}
		for k, r := range sv.dispatch.Acts(sub) {
			out[rest[k]] = r
		}
	}
	return out
}
