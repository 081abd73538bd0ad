package jepsen

import (
	"encoding/json"
	"os"
	"sync"
	"time"

	"github.com/norn-dev/norn/jepsen/check"
)

// Event is one entry of the fault timeline.
type Event struct {
	T      int64  `json:"t_ns"` // harness monotonic time
	Wall   string `json:"wall"`
	Kind   string `json:"kind"` // start or end of a fault, or a note
	Fault  string `json:"fault"`
	Detail string `json:"detail,omitempty"`
	Err    string `json:"error,omitempty"`
}

// Timeline is the log of faults.
type Timeline struct {
	mu     sync.Mutex
	h      *check.History
	events []Event
	logf   func(string, ...any)
}

// Log records an event.
func (tl *Timeline) Log(kind, fault, detail string, err error) {
	e := Event{T: tl.h.Now(), Wall: time.Now().UTC().Format(time.RFC3339Nano), Kind: kind, Fault: fault, Detail: detail}
	if err != nil {
		e.Err = err.Error()
	}
	tl.mu.Lock()
	tl.events = append(tl.events, e)
	tl.mu.Unlock()
	if tl.logf != nil {
		tl.logf("%7.2fs %-5s %-16s %s %s", float64(e.T)/1e9, kind, fault, detail, e.Err)
	}
}

// Events returns a copy of the timeline.
func (tl *Timeline) Events() []Event {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]Event(nil), tl.events...)
}

// FirstFault is the time of the first fault start, or -1.
func (tl *Timeline) FirstFault() int64 {
	for _, e := range tl.Events() {
		if e.Kind == "start" {
			return e.T
		}
	}
	return -1
}

// WriteJSONLines writes the timeline.
func (tl *Timeline) WriteJSONLines(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, e := range tl.Events() {
		enc.Encode(e)
	}
	return f.Close()
}
