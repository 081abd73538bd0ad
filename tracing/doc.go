// Package tracing sets up OpenTelemetry tracing for a node: the tracer
// provider built from the standard OTEL_* environment variables, the
// connect interceptor that traces the API and PeerService calls (server
// and client side), the wrapper that traces the framed calls, and a slog
// handler that adds the trace and span ids to the log lines written
// while a traced request is handled.
//
// Tracing is off unless the environment asks for it (FromEnv returns a
// nil provider): then the node installs none of this, and the parts
// (coord, claims, dispatch, antientropy) get a nil trace.Tracer and start
// no span, so a request costs what it cost before tracing existed.
//
// Use (cmd/nornd does this; tests pass their own provider):
//
//	tp, err := tracing.FromEnv(os.Getenv, tracing.Resource{Instance: nodeID, Version: v}, os.Stdout)
//	if err != nil { ... }                    // a bad OTEL_* value
//	if tp != nil {
//		defer tp.Shutdown(context.Background()) // flushes the spans still queued
//		cfg.TracerProvider = tp               // node.Config
//	}
//	logger := slog.New(tracing.LogHandler(h)) // trace_id, span_id on traced requests
//
// and inside the node, when the provider is set:
//
//	ic, err := tracing.Interceptor(tp)        // connect handlers and peer clients
//	framed := tracing.FramedServer(tp, h)     // transport.RPCHandler
//
// Trace context crosses node hops as W3C traceparent: in the HTTP
// headers of connect calls (Propagator), in the header of framed calls
// (transport.RPCMeta.Trace) and in the Extensions of a claim's Raft log
// entry (package claims). Incoming trace context is trusted: a caller's
// span is the parent of the node's server span.
//
// The span names and attributes are a stable interface, listed in
// docs/OPERATIONS.md (Tracing); the parts declare their own (coord.SpanWrite,
// claims.SpanPropose, antientropy.SpanRound, ...).
package tracing
