package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/transport"
)

// The placement calls of AdminService (Join, Rebalance, Drain,
// Decommission, Remove) change the ring, which only the meta group's
// leader proposes: any node accepts them and passes them on to the
// leader (one hop, marked with transport.HeaderHops).

// toMetaLeader runs local on this node when it leads the meta group, or
// forwards the call (with call, to another node's AdminService) to the
// leader: the one this node knows of, else each ring node in turn until
// one leads.
func toMetaLeader[Req, Resp any](ctx context.Context, n *Node, req *connect.Request[Req],
	call func(*transport.Peer) func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
	local func(*Req) (*Resp, error)) (*connect.Response[Resp], error) {
	r := n.host.Ring()
	if r == nil {
		return nil, apierr.NotFormed
	}
	if n.host.Meta().IsLeader() {
		resp, err := local(req.Msg)
		if err != nil {
			return nil, placementError(err)
		}
		return connect.NewResponse(resp), nil
	}
	if transport.Hops(req) > 0 {
		return nil, connect.NewError(connect.CodeUnavailable,
			fmt.Errorf("node %s does not lead the meta group (leader: %q)", n.cfg.NodeID, n.host.Meta().Leader()))
	}
	var order []string
	if l := n.host.Meta().Leader(); l != "" {
		order = append(order, l)
	}
	for _, nd := range r.Nodes {
		if nd.ID != n.cfg.NodeID && !slices.Contains(order, nd.ID) {
			order = append(order, nd.ID)
		}
	}
	var lastErr error
	for _, id := range order {
		nd, ok := r.Node(id)
		if !ok || !n.host.Up(id) {
			continue
		}
		fwd := connect.NewRequest(req.Msg)
		fwd.Header().Set(transport.HeaderHops, "1")
		resp, err := call(n.peers.Get(nd.APIAddr))(ctx, fwd)
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

func (a adminService) Join(ctx context.Context, req *connect.Request[nornv1.JoinRequest]) (*connect.Response[nornv1.JoinResponse], error) {
	if req.Msg.GetNode() == "" {
		return nil, apierr.Invalid("node", "is required: a node id or API address")
	}
	return toMetaLeader(ctx, a.n, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.JoinRequest]) (*connect.Response[nornv1.JoinResponse], error) {
		return p.Admin.Join
	}, a.n.join)
}

func (a adminService) Rebalance(ctx context.Context, req *connect.Request[nornv1.RebalanceRequest]) (*connect.Response[nornv1.RebalanceResponse], error) {
	if req.Msg.GetCancel() && req.Msg.GetApply() {
		return nil, apierr.Invalid("cancel", "cannot be combined with apply: cancel the moves under way, or apply a new plan")
	}
	return toMetaLeader(ctx, a.n, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.RebalanceRequest]) (*connect.Response[nornv1.RebalanceResponse], error) {
		return p.Admin.Rebalance
	}, func(m *nornv1.RebalanceRequest) (*nornv1.RebalanceResponse, error) {
		if m.GetCancel() {
			plan, err := a.n.cancelMoves()
			return &nornv1.RebalanceResponse{Plan: plan}, err
		}
		plan, err := a.n.plan("", "", m.GetApply())
		return &nornv1.RebalanceResponse{Plan: plan}, err
	})
}

func (a adminService) Drain(ctx context.Context, req *connect.Request[nornv1.DrainRequest]) (*connect.Response[nornv1.DrainResponse], error) {
	if req.Msg.GetNode() == "" {
		return nil, apierr.Invalid("node", "is required: a node id or API address")
	}
	return toMetaLeader(ctx, a.n, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.DrainRequest]) (*connect.Response[nornv1.DrainResponse], error) {
		return p.Admin.Drain
	}, func(m *nornv1.DrainRequest) (*nornv1.DrainResponse, error) {
		plan, err := a.n.plan(m.GetNode(), cluster.RoleDraining, m.GetApply())
		return &nornv1.DrainResponse{Plan: plan}, err
	})
}

func (a adminService) Decommission(ctx context.Context, req *connect.Request[nornv1.DecommissionRequest]) (*connect.Response[nornv1.DecommissionResponse], error) {
	if req.Msg.GetNode() == "" {
		return nil, apierr.Invalid("node", "is required: a node id or API address")
	}
	return toMetaLeader(ctx, a.n, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.DecommissionRequest]) (*connect.Response[nornv1.DecommissionResponse], error) {
		return p.Admin.Decommission
	}, func(m *nornv1.DecommissionRequest) (*nornv1.DecommissionResponse, error) {
		plan, err := a.n.plan(m.GetNode(), cluster.RoleLeaving, m.GetApply())
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
	return toMetaLeader(ctx, a.n, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.RemoveRequest]) (*connect.Response[nornv1.RemoveResponse], error) {
		return p.Admin.Remove
	}, func(m *nornv1.RemoveRequest) (*nornv1.RemoveResponse, error) {
		plan, err := a.n.plan(m.GetNode(), cluster.RoleDead, m.GetApply())
		return &nornv1.RemoveResponse{Plan: plan}, err
	})
}

// resolveNode finds the ring node a request names by id or API address.
func resolveNode(r *cluster.Ring, name string) (cluster.RingNode, bool) {
	for _, nd := range r.Nodes {
		if nd.ID == name || nd.APIAddr == name {
			return nd, true
		}
	}
	return cluster.RingNode{}, false
}

