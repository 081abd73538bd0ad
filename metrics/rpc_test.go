package metrics

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/transport"
)

// unaryCall runs one call through the wrapped f (its error is the one
// the test's next returns).
func unaryCall(f connect.UnaryFunc, req connect.AnyRequest) {
	f(context.Background(), req) //nolint:errcheck
}

// serverRequest is a request whose Spec says it is served.
type serverRequest struct {
	connect.AnyRequest
	spec connect.Spec
}

func (r serverRequest) Spec() connect.Spec { return r.spec }

func TestRPCInterceptorCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRPC(reg)
	var errNext error
	next := func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) { return nil, errNext }
	wrapped := r.Interceptor().WrapUnary(next)
	claim := serverRequest{connect.NewRequest(&nornv1.ClaimRequest{}), connect.Spec{Procedure: nornv1connect.TaskServiceClaimProcedure}}
	unaryCall(wrapped, claim)
	unaryCall(wrapped, claim)
	errNext = connect.NewError(connect.CodeFailedPrecondition, errors.New("no"))
	unaryCall(wrapped, claim)
	errNext = context.DeadlineExceeded
	unaryCall(wrapped, claim)
	// A call refused at the edge is counted under its method, for every
	// public service (QueueService's once counted as unknown).
	r.ObserveRefused(nornv1connect.QueueServiceSetQueueProcedure, time.Now(), connect.NewError(connect.CodePermissionDenied, errors.New("no")))
	errNext = nil
	// The client side of another wrapped procedure.
	errNext = nil
	client := r.Interceptor().WrapUnary(next)
	read := serverRequest{connect.NewRequest(&nornv1.ReadRequest{}), connect.Spec{Procedure: nornv1connect.PeerServiceReadProcedure, IsClient: true}}
	unaryCall(client, read)
	// Framed calls, both sides, and a method the API does not have.
	h := r.FramedServer(func(context.Context, transport.RPCMethod, transport.RPCMeta, []byte) ([]byte, error) { return nil, nil })
	h(context.Background(), transport.MethodClaim, transport.RPCMeta{}, nil)   //nolint:errcheck
	h(context.Background(), transport.RPCMethod(99), transport.RPCMeta{}, nil) //nolint:errcheck
	r.ObserveFramedClient(transport.MethodReplicate, time.Now(), connect.NewError(connect.CodeUnavailable, errors.New("gone")))
	r.ObserveFramedClient(transport.MethodRaftHeartbeats, time.Now(), nil)

	calls := func(end, service, method, via, code string) float64 {
		s := sideServer
		if end == "client" {
			s = sideClient
		}
		return testutil.ToFloat64(r.calls[s].WithLabelValues(service, method, via, code))
	}
	for _, c := range []struct {
		side, service, method, via, code string
		want                             float64
	}{
		{"server", "norn.v1.TaskService", "Claim", "connect", "ok", 2},
		{"server", "norn.v1.TaskService", "Claim", "connect", "failed_precondition", 1},
		{"server", "norn.v1.TaskService", "Claim", "connect", "deadline_exceeded", 1},
		{"client", "norn.v1.PeerService", "Read", "connect", "ok", 1},
		{"server", "norn.v1.TaskService", "Claim", "framed", "ok", 1},
		{"server", "norn.v1.QueueService", "SetQueue", "connect", "permission_denied", 1},
		{"server", "unknown", "unknown", "framed", "ok", 1},
		{"client", "norn.v1.PeerService", "Replicate", "framed", "unavailable", 1},
		{"client", ServiceRaft, "Heartbeats", "framed", "ok", 1},
	} {
		if got := calls(c.side, c.service, c.method, c.via, c.code); got != c.want {
			t.Errorf("%s %s/%s %s %s: %v calls, want %v", c.side, c.service, c.method, c.via, c.code, got, c.want)
		}
	}
	// Only what was called has series.
	if n := testutil.CollectAndCount(r.calls[sideServer]); n != 6 {
		t.Errorf("%d server call series, want 6", n)
	}
	if n := testutil.CollectAndCount(r.duration[sideServer]); n != 4 {
		t.Errorf("%d server latency series, want 4", n)
	}
}

// BenchmarkRPCInterceptor is the interceptor's cost per call, once the
// series exist (the connect side and the framed side).
func BenchmarkRPCInterceptor(b *testing.B) {
	r := NewRPC(prometheus.NewRegistry())
	next := func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) { return nil, nil }
	wrapped := r.Interceptor().WrapUnary(next)
	var req connect.AnyRequest = serverRequest{connect.NewRequest(&nornv1.ClaimRequest{}), connect.Spec{Procedure: nornv1connect.TaskServiceClaimProcedure}}
	ctx := context.Background()
	b.Run("connect", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			wrapped(ctx, req) //nolint:errcheck
		}
	})
	h := r.FramedServer(func(context.Context, transport.RPCMethod, transport.RPCMeta, []byte) ([]byte, error) { return nil, nil })
	b.Run("framed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h(ctx, transport.MethodClaim, transport.RPCMeta{}, nil) //nolint:errcheck
		}
	})
	b.Run("framed-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				h(ctx, transport.MethodClaim, transport.RPCMeta{}, nil) //nolint:errcheck
			}
		})
	})
}

// BenchmarkTaskEvents is the cost of one task event of a known queue.
func BenchmarkTaskEvents(b *testing.B) {
	tasks := NewTasks(prometheus.NewRegistry())
	b.ReportAllocs()
	for b.Loop() {
		tasks.Completed("mail")
	}
}

// The latency histograms are native histograms with the classic buckets
// as well (a protobuf scrape carries both).
func TestRPCHistogramsNativeAndClassic(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRPC(reg)
	r.ObserveFramedClient(transport.MethodReplicate, time.Now().Add(-3*time.Millisecond), nil)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "norn_rpc_client_duration_seconds" {
			continue
		}
		h := f.GetMetric()[0].GetHistogram()
		if h.Schema == nil || len(h.GetPositiveSpan()) == 0 || len(h.GetPositiveDelta()) == 0 {
			t.Errorf("no native buckets: %v", h)
		}
		if len(h.GetBucket()) != len(rpcBuckets) || h.GetSampleCount() != 1 {
			t.Errorf("classic buckets %d (want %d), count %d", len(h.GetBucket()), len(rpcBuckets), h.GetSampleCount())
		}
		return
	}
	t.Fatal("no norn_rpc_client_duration_seconds")
}
