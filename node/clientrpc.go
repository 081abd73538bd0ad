package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/transport"
)

// ServeClientRPC serves the framed client calls on ln (the framed side of
// transport.SplitListener on the API port) until the server's Close, with
// frames bounded by the request size limit. A call is refused from its
// frame's header when its connection can make none (admitFramed), and
// frames are read through the node's client budget.
func (n *Node) ServeClientRPC(ln net.Listener, logger *slog.Logger) *transport.RPCServer {
	return transport.ServeRPCWith(ln, transport.RPCServerConfig{
		MaxFrame: uint32(n.cfg.MaxRequestBytes) + clientFrameOverhead,
		Admit:    n.admitFramed,
		Budget:   n.clientBudget,
		Refused:  n.metrics.rpc.ObserveFramedRefused,
	}, n.ClientRPCHandler(), logger)
}

// clientFrameOverhead is what a request frame holds besides its message.
const clientFrameOverhead = 1 << 10

// ClientRPCHandler answers the framed client calls (transport.SplitListener
// on the API port) with the same TaskService as connect: the same
// validation, limits and errors, and the same RPC metrics (transport
// "framed").
func (n *Node) ClientRPCHandler() transport.RPCHandler {
	ts := n.server.TaskService()
	limit := n.cfg.MaxRequestBytes
	return n.metrics.rpc.FramedServer(n.tracing.framed(func(ctx context.Context, m transport.RPCMethod, meta transport.RPCMeta, body []byte) ([]byte, error) {
		if d := transport.ClientCallTimeout(meta); d > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		if limit > 0 && int64(len(body)) > int64(limit) {
			return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("request of %d bytes exceeds the limit of %d", len(body), limit))
		}
		// Each call passes the same access checks as over connect, with
		// the connection's client certificate as its credential.
		auth := func(procedure string, msg any) error {
			return n.server.AuthorizeFramed(ctx, procedure, meta.Cert, msg)
		}
		switch m {
		case transport.MethodEnqueue:
			return unaryFramed(ctx, body, new(nornv1.EnqueueRequest), nornv1connect.TaskServiceEnqueueProcedure, auth, ts.Enqueue)
		case transport.MethodEnqueueBatch:
			return unaryFramed(ctx, body, new(nornv1.EnqueueBatchRequest), nornv1connect.TaskServiceEnqueueBatchProcedure, auth, ts.EnqueueBatch)
		case transport.MethodClaim:
			return unaryFramed(ctx, body, new(nornv1.ClaimRequest), nornv1connect.TaskServiceClaimProcedure, auth, ts.Claim)
		case transport.MethodComplete:
			return unaryFramed(ctx, body, new(nornv1.CompleteRequest), nornv1connect.TaskServiceCompleteProcedure, auth, ts.Complete)
		case transport.MethodCompleteBatch:
			return unaryFramed(ctx, body, new(nornv1.CompleteBatchRequest), nornv1connect.TaskServiceCompleteBatchProcedure, auth, ts.CompleteBatch)
		case transport.MethodRenew:
			return unaryFramed(ctx, body, new(nornv1.RenewRequest), nornv1connect.TaskServiceRenewProcedure, auth, ts.Renew)
		}
		return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("framed method %d", m))
	}))
}

func unaryFramed[Req any, Resp any, PReq interface {
	*Req
	proto.Message
}](ctx context.Context, body []byte, req PReq, procedure string, auth func(string, any) error,
	f func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) ([]byte, error) {
	if err := proto.Unmarshal(body, req); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unmarshal %T: %w", req, err))
	}
	if err := auth(procedure, req); err != nil {
		return nil, err
	}
	resp, err := f(ctx, connect.NewRequest((*Req)(req)))
	if err != nil {
		return nil, err
	}
	msg, ok := any(resp.Msg).(proto.Message)
	if !ok {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("response %T is not a message", resp.Msg))
	}
	return proto.Marshal(msg)
}
