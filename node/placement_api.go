package node

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

var errPlacementTODO = connect.NewError(connect.CodeUnimplemented, errors.New("placement changes are not implemented yet"))

func (a adminService) Join(context.Context, *connect.Request[nornv1.JoinRequest]) (*connect.Response[nornv1.JoinResponse], error) {
	return nil, errPlacementTODO
}

func (a adminService) Rebalance(context.Context, *connect.Request[nornv1.RebalanceRequest]) (*connect.Response[nornv1.RebalanceResponse], error) {
	return nil, errPlacementTODO
}

func (a adminService) Drain(context.Context, *connect.Request[nornv1.DrainRequest]) (*connect.Response[nornv1.DrainResponse], error) {
	return nil, errPlacementTODO
}

func (a adminService) Decommission(context.Context, *connect.Request[nornv1.DecommissionRequest]) (*connect.Response[nornv1.DecommissionResponse], error) {
	return nil, errPlacementTODO
}

func (a adminService) Remove(context.Context, *connect.Request[nornv1.RemoveRequest]) (*connect.Response[nornv1.RemoveResponse], error) {
	return nil, errPlacementTODO
}

func (s peerService) ChangeGroup(context.Context, *connect.Request[nornv1.ChangeGroupRequest]) (*connect.Response[nornv1.ChangeGroupResponse], error) {
	return nil, errPlacementTODO
}

func (s peerService) ReplicaProgress(context.Context, *connect.Request[nornv1.ReplicaProgressRequest]) (*connect.Response[nornv1.ReplicaProgressResponse], error) {
	return nil, errPlacementTODO
}
