package client

import (
	"context"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// traceContext is the client interceptor that makes a producer's trace
// continue into Norn: a call whose context holds a span context (the
// caller's OpenTelemetry span) sends it as W3C traceparent and tracestate
// headers, and the node's span for the call is its child. A call without
// one sends nothing and costs one context lookup. Framed calls carry it
// in their header (transport.RPCMeta.Trace). For a client span of its
// own around each call, add otelconnect's interceptor with
// WithConnectOptions (it then sends its span's context instead; framed
// calls are off with WithConnectOptions).
type traceContext struct{}

func (traceContext) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient && trace.SpanContextFromContext(ctx).IsValid() {
			propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header()))
		}
		return next(ctx, req)
	}
}

func (traceContext) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if trace.SpanContextFromContext(ctx).IsValid() {
			propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(conn.RequestHeader()))
		}
		return conn
	}
}

func (traceContext) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
