package server

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/rebalance"
	"github.com/norn-dev/norn/transport"
)

// adminService implements norn.v1.AdminService.
type adminService struct{ sv *Server }

var _ nornv1connect.AdminServiceHandler = adminService{}

func (a adminService) Status(ctx context.Context, req *connect.Request[nornv1.StatusRequest]) (*connect.Response[nornv1.StatusResponse], error) {
	sv := a.sv
	resp := &nornv1.StatusResponse{
		NodeId:  sv.cfg.NodeID,
		Version: sv.cfg.Version,
		Build:   sv.cfg.Build,
		Uptime:  durationpb.New(sv.cfg.Clock.Now().Sub(sv.start)),
		Nodes:   sv.NodeStatuses(),
		Healthy: true,
		Security: &nornv1.SecurityStatus{Tls: sv.cfg.Security.TLS, GossipEncrypted: sv.cfg.Security.GossipEncrypted,
			Insecure: sv.cfg.Security.Insecure, AccessControl: sv.cfg.Auth != nil},
	}
	if sv.cfg.Auth != nil {
		resp.Security.AccessDigest = sv.cfg.Auth.Digest()
	}
	if err := sv.clockGuard.MayLead(); err != nil {
		resp.Healthy = false
		resp.Problems = append(resp.Problems, err.Error())
	}
	if sv.cfg.OutTooLong != nil {
		if why := sv.cfg.OutTooLong(); why != "" {
			resp.Healthy = false
			resp.Problems = append(resp.Problems, why)
		}
	}
	r := sv.host.Ring()
	if r == nil {
		return connect.NewResponse(resp), nil
	}
	resp.RingEpoch = r.Epoch
	resp.PartitionCount = uint32(r.Partitions)
	if m := sv.host.Meta(); m != nil {
		resp.MetaLeader = m.Leader()
	}
	for _, m := range r.Moves {
		resp.Moves = append(resp.Moves, rebalance.MoveStatus(m))
	}
	var peerRoots map[string]peerRootsAnswer
	if !req.Msg.GetSkipCounts() {
		peerRoots = sv.peerRoots(ctx, r)
	}
	for p, g := range sv.host.Groups() {
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
			// A counter that cannot be read (a bug: one below zero) is
			// a problem of the node, not a failed Status.
			counts, err := sv.coord.CountPartition(uint16(p), "")
			if err != nil {
				resp.Healthy = false
				resp.Problems = append(resp.Problems, fmt.Sprintf("partition %d: counts: %v", p, err))
			}
			ps.Counts = counts
			ps.ReplicaRoots, ps.ReplicasAgree = sv.replicaRoots(r, uint16(p), peerRoots)
		}
		if req.Msg.GetClaimDigests() {
			var err error
			if ps.ClaimApplied, ps.ClaimDigest, err = sv.store.ClaimFSMDigest(uint16(p)); err != nil {
				return nil, apierr.From(err)
			}
		}
		resp.Partitions = append(resp.Partitions, ps)
	}
	return connect.NewResponse(resp), nil
}

