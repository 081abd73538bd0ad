package node

import (
	"context"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/dispatch"
	"github.com/norn-dev/norn/transport"
)

// Claim request bounds.
const (
	maxClaimBatch = 1000
	maxWorkerLen  = 256
)

func (s taskService) Claim(ctx context.Context, req *connect.Request[nornv1.ClaimRequest]) (*connect.Response[nornv1.ClaimResponse], error) {
	n, m := s.n, req.Msg
	if err := crdt.ValidateQueue("queue", m.GetQueue()); err != nil {
		return nil, apierr.From(err)
	}
	if w := m.GetWorker(); w == "" || len(w) > maxWorkerLen {
		return nil, apierr.Invalid("worker", "must be 1-%d bytes, got %d", maxWorkerLen, len(w))
	}
	lease, err := n.leaseArg(m.GetLease())
	if err != nil {
		return nil, err
	}
	limit := int(m.GetMax())
	if limit == 0 {
		limit = 1
	}
	if limit > maxClaimBatch {
		return nil, apierr.Invalid("max", "must be at most %d, got %d", maxClaimBatch, limit)
	}
	var wait time.Duration
	if d := m.GetWait(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			return nil, apierr.Invalid("wait", "must be a non-negative duration")
		}
		wait = min(d.AsDuration(), n.cfg.MaxWait)
	}
	// Answer before the caller's deadline rather than after it.
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)-100*time.Millisecond)
	}
	got, err := n.dispatch.Claim(ctx, dispatch.ClaimRequest{Msg: m, Lease: lease, Max: limit, Wait: wait,
		Proxied: transport.Hops(req) > 0})
	return connect.NewResponse(&nornv1.ClaimResponse{Tasks: got}), err
}
