package tracing

import (
	"context"
	"strings"

	"connectrpc.com/connect"
	"connectrpc.com/otelconnect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/transport"
)

// ScopeName is the instrumentation scope of the spans this package makes
// (the framed calls' server spans).
const ScopeName = "github.com/norn-dev/norn/tracing"

// Propagator is how trace context travels in connect calls' HTTP headers:
// W3C traceparent and tracestate.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// RPCSystemFramed is the rpc.system.name attribute of a framed call's
// span (connect calls have otelconnect's: grpc or connect_rpc).
const RPCSystemFramed = "norn_framed"

// The attributes of a framed call's span, as otelconnect names them for
// connect calls (OpenTelemetry's RPC semantic conventions).
const (
	attrRPCSystem = attribute.Key("rpc.system.name")
	attrRPCMethod = attribute.Key("rpc.method")
	attrRPCStatus = attribute.Key("rpc.response.status_code")
)

// Interceptor returns the connect interceptor that traces calls with tp:
// a server span per call served (the caller's trace context, when it
// sent one, is its parent) and a client span per call made, whose
// context the call carries. It is otelconnect's, without its metrics
// (the node's are Prometheus'). Put it after the RPC metrics' interceptor.
func Interceptor(tp trace.TracerProvider) (connect.Interceptor, error) {
	return otelconnect.NewInterceptor(
		otelconnect.WithTracerProvider(tp),
		otelconnect.WithPropagator(Propagator),
		otelconnect.WithTrustRemote(),
		otelconnect.WithoutMetrics(),
	)
}

// framedSpan is what FramedServer knows of one framed method.
type framedSpan struct {
	name  string // the span name: the procedure without its leading "/"
	attrs []attribute.KeyValue
	peer  bool // a PeerService method: traced only when the caller traced it
}

// FramedServer wraps the handler of framed calls to trace them with tp as
// Interceptor traces connect calls: a server span named by the method's
// procedure ("norn.v1.TaskService/Enqueue"), a child of the caller's span
// when the call carried its trace context (transport.RPCMeta.Trace). A
// node-to-node call (Replicate) is traced only when its caller traced it,
// so that untraced work makes no root spans; the Raft calls never are.
func FramedServer(tp trace.TracerProvider, h transport.RPCHandler) transport.RPCHandler {
	tr := tp.Tracer(ScopeName)
	var spans [256]*framedSpan
	for m := range spans {
		proc := transport.RPCMethod(m).Procedure()
		if proc == "" {
			continue
		}
		name := strings.TrimPrefix(proc, "/")
		spans[m] = &framedSpan{
			name:  name,
			attrs: []attribute.KeyValue{attrRPCSystem.String(RPCSystemFramed), attrRPCMethod.String(name)},
			peer:  strings.HasPrefix(name, nornv1connect.PeerServiceName+"/"),
		}
	}
	return func(ctx context.Context, m transport.RPCMethod, meta transport.RPCMeta, body []byte) ([]byte, error) {
		s := spans[m]
		if s == nil || (s.peer && !meta.Trace.IsValid()) {
			return h(ctx, m, meta, body)
		}
		ctx, span := tr.Start(ctx, s.name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(s.attrs...))
		out, err := h(ctx, m, meta, body)
		status := "OK"
		if err != nil {
			status = transport.ErrorType(err)
		}
		span.SetAttributes(attrRPCStatus.String(status))
		transport.EndSpan(span, err)
		return out, err
	}
}
