package tracing

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// The attributes LogHandler adds to a log line written under a span.
const (
	LogTraceIDKey = "trace_id"
	LogSpanIDKey  = "span_id"
)

// LogHandler wraps h so that a record logged with a context that holds a
// span context (Logger.InfoContext(ctx, ...) while handling a traced
// request) carries its trace_id and span_id, as hex, the ids a tracing
// backend shows. Other records pass through unchanged. It reads the span
// context whatever the tracer provider, so the ids of a caller's trace
// are logged even when this node exports no spans.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ inner slog.Handler }

func (h logHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String(LogTraceIDKey, sc.TraceID().String()), slog.String(LogSpanIDKey, sc.SpanID().String()))
	}
	return h.inner.Handle(ctx, r)
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{h.inner.WithAttrs(attrs)}
}

func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.inner.WithGroup(name)} }
