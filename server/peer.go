package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/transport"
)

// peerService implements norn.v1.PeerService.
type peerService struct{ sv *Server }

var _ nornv1connect.PeerServiceHandler = peerService{}

// checkPeer refuses a call that does not come from a node of this
// node's cluster: unknown node id, another cluster id, or (over
// cleartext) an address that is not that node's. Before the cluster is
// formed, gossip members are accepted (GetRing). A PeerService call over
// HTTP is verified when the node serves TLS: identityFromCert then sets
// its node header from the client certificate.
func (sv *Server) checkPeer(peerAddr string, h http.Header) error {
	return sv.checkCaller(peerAddr, h.Get(transport.HeaderNode), h.Get(transport.HeaderCluster), sv.cfg.Security.TLS)
}

// AdmitPeer decides, before a PeerService call's body is read, whether
// its caller is a node of this node's cluster: checkPeer, which every
// PeerService method makes again. h holds the call's node and cluster
// headers (over TLS the node's taken from the client certificate, none
// for a user's certificate or none); peerAddr is its remote address.
func (sv *Server) AdmitPeer(peerAddr string, h http.Header) error { return sv.checkPeer(peerAddr, h) }

// checkCaller is checkPeer for a caller that names node id of cluster
// clusterID, verified (taken from its TLS certificate) or not. It runs on
// every peer call, so gossip's member list (a sorted copy) is asked for
// only when the ring does not already vouch for the caller.
func (sv *Server) checkCaller(peerAddr, id, clusterID string, verified bool) error {
	members := func() []cluster.Member {
		if m := sv.host.Members(); m != nil {
			return m.Members()
		}
		return nil
	}
	return peerAllowed(sv.host.Ring(), members, peerAddr, id, clusterID, verified)
}

// peerAllowed is checkCaller's rule. A verified caller is the node its
// certificate names: it needs only to be a node of r (or, before r, a
// gossip member) of this cluster. An unverified one must also call from
// the host of one of that node's addresses (API, Raft or gossip): on
// Kubernetes the API address is a DNS name and the Raft and gossip
// addresses are the pod's IP, and no check here resolves names.
func peerAllowed(r *cluster.Ring, members func() []cluster.Member, peerAddr, id, clusterID string, verified bool) error {
	deny := func(format string, args ...any) error {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("peer call refused: "+format, args...))
	}
	host, _, err := net.SplitHostPort(peerAddr)
	ip := net.ParseIP(host)
	if err != nil || ip == nil {
		return deny("unknown caller address %q", peerAddr)
	}
	if id == "" {
		return deny("the caller at %s names no node", peerAddr)
	}
	at := func(addrs ...string) bool {
		if verified {
			return true
		}
		for _, a := range addrs {
			if transport.SameHost(a, ip) {
				return true
			}
		}
		return false
	}
	if r != nil {
		if clusterID != "" && clusterID != r.ClusterID {
			return deny("the caller is in cluster %s, this node in %s", clusterID, r.ClusterID)
		}
		if nd, ok := r.Node(id); ok && at(nd.APIAddr, nd.RaftAddr, nd.GossipAddr) {
			return nil
		}
	}
	for _, m := range members() {
		if m.ID == id && at(m.APIAddr, m.RaftAddr, m.GossipAddr) && (r == nil || m.ClusterID == "" || m.ClusterID == r.ClusterID) {
			return nil
		}
	}
	return deny("%q at %s is not a member of this cluster", id, peerAddr)
}

func (s peerService) Replicate(_ context.Context, req *connect.Request[nornv1.ReplicateRequest]) (*connect.Response[nornv1.ReplicateResponse], error) {
	if err := s.sv.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	if err := s.sv.exchangeGate(req.Header().Get(transport.HeaderNode), false); err != nil {
		return nil, err
	}
	// The caller's ring epoch.
	epoch, _ := strconv.ParseUint(req.Header().Get(transport.HeaderEpoch), 10, 64)
	if err := s.sv.coord.Replicate(epoch, req.Msg.GetTasks()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.ReplicateResponse{}), nil
}

