package claims

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/norn-dev/norn/crdt"
)

// EndReason says how a claim ended. EndNone means it is still live.
type EndReason uint8

// End reasons. Completed, Aborted and Cancelled also mark the task terminal.
const (
	EndNone      EndReason = 0
	EndCompleted EndReason = 1
	EndAborted   EndReason = 2
	EndExpired   EndReason = 3
	EndYielded   EndReason = 4
	EndCancelled EndReason = 5
	// EndFailed: the worker failed the attempt (a retryable abort); the
	// task waits its backoff, or is dead after its last attempt.
	EndFailed EndReason = 6
)

func (r EndReason) String() string {
	switch r {
	case EndNone:
		return "LIVE"
	case EndCompleted:
		return "COMPLETED"
	case EndAborted:
		return "ABORTED"
	case EndExpired:
		return "EXPIRED"
	case EndYielded:
		return "YIELDED"
	case EndCancelled:
		return "CANCELLED"
	case EndFailed:
		return "FAILED"
	}
	return fmt.Sprintf("EndReason(%d)", uint8(r))
}

func (r EndReason) valid() bool { return r <= EndFailed }

// terminal reports whether a task ended this way is done for good.
func (r EndReason) terminal() bool {
	return r == EndCompleted || r == EndAborted || r == EndCancelled
}

// Claim is one claim of a task: granted by a Raft entry whose index is the
// claim's token (its fencing token and claim id).
type Claim struct {
	Token    uint64 // Raft index of the granting entry
	Seq      uint64 // 1, 2, 3... per task, for humans
	Worker   string
	StartMs  int64 // leader's clock at the grant, Unix ms
	ExpiryMs int64 // lease expiry, Unix ms on the leader's clock
	End      EndReason
	EndedMs  int64 // when it ended; 0 while live
}

// HistoryLimit is how many claims a record keeps; older ones are dropped
// (Seq keeps counting).
const HistoryLimit = 64

// Record is the claim FSM's state of one task: its claim history and
// whether it may be claimed again.
type Record struct {
	Seq       uint64    // claims granted so far; the last claim's Seq
	Expired   uint32    // claims ended by expiry (max_claims counts these)
	MaxClaims uint32    // from the task's spec at its first claim; 0 = unlimited
	Terminal  EndReason // set once the task is completed, aborted or cancelled
	// Dead: the FSM ended the task: max_claims expiries reached (the
	// leader then writes its ABORTED event), or, with a retry policy,
	// its last allowed attempt failed (the FSM wrote its DEAD event).
	Dead    bool
	History []Claim // oldest first; at most HistoryLimit

	// The retries (docs/JOBQUEUE.md). A record that uses none of them is
	// encoded as before retries existed (version 1), so that every
	// version reads it.

	// Failed counts the claims a worker ended with a retryable abort.
	Failed uint32
	// Retry is the task's retry policy: its spec's, taken at the first
	// claim, or the first retryable abort's (the server's default); nil
	// while it has none. With one, expiries and retryable aborts alike
	// are failed attempts, each followed by a backoff, and the attempt
	// that reaches Retry.MaxAttempts makes the task dead.
	Retry *crdt.RetryPolicy
	// RetryAtMs is when the backoff after the last failed attempt ends
	// (leader's clock, Unix ms): no claim is granted before it. 0: none.
	RetryAtMs int64
	// Life is the task's current life: 0 for its first, L after the
	// revival that began life L (OpRevive).
	Life uint32
	// DeadlineMs is the task's deadline (its spec's, taken at the first
	// claim; 0: none): at and after it no claim is granted or renewed
	// and no act is taken (ErrPastDeadline); OpDeadline cancels it.
	DeadlineMs int64
}

// FailedAttempts is how many attempts of the task failed: expiries and
// retryable aborts.
func (r *Record) FailedAttempts() uint32 {
	return uint32(min(uint64(r.Expired)+uint64(r.Failed), 1<<32-1))
}

