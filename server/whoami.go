package server

import (
	"context"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/transport"
)

// WhoAmI answers who the call's caller is, as authorize found it (any
// role may ask: procRoles), and the user's grants.
func (s adminService) WhoAmI(ctx context.Context, req *connect.Request[nornv1.WhoAmIRequest]) (*connect.Response[nornv1.WhoAmIResponse], error) {
	sv := s.sv
	out := &nornv1.WhoAmIResponse{AccessControl: sv.cfg.Auth != nil}
	if !sv.authOn() {
		return connect.NewResponse(out), nil
	}
	id, _ := transport.IdentityFromContext(ctx)
	p, err := sv.authenticate(id, req.Header().Get("Authorization"))
	if err != nil {
		return nil, err // the interceptor refused it already
	}
	out.User, out.Node, out.Via = p.user, p.node, p.via
	if sv.cfg.Auth != nil && p.user != "" {
		for _, g := range sv.cfg.Auth.Grants(p.user) {
			out.Grants = append(out.Grants, &nornv1.Grant{Role: g.Role, Queues: g.Queues})
		}
	}
	return connect.NewResponse(out), nil
}
