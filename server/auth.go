package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/access"
	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// Who may call what (docs/SECURITY.md). With an access file
// (Config.Auth) every TaskService and AdminService call needs a user, by
// client certificate or bearer token, whose grants allow the method on
// the queues the call touches; a node's certificate (a peer forwarding a
// call) may call everything. Without an access file but with TLS, any
// client certificate of the CA may call everything. Without either,
// everyone may (loopback or -insecure).

// procRoles lists the roles that may call each procedure. A procedure
// missing here is for admins only.
var procRoles = map[string][]string{
	nornv1connect.TaskServiceEnqueueProcedure:       {access.RoleAdmin, access.RoleProducer},
	nornv1connect.TaskServiceEnqueueBatchProcedure:  {access.RoleAdmin, access.RoleProducer},
	nornv1connect.TaskServiceCancelProcedure:        {access.RoleAdmin, access.RoleProducer},
	nornv1connect.TaskServiceRetryProcedure:         {access.RoleAdmin, access.RoleProducer, access.RoleWorker},
	nornv1connect.TaskServiceGetTaskProcedure:       {access.RoleAdmin, access.RoleProducer, access.RoleWorker, access.RoleReader},
	nornv1connect.TaskServiceListTasksProcedure:     {access.RoleAdmin, access.RoleProducer, access.RoleReader},
	nornv1connect.TaskServiceCountTasksProcedure:    {access.RoleAdmin, access.RoleProducer, access.RoleReader},
	nornv1connect.TaskServiceClaimProcedure:         {access.RoleAdmin, access.RoleWorker},
	nornv1connect.TaskServiceRenewProcedure:         {access.RoleAdmin, access.RoleWorker},
	nornv1connect.TaskServiceUpdateProcedure:        {access.RoleAdmin, access.RoleWorker},
	nornv1connect.TaskServiceCompleteProcedure:      {access.RoleAdmin, access.RoleWorker},
	nornv1connect.TaskServiceCompleteBatchProcedure: {access.RoleAdmin, access.RoleWorker},
	nornv1connect.TaskServiceAbortProcedure:         {access.RoleAdmin, access.RoleWorker},
	nornv1connect.TaskServiceYieldProcedure:         {access.RoleAdmin, access.RoleWorker},
	nornv1connect.AdminServiceStatusProcedure:       {access.RoleAdmin, access.RoleReader},
	nornv1connect.AdminServiceWhoAmIProcedure:       access.Roles,
	nornv1connect.QueueServiceGetQueueProcedure:     {access.RoleAdmin, access.RoleProducer, access.RoleReader},
	nornv1connect.QueueServiceListQueuesProcedure:   {access.RoleAdmin, access.RoleProducer, access.RoleReader},
}

// principal is who a call speaks for.
type principal struct {
	node string // a node's certificate: every right
	user string
	via  string // "certificate" or "token"
}

func (p principal) String() string {
	if p.node != "" {
		return "node " + p.node
	}
	if p.user == "" {
		return "an unauthenticated caller"
	}
	return fmt.Sprintf("user %q (%s)", p.user, p.via)
}

// authMode is how calls are checked.
func (sv *Server) authOn() bool { return sv.cfg.Auth != nil || sv.cfg.Security.TLS }

// AuthInterceptor checks every connect call of TaskService and
// AdminService (see above); PeerService has its own checks (checkPeer).
func (sv *Server) AuthInterceptor() connect.Interceptor { return authInterceptor{sv} }

type authInterceptor struct{ sv *Server }

func (i authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if i.sv.authOn() {
			id, _ := transport.IdentityFromContext(ctx)
			p, err := i.sv.authorize(ctx, req.Spec().Procedure, id, req.Header().Get("Authorization"), req.Any())
			if err != nil {
				return nil, err
			}
			if p.node == "" {
				// Only a node forwards: a client's call is its own.
				transport.StripPeerHeaders(req.Header())
			}
		}
		return next(ctx, req)
	}
}

func (i authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if i.sv.authOn() {
			// No streaming method takes a queue: admins only.
			id, _ := transport.IdentityFromContext(ctx)
			if _, err := i.sv.authorize(ctx, conn.Spec().Procedure, id, conn.RequestHeader().Get("Authorization"), nil); err != nil {
				return err
			}
		}
		return next(ctx, conn)
	}
}

