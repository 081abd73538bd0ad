package rebalance

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/transport"
)

// The placement calls of AdminService (Join, Rebalance, Drain,
// Decommission, Remove) change the ring, which only the meta group's
// leader proposes: any node accepts them and passes them on to the
// leader (one hop, marked with transport.HeaderHops).

// ToMetaLeader runs local on this node when it leads the meta group, or
// forwards the call (with call, to another node's AdminService) to the
// leader: the one this node knows of, else each ring node in turn until
// one leads.
func ToMetaLeader[Req, Resp any](d *Driver, ctx context.Context, req *connect.Request[Req],
	call func(*transport.Peer) func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
	local func(*Req) (*Resp, error)) (*connect.Response[Resp], error) {
	r := d.host.Ring()
	if r == nil {
		return nil, apierr.NotFormed
	}
	if d.host.Meta().IsLeader() {
		resp, err := local(req.Msg)
		if err != nil {
			return nil, placementError(err)
		}
		return connect.NewResponse(resp), nil
	}
	if transport.Hops(req) > 0 {
		return nil, connect.NewError(connect.CodeUnavailable,
			fmt.Errorf("node %s does not lead the meta group (leader: %q)", d.cfg.NodeID, d.host.Meta().Leader()))
	}
	var order []string
	if l := d.host.Meta().Leader(); l != "" {
		order = append(order, l)
	}
	for _, nd := range r.Nodes {
		if nd.ID != d.cfg.NodeID && !slices.Contains(order, nd.ID) {
			order = append(order, nd.ID)
		}
	}
	var lastErr error
	for _, id := range order {
		nd, ok := r.Node(id)
		if !ok || !d.host.Up(id) {
			continue
		}
		fwd := connect.NewRequest(req.Msg)
		fwd.Header().Set(transport.HeaderHops, "1")
		resp, err := call(d.peers.Get(nd.APIAddr))(ctx, fwd)
		if err == nil {
			return resp, nil
		}
		lastErr = err
		if connect.CodeOf(err) != connect.CodeUnavailable {
			return nil, err
		}
	}
	if lastErr == nil {
		lastErr = errors.New("no node of the meta group is up")
	}
	return nil, connect.NewError(connect.CodeUnavailable,
		fmt.Errorf("the meta group has no reachable leader: %s", apierr.Message(lastErr)))
}

// placementError maps the meta leader's errors: a plan refused while
// moves run, or a request that names no node of the cluster, is the
// caller's; the rest is UNAVAILABLE.
func placementError(err error) error {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return err
	case errors.Is(err, cluster.ErrMovesUnderway):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, cluster.ErrUnknownNode), errors.Is(err, ring.ErrTooFewNodes):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	default:
		return connect.NewError(connect.CodeUnavailable, err)
	}
}