func (s peerService) Read(_ context.Context, req *connect.Request[nornv1.ReadRequest]) (*connect.Response[nornv1.ReadResponse], error) {
	if err := s.sv.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	if err := s.sv.exchangeGate(req.Header().Get(transport.HeaderNode), true); err != nil {
		return nil, err
	}
	out, err := s.sv.coord.ReadReplica(req.Msg.GetIds())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.ReadResponse{Tasks: out}), nil
}

func (s peerService) GetRing(_ context.Context, req *connect.Request[nornv1.GetRingRequest]) (*connect.Response[nornv1.GetRingResponse], error) {
	sv := s.sv
	if err := sv.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	resp := &nornv1.GetRingResponse{}
	if r := sv.host.Ring(); r != nil {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		resp.Ring = b
	}
	if q := sv.host.Queues(); q != nil {
		b, err := json.Marshal(q)
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		resp.Queues = b
	}
	return connect.NewResponse(resp), nil
}

// peerRing checks a peer call about partition p: the caller, a formed
// cluster, p below P. It returns the ring.
func (sv *Server) peerRing(addr string, h http.Header, p uint32) (*cluster.Ring, error) {
	if err := sv.checkPeer(addr, h); err != nil {
		return nil, err
	}
	r := sv.host.Ring()
	if r == nil {
		return nil, apierr.NotFormed
	}
	if int(p) >= r.Partitions {
		return nil, apierr.Invalid("partition", "%d is not below the partition count %d", p, r.Partitions)
	}
	return r, nil
}