// NotLive is the error for an act under token, which is not the live
// claim of r: ErrClaimSuperseded, saying what became of token: it ended
// (how and when), or it is not a claim of the task at all (never issued
// for it, or older than the HistoryLimit claims kept).
func (r *Record) NotLive(token uint64) error {
	for i := len(r.History) - 1; i >= 0; i-- {
		c := &r.History[i]
		if c.Token != token {
			continue
		}
		how := "ended " + c.End.String()
		if c.End == EndExpired {
			how = "expired (its lease was not renewed in time)"
		}
		if c.EndedMs > 0 {
			how += " at " + time.UnixMilli(c.EndedMs).UTC().Format(time.RFC3339Nano)
		}
		if live, ok := r.Live(); ok {
			how += fmt.Sprintf("; the task's live claim is %d", live.Token)
		}
		return fmt.Errorf("%w: the claim %s", ErrClaimSuperseded, how)
	}
	if len(r.History) >= HistoryLimit && len(r.History) > 0 && token < r.History[0].Token {
		return fmt.Errorf("%w: the claim is older than the last %d claims of the task", ErrClaimSuperseded, HistoryLimit)
	}
	return fmt.Errorf("%w: no such claim of the task (never issued for it)", ErrClaimSuperseded)
}

// Live returns the live claim, if any: the last claim when it has not ended.
func (r *Record) Live() (*Claim, bool) {
	if n := len(r.History); n > 0 && r.History[n-1].End == EndNone {
		return &r.History[n-1], true
	}
	return nil, false
}

// Done reports whether the task can never be claimed again.
func (r *Record) Done() bool { return r.Terminal != EndNone || r.Dead }

// ErrCorrupt is returned (wrapped) by the decoders for bytes that are not a
// valid record or command.
var ErrCorrupt = errors.New("claims: corrupt encoding")

// Record versions: 2 adds the retries' fields after the history; a record
// without them is written as version 1. 3 adds the deadline after them,
// written only for a task with one.
const (
	recordVersion   = 1
	recordVersionV2 = 2
	recordVersionV3 = 3
)

// Encode returns r's binary encoding.
func (r *Record) Encode() []byte {
	v3 := r.DeadlineMs != 0
	v2 := v3 || r.Failed != 0 || r.Retry != nil || r.RetryAtMs != 0 || r.Life != 0
	b := []byte{recordVersion}
	switch {
	case v3:
		b[0] = recordVersionV3
	case v2:
		b[0] = recordVersionV2
	}
	b = binary.AppendUvarint(b, r.Seq)
	b = binary.AppendUvarint(b, uint64(r.Expired))
	b = binary.AppendUvarint(b, uint64(r.MaxClaims))
	b = append(b, byte(r.Terminal), boolByte(r.Dead))
	b = binary.AppendUvarint(b, uint64(len(r.History)))
	for _, c := range r.History {
		b = binary.AppendUvarint(b, c.Token)
		b = binary.AppendUvarint(b, c.Seq)
		b = appendString(b, c.Worker)
		b = binary.AppendVarint(b, c.StartMs)
		b = binary.AppendVarint(b, c.ExpiryMs)
		b = append(b, byte(c.End))
		b = binary.AppendVarint(b, c.EndedMs)
	}
	if v2 {
		b = binary.AppendUvarint(b, uint64(r.Failed))
		b = appendPolicy(b, r.Retry)
		b = binary.AppendVarint(b, r.RetryAtMs)
		b = binary.AppendUvarint(b, uint64(r.Life))
	}
	if v3 {
		b = binary.AppendVarint(b, r.DeadlineMs)
	}
	return b
}

// appendPolicy appends a retry policy: 0 for none, else 1 and its fields.
func appendPolicy(b []byte, p *crdt.RetryPolicy) []byte {
	if p == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.AppendUvarint(b, uint64(p.MaxAttempts))
	b = binary.AppendVarint(b, p.InitialMs)
	b = binary.AppendVarint(b, p.MaxMs)
	b = binary.AppendUvarint(b, uint64(p.MultiplierMilli))
	return binary.AppendUvarint(b, uint64(p.JitterMilli))
}

