package crdt

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Spec is the immutable part of a task, written once at enqueue.
type Spec struct {
	Queue       string   // 1-128 bytes of [A-Za-z0-9._:-]
	Priority    int32    // higher is claimed first
	Payload     []byte   // opaque; size limited by Limits
	NotBeforeMs int64    // Unix ms before which the task is not claimable; 0 = none
	DependsOn   []uint64 // ids that must be COMPLETED first; no duplicates
	MaxClaims   uint32   // claims ended by expiry before the task is aborted; 0 = unlimited
	CreatedAt   Timestamp
	Retry       *RetryPolicy // TaskSpec.retry; nil when the task has none
	// DeadlineMs is TaskSpec.deadline, Unix ms: a task not completed by
	// then ends CANCELLED with the error code "deadline"; 0 = none.
	DeadlineMs int64
	// UniqueKey is TaskSpec.unique_key ("": none): the task held the key
	// in its queue when it was enqueued (docs/SCHEDULING.md).
	UniqueKey string
	// UniqueForMs is TaskSpec.unique_for in ms (0: until the task is
	// finished); only with a UniqueKey.
	UniqueForMs int64
	// FairnessKey is TaskSpec.fairness_key ("": none), and FairnessWeight
	// its weight (0: 1): claims serve a queue's keys in turn
	// (docs/SCHEDULING.md, "Fair claims").
	FairnessKey    string
	FairnessWeight uint32
}

// Update is one progress report of a worker, keyed by (Claim, Seq).
type Update struct {
	Claim    uint64    // claim id (Raft index of the claim entry)
	Seq      uint64    // per-claim sequence number chosen by the worker
	At       Timestamp // HLC of the update
	Progress float64   // 0..1
	Message  string
	Data     []byte
}

// TerminalKind says how a task ended. The numeric order is the tie-break
// between terminal events with equal timestamps.
type TerminalKind uint8

// Terminal kinds.
const (
	Completed TerminalKind = 1
	Aborted   TerminalKind = 2
	Cancelled TerminalKind = 3
	// Dead: the task failed its last allowed attempt (its retry policy's
	// max attempts); written by the partition's claim state machine.
	Dead TerminalKind = 4
)

func (k TerminalKind) String() string {
	switch k {
	case Completed:
		return "COMPLETED"
	case Aborted:
		return "ABORTED"
	case Cancelled:
		return "CANCELLED"
	case Dead:
		return "DEAD"
	}
	return fmt.Sprintf("TerminalKind(%d)", uint8(k))
}

func (k TerminalKind) valid() bool { return k >= Completed && k <= Dead }

// TaskError is one entry of an abort's error list.
type TaskError struct {
	Code        string
	Description string
	Args        []string
}

// Terminal is a terminal event: a completion, abort, cancel or death.
// Events are keyed by (At, Kind, Claim, Life); the smallest key of the
// task's current life is the visible outcome.
type Terminal struct {
	At     Timestamp
	Kind   TerminalKind
	Claim  uint64 // claim that ended the task; 0 for a cancel
	Errors []TaskError
	Result []byte
	// Life is the life of the task the event ends: 0 for its first, L
	// for the one a Revival of life L began (Task.Life).
	Life uint32
}

// Revival begins a new life of a terminal task (a Retry of a dead,
// aborted or cancelled task): its terminal events of earlier lives no
// longer decide its status. Revivals are keyed by Life (1, 2, ...), each
// decided once by the task's partition leader.
type Revival struct {
	Life uint32 // the life it begins; at least 1
	At   Timestamp
}

// Failure is one failed attempt of a task that is retried (or died of
// it): a retryable abort by its worker, with the worker's errors, or a
// lease that ran out (Expired). Failures are keyed by Claim.
type Failure struct {
	Claim   uint64 // the claim whose attempt failed; never 0
	At      Timestamp
	Expired bool // the lease ran out (the worker said nothing)
	Errors  []TaskError
}

// Task is the CRDT state of one task. Updates are kept sorted by (Claim,
// Seq) and Terminals by (At, Kind, Claim), each key at most once; Join,
// Decode and Normalize keep that form, and Encode requires it.
//
// Byte slices in a Task are treated as immutable: Join's result may share
// them with its inputs.
type Task struct {
	ID        uint64
	Spec      *Spec // nil when this replica has not seen the enqueue yet
	Updates   []Update
	Terminals []Terminal
	Failures  []Failure // sorted by Claim, each Claim once
	Revivals  []Revival // sorted by Life, each Life once
}

// ErrIDMismatch is returned by Join for states of different tasks.
var ErrIDMismatch = errors.New("crdt: join of different task ids")

// Join returns the least upper bound of a and b. The result is a new Task;
// a and b are not modified. specConflict reports that a and b held
// different specs (corruption, or an id reused with a different spec); the
// spec with the lowest digest wins, deterministically.
func Join(a, b *Task) (j *Task, specConflict bool, err error) {
	if a.ID != b.ID {
		return nil, false, fmt.Errorf("%w: %d and %d", ErrIDMismatch, a.ID, b.ID)
	}
	j = &Task{ID: a.ID}
	switch {
	case a.Spec == nil:
		j.Spec = b.Spec
	case b.Spec == nil:
		j.Spec = a.Spec
	default:
		ea, eb := appendSpec(nil, a.Spec), appendSpec(nil, b.Spec)
		j.Spec = a.Spec
		if !bytes.Equal(ea, eb) {
			specConflict = true
			if lessByDigest(eb, ea) {
				j.Spec = b.Spec
			}
		}
	}
	j.Updates = normalizeUpdates(slices.Concat(a.Updates, b.Updates))
	j.Terminals = normalizeTerminals(slices.Concat(a.Terminals, b.Terminals))
	j.Failures = normalizeFailures(slices.Concat(a.Failures, b.Failures))
	j.Revivals = normalizeRevivals(slices.Concat(a.Revivals, b.Revivals))
	return j, specConflict, nil
}

