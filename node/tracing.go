package node

import (
	"fmt"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"

	"github.com/norn-dev/norn/tracing"
	"github.com/norn-dev/norn/transport"
)

// nodeTracing is what the node hands its parts for tracing: with
// Config.TracerProvider nil (tracing off, the default) every field is nil
// or empty, so no part starts a span and no call is wrapped.
type nodeTracing struct {
	tp           trace.TracerProvider
	interceptors []connect.Interceptor // after the RPC metrics' interceptor
}

func newNodeTracing(tp trace.TracerProvider) (*nodeTracing, error) {
	t := &nodeTracing{tp: tp}
	if tp == nil {
		return t, nil
	}
	ic, err := tracing.Interceptor(tp)
	if err != nil {
		return nil, fmt.Errorf("node: tracing: %w", err)
	}
	t.interceptors = []connect.Interceptor{ic}
	return t, nil
}

// tracer is the tracer of a part (its import path as the instrumentation
// scope), nil when tracing is off.
func (t *nodeTracing) tracer(pkg string) trace.Tracer {
	if t.tp == nil {
		return nil
	}
	return t.tp.Tracer("github.com/norn-dev/norn/" + pkg)
}

// framed wraps a framed-call handler to trace it (tracing.FramedServer),
// or returns it as it is when tracing is off.
func (t *nodeTracing) framed(h transport.RPCHandler) transport.RPCHandler {
	if t.tp == nil {
		return h
	}
	return tracing.FramedServer(t.tp, h)
}
