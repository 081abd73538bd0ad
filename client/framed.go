package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/transport"
)

// framedTasks sends the hot TaskService calls (Enqueue, EnqueueBatch,
// Claim, Complete, CompleteBatch, Renew) as framed calls on the node's API port
// (transport.SplitListener) and the others through connect. A node that
// does not speak the framed protocol gets connect for every call.
type framedTasks struct {
	nornv1connect.TaskServiceClient
	rpc *transport.RPCClient
}

func newFramedTasks(c nornv1connect.TaskServiceClient, hostport string) *framedTasks {
	return &framedTasks{TaskServiceClient: c, rpc: transport.NewClientRPCClient(hostport)}
}

// newFramedTasksTLS is newFramedTasks over TLS with conf (ALPN
// transport.FramedALPN on the API port).
func newFramedTasksTLS(c nornv1connect.TaskServiceClient, hostport string, conf *tls.Config) *framedTasks {
	return &framedTasks{TaskServiceClient: c, rpc: transport.NewClientRPCClientTLS(hostport, conf)}
}

// NewFramedTaskService returns a TaskServiceClient of the node at hostport
// ("host:port", cleartext) that sends the hot calls framed, as a Client
// does (WithFramedCalls), and every other call, and every call when the
// node does not speak the framed protocol, through c. For callers that
// use the generated client directly (the Jepsen harness).
func NewFramedTaskService(c nornv1connect.TaskServiceClient, hostport string) nornv1connect.TaskServiceClient {
	return newFramedTasks(c, hostport)
}

// NewFramedTaskServiceTLS is NewFramedTaskService for a node serving TLS:
// the framed calls go over TLS with conf (its client certificate is their
// credential).
func NewFramedTaskServiceTLS(c nornv1connect.TaskServiceClient, hostport string, conf *tls.Config) nornv1connect.TaskServiceClient {
	return newFramedTasksTLS(c, hostport, conf)
}

// callFramed makes one framed call; ok is false when the node does not
// serve framed calls (the caller then uses connect).
func callFramed[Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, f *framedTasks, m transport.RPCMethod, req proto.Message, late func([]byte)) (resp *connect.Response[Resp], ok bool, err error) {
	body, err := proto.Marshal(req)
	if err != nil {
		return nil, true, connect.NewError(connect.CodeInternal, fmt.Errorf("marshal %T: %w", req, err))
	}
	out, err := f.rpc.CallLate(ctx, m, transport.ClientCallMeta(ctx), body, late)
	if errors.Is(err, transport.ErrRPCUnsupported) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, err
	}
	msg := PResp(new(Resp))
	if err := proto.Unmarshal(out, msg); err != nil {
		return nil, true, connect.NewError(connect.CodeInternal, fmt.Errorf("unmarshal %T: %w", msg, err))
	}
	return connect.NewResponse((*Resp)(msg)), true, nil
}

// framedOr sends req framed as method m, or through connect's call when
// the node does not speak the framed protocol.
func framedOr[Req, Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, f *framedTasks, m transport.RPCMethod, req *connect.Request[Req], viaConnect func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) (*connect.Response[Resp], error) {
	return framedLateOr[Req, Resp, PResp](ctx, f, m, req, viaConnect, nil)
}

// framedLateOr is framedOr with late given the framed answer that comes
// after ctx ended (transport.RPCClient.CallLate).
func framedLateOr[Req, Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, f *framedTasks, m transport.RPCMethod, req *connect.Request[Req], viaConnect func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), late func([]byte)) (*connect.Response[Resp], error) {
	msg, ok := any(req.Msg).(proto.Message)
	if !ok {
		return viaConnect(ctx, req)
	}
	if resp, ok, err := callFramed[Resp, PResp](ctx, f, m, msg, late); ok {
		return resp, err
	}
	return viaConnect(ctx, req)
}

func (f *framedTasks) Enqueue(ctx context.Context, req *connect.Request[nornv1.EnqueueRequest]) (*connect.Response[nornv1.EnqueueResponse], error) {
	return framedOr(ctx, f, transport.MethodEnqueue, req, f.TaskServiceClient.Enqueue)
}

func (f *framedTasks) EnqueueBatch(ctx context.Context, req *connect.Request[nornv1.EnqueueBatchRequest]) (*connect.Response[nornv1.EnqueueBatchResponse], error) {
	return framedOr(ctx, f, transport.MethodEnqueueBatch, req, f.TaskServiceClient.EnqueueBatch)
}

// Claim claims framed. A claim the caller left (ctx ended) whose answer
// still comes with tasks gives them back (Yield): nobody will handle
// them, and they would wait out their leases. (The node gives back what
// it grants after it learned the caller left; this covers the answer on
// its way when the caller left.)
func (f *framedTasks) Claim(ctx context.Context, req *connect.Request[nornv1.ClaimRequest]) (*connect.Response[nornv1.ClaimResponse], error) {
	late := func(body []byte) {
		var resp nornv1.ClaimResponse
		if proto.Unmarshal(body, &resp) != nil {
			return
		}
		yctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
		defer cancel()
		for _, ct := range resp.GetTasks() {
			f.TaskServiceClient.Yield(yctx, connect.NewRequest(&nornv1.YieldRequest{Id: ct.GetTask().GetId(), ClaimId: ct.GetClaimId()})) //nolint:errcheck // best effort: the lease expires otherwise
		}
	}
	return framedLateOr[nornv1.ClaimRequest, nornv1.ClaimResponse](ctx, f, transport.MethodClaim, req, f.TaskServiceClient.Claim, late)
}

// giveBackTimeout bounds the yields of a claim answer that came late.
const giveBackTimeout = 5 * time.Second

func (f *framedTasks) Complete(ctx context.Context, req *connect.Request[nornv1.CompleteRequest]) (*connect.Response[nornv1.CompleteResponse], error) {
	return framedOr(ctx, f, transport.MethodComplete, req, f.TaskServiceClient.Complete)
}

func (f *framedTasks) CompleteBatch(ctx context.Context, req *connect.Request[nornv1.CompleteBatchRequest]) (*connect.Response[nornv1.CompleteBatchResponse], error) {
	return framedOr(ctx, f, transport.MethodCompleteBatch, req, f.TaskServiceClient.CompleteBatch)
}

func (f *framedTasks) Renew(ctx context.Context, req *connect.Request[nornv1.RenewRequest]) (*connect.Response[nornv1.RenewResponse], error) {
	return framedOr(ctx, f, transport.MethodRenew, req, f.TaskServiceClient.Renew)
}
