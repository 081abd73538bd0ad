package dispatch

import (
	"fmt"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/replicas"
)

// Unique has partition p's Raft group decide ops (claims.OpUnique, one
// entry) and returns an outcome per op, in order: Err nil when the op
// took effect, claims.ErrUniqueHeld when another task holds the key
// (Outcome.Unique names it). This node must lead p: elsewhere the answer
// is UNAVAILABLE, as for a claim's act.
func (d *Dispatcher) Unique(p uint16, ops []claims.UniqueOp) ([]claims.Outcome, error) {
	g := d.host.Group(p)
	if g == nil || !g.IsLeader() {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"partition %d has no reachable leader here: a unique key is decided by it (retry)", p))
	}
	cmd := &claims.Command{Op: claims.OpUnique, NowMs: d.cfg.Clock.Now().UnixMilli(), Uniques: ops}
	outs, err := g.Propose(cmd, replicas.ProposeTimeout)
	if err != nil {
		return nil, apierr.From(err)
	}
	if len(outs) != len(ops) {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("%d outcomes for %d unique key ops", len(outs), len(ops)))
	}
	for _, o := range outs {
		if o.Err != nil && o.Err != claims.ErrUniqueHeld {
			return nil, apierr.From(o.Err)
		}
	}
	return outs, nil
}
