package node

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// adminService implements norn.v1.AdminService.
type adminService struct{ n *Node }

var _ nornv1connect.AdminServiceHandler = adminService{}

func (a adminService) Status(_ context.Context, req *connect.Request[nornv1.StatusRequest]) (*connect.Response[nornv1.StatusResponse], error) {
	n := a.n
	resp := &nornv1.StatusResponse{
		NodeId:  n.cfg.NodeID,
		Version: n.cfg.Version,
		Uptime:  durationpb.New(n.cfg.Clock.Now().Sub(n.start)),
		Nodes:   n.nodeStatuses(),
	}
	r := n.ring.Load()
	if r == nil {
		return connect.NewResponse(resp), nil
	}
	resp.RingEpoch = r.Epoch
	for p, g := range n.groupList() {
		if g == nil {
			continue
		}
		stats := g.Stats()
		term, _ := strconv.ParseUint(stats["term"], 10, 64)
		applied, _ := strconv.ParseUint(stats["applied_index"], 10, 64)
		ps := &nornv1.PartitionStatus{Id: uint32(p), Leader: string(g.Leader()),
			RaftTerm: term, RaftIndex: applied, RaftState: stats["state"]}
		for _, id := range r.Cohort(p) {
			ps.Cohort = append(ps.Cohort, string(id))
		}
		if !req.Msg.GetSkipCounts() {
			counts, err := n.countPartition(uint16(p), "")
			if err != nil {
				return nil, apiError(err)
			}
			ps.Counts = counts
		}
		resp.Partitions = append(resp.Partitions, ps)
	}
	return connect.NewResponse(resp), nil
}

// nodeStatuses lists the ring's nodes and any other gossip member, with
// their liveness and clock offset as this node sees them.
func (n *Node) nodeStatuses() []*nornv1.NodeStatus {
	byID := map[string]*nornv1.NodeStatus{}
	if r := n.ring.Load(); r != nil {
		for _, nd := range r.Nodes {
			byID[nd.ID] = &nornv1.NodeStatus{Id: nd.ID, ApiAddress: nd.APIAddr, State: "dead"}
		}
	}
	for _, m := range n.members.Members() {
		st, ok := byID[m.ID]
		if !ok {
			st = &nornv1.NodeStatus{Id: m.ID, ApiAddress: m.APIAddr}
			byID[m.ID] = st
		}
		st.State = m.State.String()
		if m.OffsetKnown && m.State.Up() {
			st.ClockOffset = durationpb.New(m.ClockOffset)
		}
		if m.APIAddr != "" {
			st.ApiAddress = m.APIAddr
		}
	}
	self, ok := byID[n.cfg.NodeID]
	if !ok {
		self = &nornv1.NodeStatus{Id: n.cfg.NodeID}
		byID[n.cfg.NodeID] = self
	}
	self.State, self.ApiAddress, self.ClockOffset = "alive", n.cfg.APIAddr, durationpb.New(0)
	out := make([]*nornv1.NodeStatus, 0, len(byID))
	for _, st := range byID {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b *nornv1.NodeStatus) int { return strings.Compare(a.Id, b.Id) })
	return out
}
