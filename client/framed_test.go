package client_test

import (
	"context"
	"net"
	"net/http"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/client"
	"github.com/norn-dev/norn/transport"
)

// TestFramedClaimLateAnswerGivesBack: a framed claim whose caller left
// (its context cancelled: a worker shutting down) but whose node granted
// the claim anyway, before it learned the caller left, gives the tasks of
// the late answer back with Yield: nobody would handle them, and they
// would wait out their leases.
func TestFramedClaimLateAnswerGivesBack(t *testing.T) {
	f := newFakeT(t)
	api := nornv1connect.NewTaskServiceClient(http.DefaultClient, "http://"+f.addr)
	ctx := context.Background()
	resp, err := api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: spec("late")}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetId()

	// A framed server that claims from the fake only once told, whatever
	// the caller did meanwhile.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, framed := transport.SplitListener(ln)
	started, release := make(chan struct{}, 1), make(chan struct{})
	rpc := transport.ServeRPCListener(framed, 0, func(_ context.Context, m transport.RPCMethod, _ transport.RPCMeta, body []byte) ([]byte, error) {
		var req nornv1.ClaimRequest
		if m != transport.MethodClaim || proto.Unmarshal(body, &req) != nil {
			return nil, connect.NewError(connect.CodeUnimplemented, nil)
		}
		started <- struct{}{}
		<-release
		got, err := f.Claim(context.Background(), connect.NewRequest(&req))
		if err != nil {
			return nil, err
		}
		return proto.Marshal(got.Msg)
	}, nil)
	t.Cleanup(func() { rpc.Close(); framed.Close() })

	tasks := client.NewFramedTaskService(api, ln.Addr().String())
	cctx, cancel := context.WithCancel(ctx)
	go func() { <-started; cancel() }()
	if _, err := tasks.Claim(cctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "q", Worker: "w"})); connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("claim whose caller left: %v, want CANCELED", err)
	}
	close(release)
	waitFor(t, "the late claim given back", func() bool {
		task := f.task(id)
		return task.GetStatus() == nornv1.TaskStatus_TASK_STATUS_READY && len(task.GetClaims()) == 1 &&
			task.GetClaims()[0].GetEndReason() == nornv1.ClaimEnd_CLAIM_END_YIELDED
	})
}