// ChangeGroup changes partition p's Raft configuration on p's leader.
func (s peerService) ChangeGroup(_ context.Context, req *connect.Request[nornv1.ChangeGroupRequest]) (*connect.Response[nornv1.ChangeGroupResponse], error) {
	sv, m := s.sv, req.Msg
	if _, err := sv.peerRing(req.Peer().Addr, req.Header(), m.GetPartition()); err != nil {
		return nil, err
	}
	if m.GetNode() == "" {
		return nil, apierr.Invalid("node", "is required")
	}
	p := uint16(m.GetPartition())
	g := sv.host.Group(p)
	if g == nil {
		return nil, sv.coord.NotReplicated("partition", p)
	}
	resp, err := sv.rebalance.ChangeGroup(g, p, m.GetOp(), m.GetNode(), m.GetRaftAddress())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// ReplicaProgress reports this node's replica of a partition.
func (s peerService) ReplicaProgress(_ context.Context, req *connect.Request[nornv1.ReplicaProgressRequest]) (*connect.Response[nornv1.ReplicaProgressResponse], error) {
	sv, m := s.sv, req.Msg
	r, err := sv.peerRing(req.Peer().Addr, req.Header(), m.GetPartition())
	if err != nil {
		return nil, err
	}
	if len(m.GetFillFrom()) > r.Replication+1 {
		return nil, apierr.Invalid("fill_from", "names %d nodes; at most %d", len(m.GetFillFrom()), r.Replication+1)
	}
	return connect.NewResponse(sv.rebalance.ReplicaProgress(r, uint16(m.GetPartition()), m.GetFillFrom(), m.GetAfterRound())), nil
}

func (s peerService) ListPartition(_ context.Context, req *connect.Request[nornv1.ListPartitionRequest]) (*connect.Response[nornv1.ListPartitionResponse], error) {
	if err := s.sv.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	resp, err := s.sv.coord.ListPartition(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (s peerService) CountPartitions(_ context.Context, req *connect.Request[nornv1.CountPartitionsRequest]) (*connect.Response[nornv1.CountPartitionsResponse], error) {
	if err := s.sv.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	resp, err := s.sv.coord.CountPartitions(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// ReadyHeads returns the best claimable heads of a queue in the
// partitions this node leads: a node serving a claim weighs them against
// its own (dispatch, remote heads).
func (s peerService) ReadyHeads(_ context.Context, req *connect.Request[nornv1.ReadyHeadsRequest]) (*connect.Response[nornv1.ReadyHeadsResponse], error) {
	if err := s.sv.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	m := req.Msg
	if err := crdt.ValidateQueue("queue", m.GetQueue()); err != nil {
		return nil, apierr.From(err)
	}
	if n := m.GetMax(); n == 0 || n > maxClaimBatch {
		return nil, apierr.Invalid("max", "must be 1-%d, got %d", maxClaimBatch, n)
	}
	resp, err := s.sv.dispatch.ReadyHeads(m.GetQueue(), int(m.GetMax()), m.GetCountClaimed())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// servePeer answers one call of a peer with serve, once checkPeer has
// accepted the caller.
func servePeer[Req, Resp any](sv *Server, req *connect.Request[Req], serve func(*Req) (*Resp, error)) (*connect.Response[Resp], error) {
	if err := sv.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	if err := sv.exchangeGate(req.Header().Get(transport.HeaderNode), true); err != nil {
		return nil, err
	}
	resp, err := serve(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (s peerService) TreeRoots(_ context.Context, req *connect.Request[nornv1.TreeRootsRequest]) (*connect.Response[nornv1.TreeRootsResponse], error) {
	return servePeer(s.sv, req, func(m *nornv1.TreeRootsRequest) (*nornv1.TreeRootsResponse, error) {
		if s.sv.host.Ring() == nil {
			return nil, apierr.NotFormed
		}
		return s.sv.ae.ServeTreeRoots(m)
	})
}

func (s peerService) TreeNodes(_ context.Context, req *connect.Request[nornv1.TreeNodesRequest]) (*connect.Response[nornv1.TreeNodesResponse], error) {
	return servePeer(s.sv, req, s.sv.ae.ServeTreeNodes)
}

func (s peerService) SegmentEntries(_ context.Context, req *connect.Request[nornv1.SegmentEntriesRequest]) (*connect.Response[nornv1.SegmentEntriesResponse], error) {
	return servePeer(s.sv, req, s.sv.ae.ServeSegmentEntries)
}

// HandleRPC answers the framed peer calls (transport.ServeRPC on the Raft
// port) as the PeerService methods of the same name do, with the same
// check of the caller.
func (sv *Server) HandleRPC(ctx context.Context, m transport.RPCMethod, meta transport.RPCMeta, body []byte) ([]byte, error) {
	if meta.Cert != nil {
		// Over TLS the caller is the node its certificate names (the
		// Raft port takes node certificates only).
		meta.Node = meta.Cert.Node
	}
	if err := sv.checkCaller(meta.Remote, meta.Node, meta.Cluster, meta.Cert != nil); err != nil {
		return nil, err
	}
	switch m {
	case transport.MethodReplicate:
		if err := sv.exchangeGate(meta.Node, false); err != nil {
			return nil, err
		}
		var req nornv1.ReplicateRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			return nil, apierr.Invalid("tasks", "undecodable ReplicateRequest: %v", err)
		}
		return nil, sv.coord.Replicate(meta.Epoch, req.GetTasks())
	case transport.MethodRaftHeartbeats:
		if sv.cfg.Heartbeats != nil {
			return sv.cfg.Heartbeats.Serve(ctx, body)
		}
	case transport.MethodRaft:
		if sv.cfg.Heartbeats != nil {
			return sv.cfg.Heartbeats.ServeRaft(ctx, body)
		}
	}
	return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("no framed peer call %d", m))
}

// exchangeGate applies Config.ExchangeGate to a call of peer.
func (sv *Server) exchangeGate(peer string, serving bool) error {
	if sv.cfg.ExchangeGate == nil {
		return nil
	}
	if err := sv.cfg.ExchangeGate(peer, serving); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return nil
}
