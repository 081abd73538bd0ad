package node

import (
	"context"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/replicas"
)

// aeHost is antientropy.Host over the node's replicas.
type aeHost struct{ *replicas.Host }

func (h aeHost) Replicates(p uint16) bool { return h.Group(p) != nil }

// servePeer answers one call of a peer with serve, once checkPeer has
// accepted the caller.
func servePeer[Req, Resp any](n *Node, req *connect.Request[Req], serve func(*Req) (*Resp, error)) (*connect.Response[Resp], error) {
	if err := n.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	resp, err := serve(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (s peerService) TreeRoots(_ context.Context, req *connect.Request[nornv1.TreeRootsRequest]) (*connect.Response[nornv1.TreeRootsResponse], error) {
	return servePeer(s.n, req, func(m *nornv1.TreeRootsRequest) (*nornv1.TreeRootsResponse, error) {
		if s.n.host.Ring() == nil {
			return nil, apierr.NotFormed
		}
		return s.n.ae.ServeTreeRoots(m)
	})
}

func (s peerService) TreeNodes(_ context.Context, req *connect.Request[nornv1.TreeNodesRequest]) (*connect.Response[nornv1.TreeNodesResponse], error) {
	return servePeer(s.n, req, s.n.ae.ServeTreeNodes)
}

func (s peerService) SegmentEntries(_ context.Context, req *connect.Request[nornv1.SegmentEntriesRequest]) (*connect.Response[nornv1.SegmentEntriesResponse], error) {
	return servePeer(s.n, req, s.n.ae.ServeSegmentEntries)
}