// NodeStatuses lists the ring's nodes and any other gossip member, with
// their liveness and clock offset as this node sees them.
func (sv *Server) NodeStatuses() []*nornv1.NodeStatus {
	byID := map[string]*nornv1.NodeStatus{}
	if r := sv.host.Ring(); r != nil {
		for _, nd := range r.Nodes {
			byID[nd.ID] = &nornv1.NodeStatus{Id: nd.ID, ApiAddress: nd.APIAddr, State: "dead"}
		}
	}
	for _, m := range sv.host.Members().Members() {
		st, ok := byID[m.ID]
		if !ok {
			st = &nornv1.NodeStatus{Id: m.ID, ApiAddress: m.APIAddr}
			byID[m.ID] = st
		}
		st.State = m.State.String()
		if sec := m.Security; sec.Known {
			st.Security = &nornv1.SecurityStatus{Tls: sec.TLS, GossipEncrypted: sec.GossipEncrypted,
				AccessControl: sec.Access != "", AccessDigest: sec.Access}
		}
		if m.OffsetKnown && m.State.Up() {
			st.ClockOffset = durationpb.New(m.ClockOffset)
		}
		if m.APIAddr != "" {
			st.ApiAddress = m.APIAddr
		}
	}
	self, ok := byID[sv.cfg.NodeID]
	if !ok {
		self = &nornv1.NodeStatus{Id: sv.cfg.NodeID}
		byID[sv.cfg.NodeID] = self
	}
	self.State, self.ApiAddress, self.ClockOffset = "alive", sv.cfg.APIAddr, durationpb.New(0)
	// Each measured clock's offset from the median of them all (as
	// cluster.JudgeClock, with at least three).
	var known []time.Duration
	for _, st := range byID {
		if st.ClockOffset != nil {
			known = append(known, st.ClockOffset.AsDuration())
		}
	}
	if len(known) >= 3 {
		med := cluster.Median(known)
		for _, st := range byID {
			if st.ClockOffset != nil {
				st.MedianOffset = durationpb.New(st.ClockOffset.AsDuration() - med)
			}
		}
	}
	out := make([]*nornv1.NodeStatus, 0, len(byID))
	r := sv.host.Ring()
	var replicas map[string]int
	if r != nil {
		replicas = r.Loads(r.Placement) // a move under way counts at its source
	}
	leaders := sv.host.LeaderLoads()
	for _, st := range byID {
		st.Leaders, st.LeaderShare = uint32(leaders[st.Id].Leads), leaders[st.Id].Share
		st.Role = "not a member"
		if r != nil {
			if role, ok := r.Role(st.Id); ok {
				st.Role = cluster.RoleName(role)
			}
		}
		st.Replicas = uint32(replicas[st.Id])
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b *nornv1.NodeStatus) int { return strings.Compare(a.Id, b.Id) })
	return out
}

// peerRootsAnswer is one peer's TreeRoots answer for the partitions it
// shares with this node.
type peerRootsAnswer struct {
	roots map[uint16]uint64
	err   error
}

// statusRootsTimeout bounds the TreeRoots calls of one Status.
const statusRootsTimeout = 2 * time.Second

// peerRoots asks every other node sharing partitions with this one for its
// tree roots, in parallel.
func (sv *Server) peerRoots(ctx context.Context, r *cluster.Ring) map[string]peerRootsAnswer {
	ctx, cancel := context.WithTimeout(ctx, statusRootsTimeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[string]peerRootsAnswer{}
	for _, id := range sv.ae.SharedPeers(r) {
		nd, ok := r.Node(id)
		parts := sv.ae.SharedPartitions(r, id)
		if !ok || len(parts) == 0 {
			continue
		}
		wg.Go(func() {
			ans := peerRootsAnswer{roots: map[uint16]uint64{}}
			req := sv.ae.RootsRequest(parts)
			resp, err := transport.Unary(ctx, sv.peers, req, sv.peers.Get(nd.APIAddr).Peer.TreeRoots)
			switch {
			case err != nil:
				ans.err = err
			case len(resp.Roots) != len(parts):
				ans.err = fmt.Errorf("%d roots for %d partitions", len(resp.Roots), len(parts))
			default:
				for i, p := range parts {
					ans.roots[p] = resp.Roots[i]
				}
			}
			mu.Lock()
			out[id] = ans
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// replicaRoots lists the roots of partition p's replicas: this node's and
// the peers' answers.
func (sv *Server) replicaRoots(r *cluster.Ring, p uint16, peers map[string]peerRootsAnswer) ([]*nornv1.ReplicaRoot, bool) {
	var out []*nornv1.ReplicaRoot
	agree := true
	var mine uint64
	if t := sv.ae.Tree(p); t != nil {
		mine = t.Root()
	}
	for _, id := range r.Cohort(int(p)) {
		rr := &nornv1.ReplicaRoot{NodeId: string(id)}
		ans, ok := peers[string(id)]
		switch {
		case string(id) == sv.cfg.NodeID:
			rr.Root = mine
		case !ok:
			rr.Error = "not asked"
		case ans.err != nil:
			rr.Error = ans.err.Error()
		default:
			root, ok := ans.roots[p]
			if !ok {
				rr.Error = "no root"
			} else {
				rr.Root = root
			}
		}
		agree = agree && rr.Error == "" && rr.Root == mine
		out = append(out, rr)
	}
	return out, agree
}
