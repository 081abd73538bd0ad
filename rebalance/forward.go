package rebalance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/transport"
)

// The placement calls of AdminService (Join, Rebalance, Drain,
// Decommission, Remove) change the ring, which only the meta group's
// leader proposes: any node accepts them and passes them on to the
// leader (one hop, marked with transport.HeaderHops).

// electionWait bounds how long a placement call waits for the meta group
// to have a leader (an election in progress, a leader replaying its
// log): a few election timeouts. electionRetry is the pause between
// looks.
const (
	electionWait  = 5 * time.Second
	electionRetry = 100 * time.Millisecond
)

// ToMetaLeader runs local on this node when it leads the meta group (and
// has applied its log: cluster.Meta.LeaderReady), or forwards the call
// (with call, to another node's AdminService) to the leader: the one this
// node knows of, else each ring node in turn until one leads. When no
// leader is found (an election in progress), the node the client called
// looks again until one is, for up to electionWait and never past 100 ms
// before the caller's deadline; a forwarded call answers at once
// (UNAVAILABLE), the node that forwarded it waits.
func ToMetaLeader[Req, Resp any](d *Driver, ctx context.Context, req *connect.Request[Req],
	call func(*transport.Peer) func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
	local func(*Req) (*Resp, error)) (*connect.Response[Resp], error) {
	deadline := time.Now().Add(electionWait)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-100*time.Millisecond).Before(deadline) {
		deadline = dl.Add(-100 * time.Millisecond)
	}
	for {
		resp, err := toMetaLeaderOnce(d, ctx, req, call, local)
		// Only a look that found no leader is tried again: a call a
		// leader ran (and failed) is not run twice.
		if !isNoLeader(err) || transport.Hops(req) > 0 || time.Now().Add(electionRetry).After(deadline) {
			return resp, err
		}
		d.cfg.Logger.Debug("placement call waits for a meta leader", "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(electionRetry):
		}
	}
}

// toMetaLeaderOnce is one look for the meta leader (see ToMetaLeader).
func toMetaLeaderOnce[Req, Resp any](d *Driver, ctx context.Context, req *connect.Request[Req],
	call func(*transport.Peer) func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
	local func(*Req) (*Resp, error)) (*connect.Response[Resp], error) {
	r := d.host.Ring()
	if r == nil {
		return nil, apierr.NotFormed
	}
	if d.host.Meta().IsLeader() {
		if err := d.host.Meta().LeaderReady(replicas.ProposeTimeout); err != nil {
			return nil, noLeaderError(fmt.Errorf("node %s leads the meta group but has not applied its log yet: %w", d.cfg.NodeID, err))
		}
		resp, err := local(req.Msg)
		if err != nil {
			return nil, placementError(err)
		}
		return connect.NewResponse(resp), nil
	}
	if transport.Hops(req) > 0 {
		return nil, noLeaderError(fmt.Errorf("node %s does not lead the meta group (leader: %q)", d.cfg.NodeID, d.host.Meta().Leader()))
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
		if connect.IsWireError(err) && !isNoLeader(err) {
			return nil, err // the leader ran the call, and it failed
		}
	}
	if lastErr == nil {
		lastErr = errors.New("no node of the meta group is up")
	}
	return nil, noLeaderError(fmt.Errorf("the meta group has no reachable leader: %s", apierr.Message(lastErr)))
}

// headerNoLeader marks (in an error's metadata) the UNAVAILABLE of a node
// that found no meta leader to run a placement call: the call did not
// run, so it may be tried again.
const headerNoLeader = "Norn-No-Meta-Leader"

// noLeaderError is UNAVAILABLE with err, marked as headerNoLeader.
func noLeaderError(err error) error {
	ce := connect.NewError(connect.CodeUnavailable, err)
	ce.Meta().Set(headerNoLeader, "1")
	return ce
}

// isNoLeader reports whether err is a noLeaderError, made here or by the
// node a call was forwarded to (a look that reached no node's server ends
// in one too: see toMetaLeaderOnce).
func isNoLeader(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable {
		return false
	}
	return ce.Meta().Get(headerNoLeader) != ""
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