// join makes the gossip member named by req a member of the ring (or a
// draining node a member again) and, while the meta group has fewer
// voters than the cluster's size calls for, a voter.
func (n *Node) join(req *nornv1.JoinRequest) (*nornv1.JoinResponse, error) {
	name := req.GetNode()
	var joined cluster.RingNode
	next, err := n.editRing(func(r *cluster.Ring) (bool, error) {
		if nd, ok := resolveNode(r, name); ok {
			joined = nd
			if nd.Role == cluster.RoleMember {
				return false, nil
			}
			if nd.Role != cluster.RoleDraining {
				return false, connect.NewError(connect.CodeFailedPrecondition,
					fmt.Errorf("node %s is %s; it cannot join again until it has left", nd.ID, nd.Role))
			}
			i := slices.IndexFunc(r.Nodes, func(x cluster.RingNode) bool { return x.ID == nd.ID })
			r.Nodes[i].Role = cluster.RoleMember
			return true, nil
		}
		var found *cluster.Member
		for _, m := range n.host.Members().Members() {
			if m.ID == name || m.APIAddr == name {
				found = &m
				break
			}
		}
		switch {
		case found == nil:
			return false, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
				"%w: no node %q gossips with the cluster; start it with -join <gossip address of a member>", cluster.ErrUnknownNode, name))
		case !found.State.Up():
			return false, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node %s is %s", found.ID, found.State))
		case found.ClusterID != "" && found.ClusterID != r.ClusterID:
			return false, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node %s belongs to cluster %s", found.ID, found.ClusterID))
		case found.APIAddr == "" || found.RaftAddr == "":
			return false, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node %s gossips no API or Raft address", found.ID))
		}
		joined = cluster.RingNode{ID: found.ID, APIAddr: found.APIAddr, RaftAddr: found.RaftAddr, GossipAddr: found.GossipAddr}
		i, _ := slices.BinarySearchFunc(r.Nodes, joined.ID, func(x cluster.RingNode, id string) int {
			return strings.Compare(x.ID, id)
		})
		r.Nodes = slices.Insert(r.Nodes, i, joined)
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if err := n.fitMetaGroup(); err != nil {
		return nil, err
	}
	voters, err := n.host.Meta().Voters()
	if err != nil {
		return nil, err
	}
	n.cfg.Logger.Info("node joined the cluster", "node", joined.ID, "epoch", next.Epoch)
	return &nornv1.JoinResponse{NodeId: joined.ID, RingEpoch: next.Epoch, MetaVoter: slices.Contains(voters, joined.ID)}, nil
}

// plan computes the placement over the ring's members after giving the
// node named by name the role (none for a plain rebalance) and, with
// apply, records the role and queues the moves.
func (n *Node) plan(name, role string, apply bool) (*nornv1.Plan, error) {
	var out *nornv1.Plan
	next, err := n.editRing(func(r *cluster.Ring) (bool, error) {
		before := r.Loads(r.Placement)
		roleChanged := false
		if name != "" {
			nd, ok := resolveNode(r, name)
			if !ok {
				return false, fmt.Errorf("%w: %q is not a node of the cluster", cluster.ErrUnknownNode, name)
			}
			if role == cluster.RoleDead && n.host.Up(nd.ID) {
				return false, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
					"node %s is alive as gossip sees it; remove --dead is for a node gone for good (decommission a live one)", nd.ID))
			}
			i := slices.IndexFunc(r.Nodes, func(x cluster.RingNode) bool { return x.ID == nd.ID })
			if r.Nodes[i].Role != role {
				r.Nodes[i].Role, roleChanged = role, true
			}
		}
		moves, target, err := r.PlanMoves()
		if err != nil {
			return false, err
		}
		after := r.Loads(target)
		out = &nornv1.Plan{Applied: apply}
		for _, m := range moves {
			out.Moves = append(out.Moves, moveStatus(m))
		}
		out.Loads = nodeLoads(r, before, after)
		if !apply || (len(moves) == 0 && !roleChanged) {
			return false, nil
		}
		r.Moves = moves
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	out.RingEpoch = next.Epoch
	if apply {
		n.kickDriver()
		n.cfg.Logger.Info("rebalance planned", "moves", len(out.Moves), "epoch", next.Epoch, "node", name, "role", role)
	}
	return out, nil
}

// nodeLoads is each node of ring r with its role and its replica counts
// before and after a plan, in the ring's (id) order.
func nodeLoads(r *cluster.Ring, before, after map[string]int) []*nornv1.NodeLoad {
	out := make([]*nornv1.NodeLoad, 0, len(r.Nodes))
	for _, nd := range r.Nodes {
		out = append(out, &nornv1.NodeLoad{NodeId: nd.ID, Before: uint32(before[nd.ID]),
			After: uint32(after[nd.ID]), Role: cluster.RoleName(nd.Role)})
	}
	return out
}

func moveStatus(m cluster.Move) *nornv1.MoveStatus {
	msg := m.Error
	if m.State == cluster.MoveRollingBack {
		msg = "rolling back: " + m.Rollback
		if m.Error != "" {
			msg += "; " + m.Error
		}
	}
	return &nornv1.MoveStatus{Partition: uint32(m.Partition), FromNode: m.From, ToNode: m.To,
		State: string(m.State), Error: msg, Epoch: m.Epoch}
}