// policy reads what appendPolicy wrote; an invalid policy is corrupt.
func (d *decoder) policy() *crdt.RetryPolicy {
	if !d.bool() {
		return nil
	}
	p := &crdt.RetryPolicy{MaxAttempts: d.uint32(), InitialMs: d.varint(), MaxMs: d.varint(),
		MultiplierMilli: d.uint32(), JitterMilli: d.uint32()}
	if d.err == nil {
		if err := p.Validate(); err != nil {
			d.fail("%v", err)
		}
	}
	return p
}

// DecodeRecord parses a record. It never panics; malformed input gives an
// error wrapping ErrCorrupt.
func DecodeRecord(b []byte) (*Record, error) {
	d := decoder{buf: b}
	v := d.byte()
	if d.err == nil && (v < recordVersion || v > recordVersionV3) {
		d.fail("record version %d", v)
	}
	r := &Record{Seq: d.uvarint(), Expired: d.uint32(), MaxClaims: d.uint32()}
	r.Terminal = EndReason(d.byte())
	r.Dead = d.bool()
	if d.err == nil && !r.Terminal.terminal() && r.Terminal != EndNone {
		d.fail("terminal reason %d", r.Terminal)
	}
	n := d.count(7) // the smallest encoded claim is 7 bytes
	if n > HistoryLimit {
		d.fail("history of %d claims", n)
	}
	if d.err == nil && n > 0 {
		r.History = make([]Claim, n)
		for i := range r.History {
			c := &r.History[i]
			c.Token, c.Seq, c.Worker = d.uvarint(), d.uvarint(), d.string()
			c.StartMs, c.ExpiryMs = d.varint(), d.varint()
			c.End = EndReason(d.byte())
			c.EndedMs = d.varint()
			if d.err == nil && !c.End.valid() {
				d.fail("end reason %d", c.End)
			}
		}
	}
	if v >= recordVersionV2 {
		r.Failed, r.Retry, r.RetryAtMs, r.Life = d.uint32(), d.policy(), d.varint(), d.uint32()
	}
	if v == recordVersionV3 {
		if r.DeadlineMs = d.varint(); d.err == nil && r.DeadlineMs <= 0 {
			d.fail("deadline %d", r.DeadlineMs)
		}
	}
	return r, d.finish()
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decoder reads with a sticky error.
type decoder struct {
	buf []byte
	off int
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w at byte %d: %s", ErrCorrupt, d.off, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) finish() error {
	if d.err == nil && d.off != len(d.buf) {
		d.fail("%d trailing bytes", len(d.buf)-d.off)
	}
	return d.err
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if d.off >= len(d.buf) {
		d.fail("unexpected end")
		return 0
	}
	c := d.buf[d.off]
	d.off++
	return c
}

func (d *decoder) bool() bool {
	switch c := d.byte(); c {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail("bool %d", c)
		return false
	}
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf[d.off:])
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.buf[d.off:])
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) uint32() uint32 {
	v := d.uvarint()
	if v > 1<<32-1 {
		d.fail("%d overflows uint32", v)
		return 0
	}
	return uint32(v)
}

// count reads an element count and checks that at least minBytesEach bytes
// per element remain, so a corrupt count cannot cause a huge allocation.
func (d *decoder) count(minBytesEach int) int {
	n := d.uvarint()
	if d.err != nil {
		return 0
	}
	if rem := uint64(len(d.buf) - d.off); n > rem/uint64(minBytesEach) {
		d.fail("count %d exceeds the %d bytes left", n, rem)
		return 0
	}
	return int(n)
}

// bytes reads a length-prefixed byte string; empty gives nil. The result
// is a copy: it does not alias the decoded buffer.
func (d *decoder) bytes() []byte {
	n := d.count(1)
	if d.err != nil || n == 0 {
		return nil
	}
	v := append([]byte(nil), d.buf[d.off:d.off+n]...)
	d.off += n
	return v
}

func (d *decoder) string() string {
	n := d.count(1)
	if d.err != nil {
		return ""
	}
	s := string(d.buf[d.off : d.off+n])
	d.off += n
	return s
}
