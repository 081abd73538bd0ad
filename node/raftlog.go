package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// NewRaftLogger returns the logger hashicorp/raft and memberlist log
// through (Config.RaftLogger): their lines go to l (with the component
// "raft", and "logger" naming the group, as raft.p25) at level and above,
// in the node's own format and levels. A line that repeats (the same
// message about the same peer, from any group: with a peer down, each of
// a node's groups fails to heartbeat it several times a second) is logged
// once, then summarized once per repeatWindow while it goes on ("repeated
// N times in 10s, from K groups"), not written a hundred times a second.
func NewRaftLogger(l *slog.Logger, level hclog.Level) hclog.Logger {
	return newRaftLogger(l, level, repeatWindow, time.AfterFunc)
}

// repeatWindow is how long a repeated raft or gossip line is counted
// before its summary.
const repeatWindow = 10 * time.Second

// maxRepeatKeys bounds the lines counted at once; past it, lines are
// logged as they come.
const maxRepeatKeys = 1000

func newRaftLogger(l *slog.Logger, level hclog.Level, window time.Duration, after func(time.Duration, func()) *time.Timer) *raftLogger {
	s := &raftLogShared{l: l.With(LogComponentKey, "raft"), window: window, after: after, keys: map[string]*repeat{}}
	s.level.Store(int32(level))
	return &raftLogger{s: s, name: "raft"}
}

// raftLogger is an hclog.Logger over slog (NewRaftLogger).
type raftLogger struct {
	s       *raftLogShared
	name    string
	implied []any
}

// raftLogShared is what every logger derived from one NewRaftLogger
// shares: the output, the level and the repeats being counted.
type raftLogShared struct {
	l      *slog.Logger
	level  atomic.Int32 // an hclog.Level
	window time.Duration
	after  func(time.Duration, func()) *time.Timer

	mu   sync.Mutex
	keys map[string]*repeat
}

// repeat is a line being counted: how often it came again in the current
// window, and from how many loggers (groups).
type repeat struct {
	level   hclog.Level
	msg     string
	count   int
	loggers map[string]bool
}

var _ hclog.Logger = (*raftLogger)(nil)

func (r *raftLogger) Log(level hclog.Level, msg string, args ...any) {
	if level < hclog.Level(r.s.level.Load()) || level == hclog.Off {
		return
	}
	all := append(append([]any(nil), r.implied...), args...)
	r.s.emit(r.name, level, repeatKey(msg, all), msg, all)
}

func (r *raftLogger) Trace(msg string, args ...any) { r.Log(hclog.Trace, msg, args...) }
func (r *raftLogger) Debug(msg string, args ...any) { r.Log(hclog.Debug, msg, args...) }
func (r *raftLogger) Info(msg string, args ...any)  { r.Log(hclog.Info, msg, args...) }
func (r *raftLogger) Warn(msg string, args ...any)  { r.Log(hclog.Warn, msg, args...) }
func (r *raftLogger) Error(msg string, args ...any) { r.Log(hclog.Error, msg, args...) }

func (r *raftLogger) enabled(level hclog.Level) bool { return level >= hclog.Level(r.s.level.Load()) }
func (r *raftLogger) IsTrace() bool                  { return r.enabled(hclog.Trace) }
func (r *raftLogger) IsDebug() bool                  { return r.enabled(hclog.Debug) }
func (r *raftLogger) IsInfo() bool                   { return r.enabled(hclog.Info) }
func (r *raftLogger) IsWarn() bool                   { return r.enabled(hclog.Warn) }
func (r *raftLogger) IsError() bool                  { return r.enabled(hclog.Error) }

func (r *raftLogger) ImpliedArgs() []any { return r.implied }

func (r *raftLogger) With(args ...any) hclog.Logger {
	return &raftLogger{s: r.s, name: r.name, implied: append(append([]any(nil), r.implied...), args...)}
}

func (r *raftLogger) Name() string { return r.name }

func (r *raftLogger) Named(name string) hclog.Logger {
	if r.name != "" {
		name = r.name + "." + name
	}
	return &raftLogger{s: r.s, name: name, implied: r.implied}
}

func (r *raftLogger) ResetNamed(name string) hclog.Logger {
	return &raftLogger{s: r.s, name: name, implied: r.implied}
}