// AdmitClient decides, before a TaskService or AdminService call's body
// is read, whether its caller is anybody at all: with access control on
// (an access file, or TLS), a call without a client certificate and
// without a valid bearer token is refused UNAUTHENTICATED, with the error
// and the audit line AuthInterceptor would give it once its body was
// read. What an admitted caller may do is decided then, by method and
// queue (AuthInterceptor, AuthorizeFramed). cert is the connection's
// verified certificate (zero: none); authz the call's Authorization
// header ("" for a framed call, which carries none).
func (sv *Server) AdmitClient(procedure string, cert transport.Identity, authz string) error {
	if !sv.authOn() {
		return nil
	}
	if _, err := sv.authenticate(cert, authz); err != nil {
		sv.audit(procedure, principal{}, err)
		return err
	}
	return nil
}

// AuthorizeFramed checks a framed client call (the API port's framed
// calls carry no token: a client certificate is their credential).
func (sv *Server) AuthorizeFramed(ctx context.Context, procedure string, cert *transport.Identity, msg any) error {
	if !sv.authOn() {
		return nil
	}
	var id transport.Identity
	if cert != nil {
		id = *cert
	}
	_, err := sv.authorize(ctx, procedure, id, "", msg)
	return err
}

// authorize decides one call: the caller from its certificate identity
// or its Authorization header, then its grants against the procedure and
// the queues msg touches.
func (sv *Server) authorize(ctx context.Context, procedure string, cert transport.Identity, authz string, msg any) (principal, error) {
	p, err := sv.authenticate(cert, authz)
	if err != nil {
		sv.audit(procedure, principal{}, err)
		return principal{}, err
	}
	if p.node != "" || sv.cfg.Auth == nil {
		// A peer forwarding a call, or TLS without an access file: every
		// client certificate of the CA may call everything.
		sv.auditAdmin(procedure, p)
		return p, nil
	}
	if err := sv.permit(ctx, procedure, p, msg); err != nil {
		sv.audit(procedure, p, err)
		return p, err
	}
	sv.auditAdmin(procedure, p)
	return p, nil
}

// authenticate finds the caller: a node's certificate; else the call's
// bearer token, which names the caller of this call whatever client
// certificate its connection carries; else a user's certificate.
func (sv *Server) authenticate(cert transport.Identity, authz string) (principal, error) {
	if cert.Node != "" {
		return principal{node: cert.Node}, nil
	}
	tok, hasToken := strings.CutPrefix(authz, "Bearer ")
	if cert.User != "" && !hasToken {
		return principal{user: cert.User, via: "certificate"}, nil
	}
	if authz == "" || !hasToken {
		if sv.cfg.Auth == nil {
			return principal{}, connect.NewError(connect.CodeUnauthenticated, errors.New("no client certificate: this node takes clients with a certificate of its CA"))
		}
		return principal{}, connect.NewError(connect.CodeUnauthenticated, errors.New("no credentials: present a client certificate or an Authorization: Bearer token"))
	}
	if sv.cfg.Auth == nil {
		return principal{}, connect.NewError(connect.CodeUnauthenticated, errors.New("this node takes no tokens (no access file): present a client certificate"))
	}
	user, ok := sv.cfg.Auth.TokenUser(strings.TrimSpace(tok))
	if !ok {
		return principal{}, connect.NewError(connect.CodeUnauthenticated, errors.New("the bearer token is not valid (unknown or revoked)"))
	}
	return principal{user: user, via: "token"}, nil
}

// permit checks p's grants: a grant of a role that may call procedure,
// covering every queue the call touches.
func (sv *Server) permit(ctx context.Context, procedure string, p principal, msg any) error {
	roles, ok := procRoles[procedure]
	if !ok {
		roles = []string{access.RoleAdmin}
	}
	var usable []access.Grant
	for _, g := range sv.cfg.Auth.Grants(p.user) {
		if slices.Contains(roles, g.Role) {
			usable = append(usable, g)
		}
	}
	method := procedure[strings.LastIndexByte(procedure, '/')+1:]
	if len(usable) == 0 {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s may not call %s: it needs the role %s", p, method, strings.Join(roles, " or ")))
	}
	anyQueue := slices.ContainsFunc(usable, access.Grant.AllQueues)
	queues, ids, deps, all := callScope(msg)
	if all && !anyQueue {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s may not call %s on every queue: name a queue it is granted", p, method))
	}
	if anyQueue {
		return nil
	}
	covered := func(q string) bool {
		return slices.ContainsFunc(usable, func(g access.Grant) bool { return g.Covers(q) })
	}
	for _, q := range queues {
		if !covered(q) {
			return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s may not call %s on queue %q", p, method, q))
		}
	}
	// Tasks by id, and an enqueue's dependencies: a task of a queue the
	// caller is not granted and a task that does not exist are refused
	// alike, in the same words and after the same work (one majority
	// read), so that the answer does not tell whether the task exists.
	for k, ref := range [][]uint64{ids, deps} {
		what := "on"
		if k == 1 {
			what = "naming in dependsOn"
		}
		for _, id := range ref {
			if id == 0 {
				continue // invalid: the API edge names the field
			}
			q, read, err := sv.queueOf(ctx, id)
			if err != nil {
				return err
			}
			if q != "" && covered(q) {
				continue
			}
			if !read {
				sv.coord.Read(ctx, id, 0) //nolint:errcheck // the not-found answer's work, for equal time
			}
			return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s may not call %s %s task %d: not in a queue it is granted", p, method, what, id))
		}
	}
	return nil
}

