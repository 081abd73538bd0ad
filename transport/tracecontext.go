package transport

import (
	"strings"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The W3C trace context (traceparent) in binary form, as framed calls
// (a traced request frame, see encodeRequest) and claim entries (the Raft
// log entry's Extensions, package claims) carry it: a version byte (0),
// the trace id (16 bytes), the parent span id (8 bytes) and the trace
// flags (1 byte; bit 0: sampled). The text form
// "00-<trace id>-<span id>-<flags>" of the traceparent header says the
// same in 55 bytes. tracestate is not carried.

// TraceContextLen is the length of a binary trace context.
const TraceContextLen = 1 + 16 + 8 + 1

// traceContextVersion is the only version written and read; a reader
// ignores a trace context of another version (a later writer's).
const traceContextVersion = 0

// AppendTraceContext appends sc's binary trace context to b.
func AppendTraceContext(b []byte, sc trace.SpanContext) []byte {
	tid, sid := sc.TraceID(), sc.SpanID()
	b = append(b, traceContextVersion)
	b = append(b, tid[:]...)
	b = append(b, sid[:]...)
	return append(b, byte(sc.TraceFlags()))
}

// ParseTraceContext reads a binary trace context from the start of b (what
// follows is ignored, for later versions to extend). It reports false,
// and never panics, when b is shorter, of another version, or names a
// zero trace or span id. The span context is marked remote.
func ParseTraceContext(b []byte) (trace.SpanContext, bool) {
	if len(b) < TraceContextLen || b[0] != traceContextVersion {
		return trace.SpanContext{}, false
	}
	var tid trace.TraceID
	var sid trace.SpanID
	copy(tid[:], b[1:17])
	copy(sid[:], b[17:25])
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    tid,
		SpanID:     sid,
		TraceFlags: trace.TraceFlags(b[25]) & trace.FlagsSampled,
		Remote:     true,
	})
	return sc, sc.IsValid()
}

// EndSpan ends span, marking it failed when err is not nil: status Error
// with err's message, and error.type its connect code as gRPC names it
// (UNAVAILABLE), as otelconnect marks a failed call. How the parts end the
// spans they start.
func EndSpan(span trace.Span, err error) {
	if err != nil {
		span.SetAttributes(attribute.String("error.type", ErrorType(err)))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// ErrorType is err's connect code as gRPC names it ("UNAVAILABLE"), the
// error.type and rpc.response.status_code of a failed call's span.
func ErrorType(err error) string { return strings.ToUpper(connect.CodeOf(err).String()) }