// lessByDigest orders two encodings by digest, then bytes (so that the order
// is total even on a hash collision).
func lessByDigest(x, y []byte) bool {
	dx, dy := Digest(x), Digest(y)
	if dx != dy {
		return dx < dy
	}
	return bytes.Compare(x, y) < 0
}

// Normalize puts t into canonical form in place: sets sorted, duplicate keys
// resolved exactly as Join resolves them. Call it after building a Task by
// hand with more than one update or terminal event.
func (t *Task) Normalize() {
	t.Updates = normalizeUpdates(t.Updates)
	t.Terminals = normalizeTerminals(t.Terminals)
	t.Failures = normalizeFailures(t.Failures)
	t.Revivals = normalizeRevivals(t.Revivals)
}

// Terminal returns the event that decides the task's terminal state: the
// earliest by (At, Kind, Claim) of its current life (Life). ok is false
// while the task is not terminal in it.
func (t *Task) Terminal() (ev Terminal, ok bool) {
	if len(t.Terminals) == 0 {
		return Terminal{}, false
	}
	life := t.Life()
	if life == 0 {
		return t.Terminals[0], true // one life: every task never retried
	}
	for _, ev := range t.Terminals {
		if ev.Life == life {
			return ev, true
		}
	}
	return Terminal{}, false
}

// Life is the task's current life: the highest life of its revivals and
// of its terminal events (an event of life L shows that L began, even
// before its revival arrives), 0 while it has none.
func (t *Task) Life() uint32 {
	var l uint32
	for _, r := range t.Revivals {
		l = max(l, r.Life)
	}
	for _, ev := range t.Terminals {
		l = max(l, ev.Life)
	}
	return l
}

// LastUpdate returns the update with the greatest (Claim, Seq), the one whose
// progress the task shows. ok is false when there are none.
func (t *Task) LastUpdate() (u Update, ok bool) {
	if len(t.Updates) == 0 {
		return Update{}, false
	}
	return t.Updates[len(t.Updates)-1], true
}

func compareUpdateKey(x, y *Update) int {
	if c := cmp.Compare(x.Claim, y.Claim); c != 0 {
		return c
	}
	return cmp.Compare(x.Seq, y.Seq)
}

func compareTerminalKey(x, y *Terminal) int {
	if c := x.At.Compare(y.At); c != 0 {
		return c
	}
	if c := cmp.Compare(x.Kind, y.Kind); c != 0 {
		return c
	}
	if c := cmp.Compare(x.Claim, y.Claim); c != 0 {
		return c
	}
	return cmp.Compare(x.Life, y.Life)
}

// normalizeUpdates sorts by key and keeps one entry per key: the one with
// the smallest encoding, so that the choice does not depend on order.
func normalizeUpdates(us []Update) []Update {
	if len(us) == 0 {
		return nil
	}
	slices.SortFunc(us, func(x, y Update) int {
		if c := compareUpdateKey(&x, &y); c != 0 {
			return c
		}
		return bytes.Compare(appendUpdate(nil, &x), appendUpdate(nil, &y))
	})
	return slices.CompactFunc(us, func(x, y Update) bool { return compareUpdateKey(&x, &y) == 0 })
}

// normalizeTerminals is normalizeUpdates for terminal events.
func normalizeTerminals(ts []Terminal) []Terminal {
	if len(ts) == 0 {
		return nil
	}
	slices.SortFunc(ts, func(x, y Terminal) int {
		if c := compareTerminalKey(&x, &y); c != 0 {
			return c
		}
		return bytes.Compare(appendTerminal(nil, &x), appendTerminal(nil, &y))
	})
	return slices.CompactFunc(ts, func(x, y Terminal) bool { return compareTerminalKey(&x, &y) == 0 })
}

// normalizeFailures is normalizeUpdates for failures, keyed by claim.
func normalizeFailures(fs []Failure) []Failure {
	if len(fs) == 0 {
		return nil
	}
	slices.SortFunc(fs, func(x, y Failure) int {
		if c := cmp.Compare(x.Claim, y.Claim); c != 0 {
			return c
		}
		return bytes.Compare(appendFailure(nil, &x), appendFailure(nil, &y))
	})
	return slices.CompactFunc(fs, func(x, y Failure) bool { return x.Claim == y.Claim })
}

// normalizeRevivals is normalizeUpdates for revivals, keyed by life.
func normalizeRevivals(rs []Revival) []Revival {
	if len(rs) == 0 {
		return nil
	}
	slices.SortFunc(rs, func(x, y Revival) int {
		if c := cmp.Compare(x.Life, y.Life); c != 0 {
			return c
		}
		return x.At.Compare(y.At)
	})
	return slices.CompactFunc(rs, func(x, y Revival) bool { return x.Life == y.Life })
}
