package node

import (
	"context"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

func (s peerService) ListPartition(_ context.Context, req *connect.Request[nornv1.ListPartitionRequest]) (*connect.Response[nornv1.ListPartitionResponse], error) {
	if err := s.n.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	resp, err := s.n.coord.ListPartition(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (s peerService) CountPartitions(_ context.Context, req *connect.Request[nornv1.CountPartitionsRequest]) (*connect.Response[nornv1.CountPartitionsResponse], error) {
	if err := s.n.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	resp, err := s.n.coord.CountPartitions(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}
