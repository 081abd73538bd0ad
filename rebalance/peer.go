package rebalance

import (
	"fmt"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/replicas"
)

// The peer side of a move: the PeerService calls the meta leader's
// driver makes of a partition's leader (ChangeGroup) and of a move's
// target (ReplicaProgress). The node's handlers check the caller and the
// partition, then call these.

// Fills is this node's anti-entropy as a move's target reports it
// (ReplicaProgress): a move's target is filled once it has exchanged the
// partition with every source in a round that started after the move's
// ring reached every replica.
type Fills interface {
	// Round is the number of the last anti-entropy round this node
	// started (rounds are numbered from 1 up).
	Rounds() uint64
	// FilledFrom reports whether partition p was exchanged with every one
	// of sources in a round numbered above after.
	FilledFrom(p uint16, sources []string, after uint64) bool
	// Fill starts exchanging partition p with each of sources in a round
	// of its own, unless such a fill runs; it never blocks.
	Fill(p uint16, sources []string)
}

// ChangeGroup changes partition p's Raft configuration on p's leader: g
// is this node's replica of p, op one of add-nonvoter, add-voter (with
// the server's raftAddr), remove and transfer-from, about node id. It
// answers with the group's configuration after the change.
func (d *Driver) ChangeGroup(g *claims.Group, p uint16, op, id, raftAddr string) (*nornv1.ChangeGroupResponse, error) {
	if !g.IsLeader() {
		return nil, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("not the leader of partition %d (leader: %q)", p, g.Leader()))
	}
	var err error
	switch op {
	case "add-nonvoter", "add-voter":
		if raftAddr == "" {
			return nil, apierr.Invalid("raft_address", "is required to add a server")
		}
		if op == "add-nonvoter" {
			err = g.AddNonvoter(id, raftAddr, replicas.ProposeTimeout)
		} else {
			err = g.AddVoter(id, raftAddr, replicas.ProposeTimeout)
		}
	case "remove":
		if id == d.cfg.NodeID {
			return nil, connect.NewError(connect.CodeFailedPrecondition,
				fmt.Errorf("the leader of partition %d does not remove itself; transfer the leadership first", p))
		}
		err = g.RemoveServer(id, replicas.ProposeTimeout)
	case "transfer-from":
		if id == d.cfg.NodeID {
			err = g.TransferLeadership()
		}
	default:
		return nil, apierr.Invalid("op", "unknown operation %q", op)
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("partition %d %s %s: %w", p, op, id, err))
	}
	servers, err := g.Servers()
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	resp := &nornv1.ChangeGroupResponse{LastIndex: g.LastIndex(), Leader: string(g.Leader())}
	for _, sv := range servers {
		resp.Servers = append(resp.Servers, &nornv1.GroupServer{Id: sv.ID, Address: sv.Address, Voter: sv.Voter})
	}
	return resp, nil
}

// ReplicaProgress reports this node's replica of partition p as of ring
// r: whether it is open, how far it has applied p's log and, when
// fillFrom names the move's sources, whether it has been filled from
// them in a round after round after (starting a fill when not).
func (d *Driver) ReplicaProgress(r *cluster.Ring, p uint16, fillFrom []string, after uint64) *nornv1.ReplicaProgressResponse {
	resp := &nornv1.ReplicaProgressResponse{RingEpoch: r.Epoch, Round: d.cfg.Fills.Rounds()}
	if g := d.host.Group(p); g != nil {
		resp.Open = true
		resp.AppliedIndex = g.AppliedIndex()
		if len(fillFrom) > 0 {
			resp.Filled = d.cfg.Fills.FilledFrom(p, fillFrom, after)
			if !resp.Filled {
				d.cfg.Fills.Fill(p, fillFrom)
			}
		}
	}
	return resp
}
