package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/norn-dev/norn/node"
	"github.com/norn-dev/norn/tracing"
)

// newLogger returns nornd's logger: format "text" or "json", at the
// levels of spec ("info", or "info,dispatch=debug,antientropy=warn": a
// default level, then levels of node.LogComponents).
func newLogger(w io.Writer, format, spec string) (*slog.Logger, error) {
	levels, err := parseLogLevels(spec)
	if err != nil {
		return nil, fmt.Errorf("-log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: slog.LevelDebug} // componentHandler filters
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("-log-format %q: want text or json", format)
	}
	// A line logged while a traced request is handled carries its
	// trace_id and span_id.
	h = tracing.LogHandler(h)
	return slog.New(&componentHandler{inner: h, levels: levels, level: levels.def}), nil
}

// logLevels are a default level and levels by component.
type logLevels struct {
	def  slog.Level
	byOf map[string]slog.Level
}

// parseLogLevels parses -log-level: comma-separated entries, each a level
// (the default, at most once) or component=level.
func parseLogLevels(spec string) (*logLevels, error) {
	l := &logLevels{def: slog.LevelInfo, byOf: map[string]slog.Level{}}
	sawDefault := false
	for entry := range strings.SplitSeq(spec, ",") {
		entry = strings.TrimSpace(entry)
		comp, lvl, named := strings.Cut(entry, "=")
		if !named {
			comp, lvl = "", entry
		}
		var level slog.Level
		if err := level.UnmarshalText([]byte(lvl)); err != nil {
			return nil, fmt.Errorf("%q: %v", entry, err)
		}
		switch {
		case !named && sawDefault:
			return nil, fmt.Errorf("%q: a second default level", entry)
		case !named:
			l.def, sawDefault = level, true
		case !slices.Contains(node.LogComponents, comp):
			return nil, fmt.Errorf("%q: unknown component %q (components: %s)", entry, comp, componentList())
		default:
			l.byOf[comp] = level
		}
	}
	return l, nil
}

// componentList is node.LogComponents for messages.
func componentList() string { return strings.Join(node.LogComponents, ", ") }

// componentHandler drops records below the level of the component its
// logger was made for (the attribute node.LogComponentKey, given with
// Logger.With), or below the default level.
type componentHandler struct {
	inner  slog.Handler
	levels *logLevels
	level  slog.Level // of this handler's component
}

func (h *componentHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *componentHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.inner.Handle(ctx, r)
}

func (h *componentHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	level := h.level
	for _, a := range attrs {
		if a.Key != node.LogComponentKey {
			continue
		}
		if l, ok := h.levels.byOf[a.Value.String()]; ok {
			level = l
		}
	}
	return &componentHandler{inner: h.inner.WithAttrs(attrs), levels: h.levels, level: level}
}

func (h *componentHandler) WithGroup(name string) slog.Handler {
	return &componentHandler{inner: h.inner.WithGroup(name), levels: h.levels, level: h.level}
}
