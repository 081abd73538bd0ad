package antientropy

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/transport"
)

// rpcPeer is Peer over PeerService.
type rpcPeer struct {
	peers  *transport.Peers
	p      *transport.Peer
	limits crdt.Limits // the states read are validated against them
}

func (a *rpcPeer) TreeRoots(ctx context.Context, req *nornv1.TreeRootsRequest) (*nornv1.TreeRootsResponse, error) {
	return transport.Unary(ctx, a.peers, req, a.p.Peer.TreeRoots)
}

func (a *rpcPeer) TreeNodes(ctx context.Context, req *nornv1.TreeNodesRequest) (*nornv1.TreeNodesResponse, error) {
	return transport.Unary(ctx, a.peers, req, a.p.Peer.TreeNodes)
}

func (a *rpcPeer) SegmentEntries(ctx context.Context, req *nornv1.SegmentEntriesRequest) (*nornv1.SegmentEntriesResponse, error) {
	return transport.Unary(ctx, a.peers, req, a.p.Peer.SegmentEntries)
}

func (a *rpcPeer) ReadStates(ctx context.Context, _ uint16, ids []uint64) ([]*crdt.Task, int, error) {
	resp, err := a.p.Peer.Read(ctx, transport.Request(a.peers, &nornv1.ReadRequest{Ids: ids}))
	if err != nil {
		return nil, 0, err
	}
	if len(resp.Msg.Tasks) != len(ids) {
		return nil, 0, fmt.Errorf("read %d answers for %d ids", len(resp.Msg.Tasks), len(ids))
	}
	out := make([]*crdt.Task, len(ids))
	bytes := 0
	for i, rt := range resp.Msg.Tasks {
		bytes += len(rt.State)
		if len(rt.State) == 0 {
			continue
		}
		t, err := crdt.Decode(rt.State)
		if err == nil {
			err = t.Validate(a.limits)
		}
		if err != nil {
			return nil, bytes, fmt.Errorf("state of %d from %s: %w", ids[i], a.p.Addr, err)
		}
		out[i] = t
	}
	return out, bytes, nil
}

func (a *rpcPeer) Push(ctx context.Context, _ uint16, tasks []*crdt.Task) (int, error) {
	req := &nornv1.ReplicateRequest{Tasks: make([][]byte, len(tasks))}
	bytes := 0
	for i, t := range tasks {
		req.Tasks[i] = t.Encode()
		bytes += len(req.Tasks[i])
	}
	_, err := a.p.Peer.Replicate(ctx, transport.Request(a.peers, req))
	return bytes, err
}

// answer answers one anti-entropy call of a peer with serve, mapping its
// errors: a partition not replicated here or trees of another size are
// FAILED_PRECONDITION, other refusals INVALID_ARGUMENT; connect errors
// pass as they are.
func answer[Req, Resp any](req *Req, serve func(*Req) (*Resp, error)) (*Resp, error) {
	resp, err := serve(req)
	var ce *connect.Error
	switch {
	case err == nil:
		return resp, nil
	case errors.As(err, &ce):
		return nil, err
	case errors.Is(err, ErrNotReplicated), errors.Is(err, ErrTreeSize), errors.Is(err, ErrQueuesVersion):
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
}

// ServeTreeRoots answers PeerService.TreeRoots (Replica.ServeTreeRoots)
// with connect errors.
func (s *Scheduler) ServeTreeRoots(req *nornv1.TreeRootsRequest) (*nornv1.TreeRootsResponse, error) {
	return answer(req, s.replica.ServeTreeRoots)
}

// ServeTreeNodes answers PeerService.TreeNodes (Replica.ServeTreeNodes)
// with connect errors.
func (s *Scheduler) ServeTreeNodes(req *nornv1.TreeNodesRequest) (*nornv1.TreeNodesResponse, error) {
	return answer(req, s.replica.ServeTreeNodes)
}

// ServeSegmentEntries answers PeerService.SegmentEntries
// (Replica.ServeSegmentEntries) with connect errors.
func (s *Scheduler) ServeSegmentEntries(req *nornv1.SegmentEntriesRequest) (*nornv1.SegmentEntriesResponse, error) {
	return answer(req, s.replica.ServeSegmentEntries)
}
