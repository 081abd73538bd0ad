package server

import (
	"context"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/rebalance"
	"github.com/norn-dev/norn/transport"
)

// The placement calls of AdminService (Join, Rebalance, Drain,
// Decommission, Remove): any node accepts them and
// rebalance.ToMetaLeader runs them on the meta group's leader, the one
// node that proposes rings.

func (a adminService) Join(ctx context.Context, req *connect.Request[nornv1.JoinRequest]) (*connect.Response[nornv1.JoinResponse], error) {
	if req.Msg.GetNode() == "" {
		return nil, apierr.Invalid("node", "is required: a node id or API address")
	}
	return rebalance.ToMetaLeader(a.sv.rebalance, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.JoinRequest]) (*connect.Response[nornv1.JoinResponse], error) {
		return p.Admin.Join
	}, func(m *nornv1.JoinRequest) (*nornv1.JoinResponse, error) {
		return a.sv.rebalance.Join(m.GetNode())
	})
}

func (a adminService) Rebalance(ctx context.Context, req *connect.Request[nornv1.RebalanceRequest]) (*connect.Response[nornv1.RebalanceResponse], error) {
	if req.Msg.GetCancel() && req.Msg.GetApply() {
		return nil, apierr.Invalid("cancel", "cannot be combined with apply: cancel the moves under way, or apply a new plan")
	}
	return rebalance.ToMetaLeader(a.sv.rebalance, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.RebalanceRequest]) (*connect.Response[nornv1.RebalanceResponse], error) {
		return p.Admin.Rebalance
	}, func(m *nornv1.RebalanceRequest) (*nornv1.RebalanceResponse, error) {
		if m.GetCancel() {
			plan, err := a.sv.rebalance.Cancel()
			return &nornv1.RebalanceResponse{Plan: plan}, err
		}
		plan, err := a.sv.rebalance.Plan("", "", m.GetApply())
		return &nornv1.RebalanceResponse{Plan: plan}, err
	})
}

func (a adminService) Drain(ctx context.Context, req *connect.Request[nornv1.DrainRequest]) (*connect.Response[nornv1.DrainResponse], error) {
	if req.Msg.GetNode() == "" {
		return nil, apierr.Invalid("node", "is required: a node id or API address")
	}
	return rebalance.ToMetaLeader(a.sv.rebalance, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.DrainRequest]) (*connect.Response[nornv1.DrainResponse], error) {
		return p.Admin.Drain
	}, func(m *nornv1.DrainRequest) (*nornv1.DrainResponse, error) {
		plan, err := a.sv.rebalance.Plan(m.GetNode(), cluster.RoleDraining, m.GetApply())
		return &nornv1.DrainResponse{Plan: plan}, err
	})
}

func (a adminService) Decommission(ctx context.Context, req *connect.Request[nornv1.DecommissionRequest]) (*connect.Response[nornv1.DecommissionResponse], error) {
	if req.Msg.GetNode() == "" {
		return nil, apierr.Invalid("node", "is required: a node id or API address")
	}
	return rebalance.ToMetaLeader(a.sv.rebalance, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.DecommissionRequest]) (*connect.Response[nornv1.DecommissionResponse], error) {
		return p.Admin.Decommission
	}, func(m *nornv1.DecommissionRequest) (*nornv1.DecommissionResponse, error) {
		plan, err := a.sv.rebalance.Plan(m.GetNode(), cluster.RoleLeaving, m.GetApply())
		return &nornv1.DecommissionResponse{Plan: plan}, err
	})
}

func (a adminService) Remove(ctx context.Context, req *connect.Request[nornv1.RemoveRequest]) (*connect.Response[nornv1.RemoveResponse], error) {
	if req.Msg.GetNode() == "" {
		return nil, apierr.Invalid("node", "is required: a node id or API address")
	}
	if !req.Msg.GetDead() {
		return nil, apierr.Invalid("dead", "must be true: remove is for a node gone for good; decommission a live node")
	}
	return rebalance.ToMetaLeader(a.sv.rebalance, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.RemoveRequest]) (*connect.Response[nornv1.RemoveResponse], error) {
		return p.Admin.Remove
	}, func(m *nornv1.RemoveRequest) (*nornv1.RemoveResponse, error) {
		plan, err := a.sv.rebalance.Plan(m.GetNode(), cluster.RoleDead, m.GetApply())
		return &nornv1.RemoveResponse{Plan: plan}, err
	})
}
