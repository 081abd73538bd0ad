package crdt

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Clock reads wall time. Production code passes SystemClock; tests and the
// jepsen harness pass a clock with an offset or a rate.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Timestamp is a hybrid logical clock reading: physical milliseconds since
// the Unix epoch, a logical counter that orders events within one
// millisecond, and the id of the node that produced it, which makes every
// timestamp unique and the order total.
type Timestamp struct {
	WallMs  int64  // physical part, Unix milliseconds
	Logical uint32 // logical counter within WallMs
	Node    uint32 // producing node; breaks ties
}

// Compare returns -1, 0 or +1 as t is before, equal to or after u, ordering by
// WallMs, then Logical, then Node.
func (t Timestamp) Compare(u Timestamp) int {
	switch {
	case t.WallMs < u.WallMs:
		return -1
	case t.WallMs > u.WallMs:
		return 1
	case t.Logical < u.Logical:
		return -1
	case t.Logical > u.Logical:
		return 1
	case t.Node < u.Node:
		return -1
	case t.Node > u.Node:
		return 1
	}
	return 0
}

// Less reports whether t is before u.
func (t Timestamp) Less(u Timestamp) bool { return t.Compare(u) < 0 }

// IsZero reports whether t is the zero timestamp.
func (t Timestamp) IsZero() bool { return t == Timestamp{} }

// Time returns the physical part as a time.Time.
func (t Timestamp) Time() time.Time { return time.UnixMilli(t.WallMs) }

func (t Timestamp) String() string {
	return fmt.Sprintf("%d.%d@%d", t.WallMs, t.Logical, t.Node)
}

// ErrClockJump is returned by HLC.Update when a remote timestamp is further
// ahead of the local wall clock than the HLC's MaxForwardJump allows. The
// local clock is not advanced; the caller should count it and may refuse the
// message that carried the timestamp.
var ErrClockJump = errors.New("crdt: remote timestamp too far ahead of local clock")

// HLC is a hybrid logical clock (Kulkarni et al.). It is safe for concurrent
// use. Readings from one HLC strictly increase, and a reading taken after
// Update(r) is after r.
type HLC struct {
	clock Clock
	node  uint32
	// maxJump bounds how far a remote reading may pull this clock ahead of
	// its wall time; zero means unbounded.
	maxJump time.Duration

	mu   sync.Mutex
	last Timestamp
}

// NewHLC returns an HLC for node reading wall time from clock.
func NewHLC(clock Clock, node uint32) *HLC {
	return &HLC{clock: clock, node: node}
}

// SetMaxForwardJump bounds how far ahead of the local wall clock Update
// accepts a remote timestamp (zero: unbounded). Typically max_clock_offset.
func (h *HLC) SetMaxForwardJump(d time.Duration) {
	h.mu.Lock()
	h.maxJump = d
	h.mu.Unlock()
}

// Now returns a timestamp after every timestamp this HLC returned or was
// updated with before.
func (h *HLC) Now() Timestamp {
	wall := h.clock.Now().UnixMilli()
	h.mu.Lock()
	defer h.mu.Unlock()
	if wall > h.last.WallMs {
		h.last = Timestamp{WallMs: wall, Node: h.node}
	} else {
		h.last = h.tick(h.last)
	}
	return h.last
}

// Update folds a timestamp received from another node into the clock and
// returns a new local timestamp after both remote and every earlier local
// reading. It returns ErrClockJump (and leaves the clock alone) when remote
// is more than the max forward jump ahead of the local wall clock.
func (h *HLC) Update(remote Timestamp) (Timestamp, error) {
	wall := h.clock.Now().UnixMilli()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.maxJump > 0 && remote.WallMs-wall > h.maxJump.Milliseconds() {
		return Timestamp{}, fmt.Errorf("%w: remote %s, local wall %d ms, max jump %s",
			ErrClockJump, remote, wall, h.maxJump)
	}
	max := h.last
	if remote.WallMs > max.WallMs || (remote.WallMs == max.WallMs && remote.Logical > max.Logical) {
		max = Timestamp{WallMs: remote.WallMs, Logical: remote.Logical}
	}
	if wall > max.WallMs {
		h.last = Timestamp{WallMs: wall, Node: h.node}
	} else {
		h.last = h.tick(max)
	}
	return h.last, nil
}

// Last returns the latest timestamp issued, without advancing the clock.
func (h *HLC) Last() Timestamp {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// tick advances the logical counter of t, carrying into the physical part
// on overflow (which needs 2^32 events in one millisecond).
func (h *HLC) tick(t Timestamp) Timestamp {
	if t.Logical == ^uint32(0) {
		return Timestamp{WallMs: t.WallMs + 1, Node: h.node}
	}
	return Timestamp{WallMs: t.WallMs, Logical: t.Logical + 1, Node: h.node}
}
