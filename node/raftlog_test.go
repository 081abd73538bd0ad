package node

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// logRecords is a slog handler that keeps every record.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
	with []slog.Attr
}

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.with...)
	h.mu.Lock()
	h.recs = append(h.recs, r)
	h.mu.Unlock()
	return nil
}
func (h *logRecords) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRecordsView{h: h, with: as}
}
func (h *logRecords) WithGroup(string) slog.Handler { return h }

// logRecordsView is a logRecords with attributes added.
type logRecordsView struct {
	h    *logRecords
	with []slog.Attr
}

func (v *logRecordsView) Enabled(context.Context, slog.Level) bool { return true }
func (v *logRecordsView) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(v.with...)
	return v.h.Handle(ctx, r)
}
func (v *logRecordsView) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRecordsView{h: v.h, with: append(append([]slog.Attr(nil), v.with...), as...)}
}
func (v *logRecordsView) WithGroup(string) slog.Handler { return v }

// lines returns the records as "LEVEL msg k=v ..." strings.
func (h *logRecords) lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		s := r.Level.String() + " " + r.Message
		r.Attrs(func(a slog.Attr) bool {
			s += " " + a.String()
			return true
		})
		out = append(out, s)
	}
	return out
}

// TestRaftLoggerSummarizesRepeats: a line that every group repeats about
// a peer (raft's "failed to heartbeat to" with one node down) is logged
// once, in slog, with the component and the group; its repeats are one
// summary per window while they go on; a window without them forgets the
// line. Other peers' lines and levels below the logger's are their own.
func TestRaftLoggerSummarizesRepeats(t *testing.T) {
	recs := &logRecords{}
	var timers []func()
	l := newRaftLogger(slog.New(recs), hclog.Warn, repeatWindow, func(_ time.Duration, f func()) *time.Timer {
		timers = append(timers, f)
		return nil
	})
	fire := func() {
		fs := timers
		timers = nil
		for _, f := range fs {
			f()
		}
	}
	for round := range 3 {
		for p := range 64 {
			l.Named(fmt.Sprintf("p%d", p)).Error("failed to heartbeat to", "peer", "127.0.0.1:7411", "backoff time", time.Duration(round)*time.Millisecond)
		}
	}
	l.Named("p1").Error("failed to heartbeat to", "peer", "127.0.0.1:7421")
	l.Named("p1").Debug("below the level")
	got := recs.lines()
	if len(got) != 2 || !strings.Contains(got[0], "ERROR failed to heartbeat to peer=127.0.0.1:7411") ||
		!strings.Contains(got[0], "logger=raft.p0") || !strings.Contains(got[0], "component=raft") || !strings.Contains(got[1], "peer=127.0.0.1:7421") {
		t.Fatalf("first lines: %q", got)
	}
	fire()
	got = recs.lines()
	if len(got) != 3 || !strings.Contains(got[2], "ERROR failed to heartbeat to (repeated) repeats=191 within=10s loggers=64") {
		t.Fatalf("after the window: %q", got)
	}
	fire() // a window without repeats: the line is forgotten
	if got := recs.lines(); len(got) != 3 || len(timers) != 0 {
		t.Fatalf("a quiet window logged %q, left %d timers", got[3:], len(timers))
	}
	l.Named("p2").Error("failed to heartbeat to", "peer", "127.0.0.1:7411")
	if got := recs.lines(); len(got) != 4 || !strings.Contains(got[3], "logger=raft.p2") {
		t.Fatalf("after it was forgotten: %q", got)
	}
}

// TestRaftLoggerStandardWriter: memberlist's standard-logger lines come at
// the level their prefix names, repeats (differing in their numbers) are
// counted, and lines below the level are dropped.
func TestRaftLoggerStandardWriter(t *testing.T) {
	recs := &logRecords{}
	l := newRaftLogger(slog.New(recs), hclog.Info, repeatWindow, func(time.Duration, func()) *time.Timer { return nil })
	w := l.Named("gossip").StandardWriter(&hclog.StandardLoggerOptions{InferLevels: true})
	fmt.Fprintln(w, "[WARN] memberlist: Failed to send ping to 127.0.0.1:7412: i/o timeout")
	fmt.Fprintln(w, "[WARN] memberlist: Failed to send ping to 127.0.0.1:7413: i/o timeout")
	fmt.Fprintln(w, "[DEBUG] memberlist: Stream connection from=127.0.0.1:5000")
	fmt.Fprintln(w, "[ERR] memberlist: Push/Pull failed")
	got := recs.lines()
	if len(got) != 2 || !strings.HasPrefix(got[0], "WARN memberlist: Failed to send ping to 127.0.0.1:7412") ||
		!strings.Contains(got[0], "logger=raft.gossip") || !strings.HasPrefix(got[1], "ERROR memberlist: Push/Pull failed") {
		t.Fatalf("lines: %q", got)
	}
}

// TestRaftLogRateWithANodeDown: with one of three nodes stopped, the
// other two log raft's and memberlist's complaints about it as a few
// lines, not a flood (hashicorp/raft alone writes about 100 a second:
// every group fails to heartbeat the peer several times a second).
func TestRaftLogRateWithANodeDown(t *testing.T) {
	recs := &logRecords{}
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		cfg.RaftLogger = nil // the default: NewRaftLogger(Logger, warn)
		if i < 2 {
			cfg.Logger = slog.New(recs).With("node", cfg.NodeID)
		}
	})
	ms[2].stop()
	start := len(recs.lines())
	const watch = 3 * time.Second
	time.Sleep(watch) // the rate is what is measured: lines over a span of time
	var raft []string
	for _, l := range recs.lines()[start:] {
		if strings.Contains(l, "component=raft") {
			raft = append(raft, l)
		}
	}
	t.Logf("%d raft and gossip lines in %s from the two nodes left:\n%s", len(raft), watch, strings.Join(raft, "\n"))
	if len(raft) > 40 {
		t.Fatalf("%d raft and gossip lines in %s:\n%s", len(raft), watch, strings.Join(raft, "\n"))
	}
	if len(raft) == 0 {
		t.Fatalf("no raft or gossip line in %s about the stopped node", watch)
	}
}