// callScope is what a request touches: queues by name, tasks by id
// (and the tasks an enqueue depends on), or every queue (a list or count
// without a queue, an admin call).
func callScope(msg any) (queues []string, ids, deps []uint64, all bool) {
	switch m := msg.(type) {
	case *nornv1.EnqueueRequest:
		return []string{m.GetTask().GetQueue()}, nil, m.GetTask().GetDependsOn(), false
	case *nornv1.EnqueueBatchRequest:
		for _, t := range m.GetTasks() {
			queues = append(queues, t.GetQueue())
			deps = append(deps, t.GetDependsOn()...)
		}
		return queues, nil, deps, false
	case *nornv1.ClaimRequest:
		return []string{m.GetQueue()}, nil, nil, false
	case *nornv1.ListTasksRequest:
		return []string{m.GetQueue()}, nil, nil, m.GetQueue() == ""
	case *nornv1.CountTasksRequest:
		return []string{m.GetQueue()}, nil, nil, m.GetQueue() == ""
	case *nornv1.GetTaskRequest:
		return nil, []uint64{m.GetId()}, nil, false
	case *nornv1.CancelRequest:
		return nil, []uint64{m.GetId()}, nil, false
	case *nornv1.RetryRequest:
		return nil, []uint64{m.GetId()}, nil, false
	case *nornv1.RenewRequest:
		return nil, []uint64{m.GetId()}, nil, false
	case *nornv1.UpdateRequest:
		return nil, []uint64{m.GetId()}, nil, false
	case *nornv1.CompleteRequest:
		return nil, []uint64{m.GetId()}, nil, false
	case *nornv1.AbortRequest:
		return nil, []uint64{m.GetId()}, nil, false
	case *nornv1.YieldRequest:
		return nil, []uint64{m.GetId()}, nil, false
	case *nornv1.CompleteBatchRequest:
		for _, c := range m.GetCompletions() {
			ids = append(ids, c.GetId())
		}
		return nil, ids, nil, false
	case *nornv1.StatusRequest:
		return nil, nil, nil, false // the cluster's state, no task's
	case *nornv1.WhoAmIRequest:
		return nil, nil, nil, false // the caller's own grants
	case *nornv1.GetQueueRequest:
		return []string{m.GetQueue()}, nil, nil, false
	case *nornv1.SetQueueRequest:
		return []string{m.GetQueue()}, nil, nil, false
	case *nornv1.BulkActionRequest:
		return []string{m.GetQueue()}, nil, nil, false
	}
	return nil, nil, nil, true
}

// queueOf returns the queue of task id ("" when no replica has it): this
// node's replica when it has the task (a task's queue never changes),
// else a majority read (read says it made one).
func (sv *Server) queueOf(ctx context.Context, id uint64) (queue string, read bool, err error) {
	if id == 0 {
		return "", false, nil
	}
	ts, err := sv.coord.Load(id)
	if errors.Is(err, storage.ErrNotFound) {
		read = true
		ts, err = sv.coord.Read(ctx, id, 0)
	}
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return "", read, nil
	case err != nil:
		return "", read, err
	}
	return ts.Task.Spec.Queue, read, nil
}

// audit logs a refused call on the audit logger.
func (sv *Server) audit(procedure string, p principal, err error) {
	sv.auditLog().Warn("call refused", "procedure", procedure, "caller", p.String(), "code", connect.CodeOf(err).String(), "err", err)
}

// auditAdmin logs an admin action (every AdminService call but Status
// and WhoAmI, QueueService.SetQueue and TaskService.BulkAction).
func (sv *Server) auditAdmin(procedure string, p principal) {
	if strings.HasPrefix(procedure, "/"+nornv1connect.AdminServiceName+"/") &&
		procedure != nornv1connect.AdminServiceStatusProcedure && procedure != nornv1connect.AdminServiceWhoAmIProcedure ||
		procedure == nornv1connect.QueueServiceSetQueueProcedure || procedure == nornv1connect.TaskServiceBulkActionProcedure {
		sv.auditLog().Info("admin action", "procedure", procedure, "caller", p.String())
	}
}

// auditLog is the audit logger: the node's logger named "audit".
func (sv *Server) auditLog() *slog.Logger {
	return sv.cfg.Logger.With("logger", "audit")
}
