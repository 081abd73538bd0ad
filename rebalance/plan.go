package rebalance

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cluster"
)

// The placement calls (AdminService's Join, Rebalance, Drain,
// Decommission, Remove) run on the meta group's leader (ToMetaLeader
// passes them on): they change the ring through editRing and kick the
// driver.

// resolveNode finds the ring node a request names by id or API address.
func resolveNode(r *cluster.Ring, name string) (cluster.RingNode, bool) {
	for _, nd := range r.Nodes {
		if nd.ID == name || nd.APIAddr == name {
			return nd, true
		}
	}
	return cluster.RingNode{}, false
}

// Join makes the gossip member named by name (a node id or API address)
// a member of the ring (or a draining node a member again) and, while
// the meta group has fewer voters than the cluster's size calls for, a
// voter.
func (d *Driver) Join(name string) (*nornv1.JoinResponse, error) {
	var joined cluster.RingNode
	next, err := d.editRing(func(r *cluster.Ring) (bool, error) {
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
		for _, m := range d.host.Members().Members() {
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
		// Its incarnation names the data dir it joins with: from now on
		// a node under this id with another data dir is refused.
		joined = cluster.RingNode{ID: found.ID, APIAddr: found.APIAddr, RaftAddr: found.RaftAddr, GossipAddr: found.GossipAddr,
			Incarnation: found.Incarnation}
		i, _ := slices.BinarySearchFunc(r.Nodes, joined.ID, func(x cluster.RingNode, id string) int {
			return strings.Compare(x.ID, id)
		})
		r.Nodes = slices.Insert(r.Nodes, i, joined)
		return true, nil
	})
	if err != nil {
		return nil, joinError(err)
	}
	if err := d.fitMetaGroup(); err != nil {
		return nil, joinError(err)
	}
	voters, err := d.host.Meta().Voters()
	if err != nil {
		return nil, joinError(err)
	}
	d.cfg.Logger.Info("node joined the cluster", "node", joined.ID, "epoch", next.Epoch)
	return &nornv1.JoinResponse{NodeId: joined.ID, RingEpoch: next.Epoch, MetaVoter: slices.Contains(voters, joined.ID)}, nil
}

// joinError marks a Join that failed because this node stopped leading
// the meta group (an election under load, or the voter Join added taking
// over) as a noLeaderError, so that ToMetaLeader runs it again on the new
// leader: Join is idempotent (a member joins again with no change, and
// fitMetaGroup adds whatever voters are still missing), so running it
// twice is safe, unlike the plans, whose outcome a caller must look up.
func joinError(err error) error {
	if errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrNotLeader) ||
		errors.Is(err, raft.ErrLeadershipTransferInProgress) {
		return noLeaderError(fmt.Errorf("the meta leader lost its leadership while a node joined: %w", err))
	}
	return err
}

// Plan computes the placement over the ring's members after giving the
// node named by name the role (none for a plain rebalance) and, with
// apply, records the role and queues the moves.
func (d *Driver) Plan(name, role string, apply bool) (*nornv1.Plan, error) {
	var out *nornv1.Plan
	next, err := d.editRing(func(r *cluster.Ring) (bool, error) {
		before := r.Loads(r.Placement)
		roleChanged := false
		if name != "" {
			nd, ok := resolveNode(r, name)
			if !ok {
				return false, fmt.Errorf("%w: %q is not a node of the cluster", cluster.ErrUnknownNode, name)
			}
			if role == cluster.RoleDead && d.host.Up(nd.ID) {
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
			out.Moves = append(out.Moves, MoveStatus(m))
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
		d.Kick()
		d.cfg.Logger.Info("rebalance planned", "moves", len(out.Moves), "epoch", next.Epoch, "node", name, "role", role)
	}
	return out, nil
}

// Cancel gives up every move not promoted yet (Ring.CancelMoves) and
// returns the moves as they stand after.
func (d *Driver) Cancel() (*nornv1.Plan, error) {
	var cancelled int
	next, err := d.editRing(func(r *cluster.Ring) (bool, error) {
		cancelled = r.CancelMoves("cancelled")
		return cancelled > 0, nil
	})
	if err != nil {
		return nil, err
	}
	out := &nornv1.Plan{RingEpoch: next.Epoch}
	for _, m := range next.Moves {
		out.Moves = append(out.Moves, MoveStatus(m))
	}
	loads := next.Loads(next.Placement)
	out.Loads = nodeLoads(next, loads, loads)
	if cancelled > 0 {
		d.Kick()
		d.cfg.Logger.Info("moves cancelled", "moves", cancelled, "epoch", next.Epoch)
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

// MoveStatus is move m as the API shows it (plans, Status): a move
// rolling back tells why in its error.
func MoveStatus(m cluster.Move) *nornv1.MoveStatus {
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