func (r *raftLogger) SetLevel(level hclog.Level) { r.s.level.Store(int32(level)) }
func (r *raftLogger) GetLevel() hclog.Level      { return hclog.Level(r.s.level.Load()) }

func (r *raftLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(r.StandardWriter(opts), "", 0)
}

// StandardWriter takes the lines of a standard library logger (as
// memberlist writes them: "[WARN] memberlist: ..."), each at the level its
// bracketed prefix names (Info without one), or opts.ForceLevel.
func (r *raftLogger) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	force := hclog.NoLevel
	if opts != nil {
		force = opts.ForceLevel
	}
	return &stdLogWriter{r: r, force: force}
}

type stdLogWriter struct {
	r     *raftLogger
	force hclog.Level
}

func (w *stdLogWriter) Write(p []byte) (int, error) {
	for line := range bytes.Lines(p) {
		msg := strings.TrimSpace(string(line))
		if msg == "" {
			continue
		}
		level, rest := inferLevel(msg)
		if w.force != hclog.NoLevel {
			level = w.force
		}
		if level < hclog.Level(w.r.s.level.Load()) {
			continue
		}
		w.r.s.emit(w.r.name, level, digitless(rest), rest, w.r.implied)
	}
	return len(p), nil
}

// inferLevel reads a standard logger line's "[LEVEL] " prefix.
func inferLevel(msg string) (hclog.Level, string) {
	for _, p := range []struct {
		prefix string
		level  hclog.Level
	}{{"[TRACE]", hclog.Trace}, {"[DEBUG]", hclog.Debug}, {"[INFO]", hclog.Info}, {"[WARN]", hclog.Warn}, {"[ERR]", hclog.Error}, {"[ERROR]", hclog.Error}} {
		if rest, ok := strings.CutPrefix(msg, p.prefix); ok {
			return p.level, strings.TrimSpace(rest)
		}
	}
	return hclog.Info, msg
}

// repeatKey is what makes two raft lines the same: the message and the
// peer it is about.
func repeatKey(msg string, args []any) string {
	key := msg
	for i := 0; i+1 < len(args); i += 2 {
		switch args[i] {
		case "peer", "id", "server-id", "address", "from", "target", "node":
			key += fmt.Sprintf("|%v", args[i+1])
		}
	}
	return key
}

// digitless is msg with its digits dropped: a standard logger's line
// names addresses and ports in its text.
func digitless(msg string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}, msg)
}

// slogLevel maps hclog's levels onto slog's.
func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Info:
		return slog.LevelInfo
	case hclog.Warn:
		return slog.LevelWarn
	}
	return slog.LevelError
}

// emit logs a line the first time its key comes in a window, and counts
// it after that; the window's end logs the count (flush).
func (s *raftLogShared) emit(logger string, level hclog.Level, key, msg string, args []any) {
	s.mu.Lock()
	if rep, ok := s.keys[key]; ok {
		rep.count++
		if len(rep.loggers) < 4096 {
			rep.loggers[logger] = true
		}
		s.mu.Unlock()
		return
	}
	if len(s.keys) < maxRepeatKeys {
		s.keys[key] = &repeat{level: level, msg: msg, loggers: map[string]bool{}}
		s.after(s.window, func() { s.flush(key) })
	}
	s.mu.Unlock()
	attrs := make([]any, 0, len(args)+2)
	s.l.Log(context.Background(), slogLevel(level), msg, append(append(attrs, args...), "logger", logger)...)
}

// flush ends key's window: a line that came again is summarized and
// counted for another window; one that did not is forgotten (its next
// occurrence is logged in full).
func (s *raftLogShared) flush(key string) {
	s.mu.Lock()
	rep := s.keys[key]
	if rep == nil || rep.count == 0 {
		delete(s.keys, key)
		s.mu.Unlock()
		return
	}
	count, loggers := rep.count, len(rep.loggers)
	rep.count, rep.loggers = 0, map[string]bool{}
	s.after(s.window, func() { s.flush(key) })
	s.mu.Unlock()
	s.l.Log(context.Background(), slogLevel(rep.level), rep.msg+" (repeated)",
		"repeats", count, "within", s.window.String(), "loggers", loggers)
}
