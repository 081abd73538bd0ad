package node

import (
	"context"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// adminService implements norn.v1.AdminService.
type adminService struct{ n *Node }

var _ nornv1connect.AdminServiceHandler = adminService{}

func (a adminService) Status(context.Context, *connect.Request[nornv1.StatusRequest]) (*connect.Response[nornv1.StatusResponse], error) {
	n := a.n
	resp := &nornv1.StatusResponse{
		NodeId:  n.cfg.NodeID,
		Version: n.cfg.Version,
		Uptime:  durationpb.New(n.cfg.Clock.Now().Sub(n.start)),
		Nodes:   []*nornv1.NodeStatus{{Id: n.cfg.NodeID, State: "alive", ClockOffset: durationpb.New(0)}},
	}
	for p, g := range n.groups {
		stats := g.Stats()
		term, _ := strconv.ParseUint(stats["term"], 10, 64)
		applied, _ := strconv.ParseUint(stats["applied_index"], 10, 64)
		ps := &nornv1.PartitionStatus{Id: uint32(p), Cohort: []string{n.cfg.NodeID},
			RaftTerm: term, RaftIndex: applied, RaftState: stats["state"]}
		if g.IsLeader() {
			ps.Leader = n.cfg.NodeID
		}
		counts, err := n.countPartition(uint16(p), "")
		if err != nil {
			return nil, apiError(err)
		}
		ps.Counts = counts
		resp.Partitions = append(resp.Partitions, ps)
	}
	return connect.NewResponse(resp), nil
}
