package node

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/replicas"
)

// retentionHorizon is now minus the retention (Unix ms): terminal tasks
// older than that are deleted.
func (n *Node) retentionHorizon() int64 {
	return n.cfg.Clock.Now().Add(-n.cfg.Retention).UnixMilli()
}

// expireBefore deletes partition p's terminal tasks older than ms. On the
// partition's leader the claim FSM forgets their records first, through
// Raft; other replicas delete their task states alone.
func (n *Node) expireBefore(p uint16, ms int64) error {
	var forget func([]uint64) error
	if g := n.host.Group(p); g != nil && g.IsLeader() {
		forget = func(ids []uint64) error {
			cmd := &claims.Command{Op: claims.OpForget, NowMs: n.cfg.Clock.Now().UnixMilli(), IDs: ids}
			if _, err := g.Propose(cmd, replicas.ProposeTimeout); err != nil {
				return fmt.Errorf("forgetting expired tasks: %w", err)
			}
			return nil
		}
	}
	_, err := n.store.DeleteTerminalBefore(p, ms, monitorBatch, forget)
	return err
}

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
