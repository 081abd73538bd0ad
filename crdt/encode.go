package crdt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cespare/xxhash/v2"
)

// Encoding (format version 1). Integers are minimal uvarints unless noted;
// signed integers are zigzag varints; strings and byte slices are a uvarint
// length followed by the bytes; a timestamp is varint WallMs, uvarint
// Logical, uvarint Node.
//
//	task     := version(=1) id flags [spec] nUpdates update* nTerminals terminal*
//	            [nFailures failure*]
//	flags    := byte; bit 0 set when a spec follows, bit 1 when the spec
//	            carries a retry policy (only with bit 0), bit 2 when
//	            failures follow the terminals (then nFailures >= 1),
//	            bit 3 when the task has lives (flagLives), bit 4 when the
//	            spec carries a deadline (only with bit 0); other bits zero
//	spec     := queue varint(priority) payload varint(notBeforeMs)
//	            nDeps dep* maxClaims timestamp(createdAt) [retry]
//	            [varint(deadlineMs), > 0]
//	retry    := maxAttempts varint(initialMs) varint(maxMs) multiplierMilli jitterMilli
//	update   := claim seq timestamp(at) progress(8 bytes, IEEE-754 big endian) message data
//	terminal := timestamp(at) kind(byte) claim nErrors error* result
//	failure  := claim timestamp(at) expired(byte 0 or 1) nErrors error*
//	error    := code description nArgs arg*
//
// A task without a retry policy or failures (every task before retries
// existed) encodes exactly as it did then. Updates appear sorted by
// (claim, seq), terminals by (at, kind, claim) and failures by claim,
// each key once. Decode rejects anything else (unsorted or repeated keys,
// non-minimal varints, unknown flags, trailing bytes), so a byte string that
// decodes is the one canonical encoding of its state.
const encodingVersion = 1

// ErrCorrupt is returned by Decode for bytes that are not a canonical
// encoding of a task.
var ErrCorrupt = errors.New("crdt: corrupt task encoding")

// Encode returns the canonical encoding of t. t must be in canonical form
// (see Task); states from Join, Decode and Normalize are.
func (t *Task) Encode() []byte { return t.AppendEncode(nil) }

// AppendEncode appends the canonical encoding of t to dst.
func (t *Task) AppendEncode(dst []byte) []byte {
	dst = append(dst, encodingVersion)
	dst = binary.AppendUvarint(dst, t.ID)
	var flags byte
	if t.Spec != nil {
		flags |= flagSpec
		if t.Spec.Retry != nil {
			flags |= flagRetry
		}
		if t.Spec.DeadlineMs != 0 {
			flags |= flagDeadline
		}
		if t.Spec.UniqueKey != "" {
			flags |= flagUnique
		}
		if t.Spec.FairnessKey != "" {
			flags |= flagFairness
		}
	}
	if len(t.Failures) > 0 {
		flags |= flagFailures
	}
	lives := t.hasLives()
	if lives {
		flags |= flagLives
	}
	dst = append(dst, flags)
	if t.Spec != nil {
		dst = appendSpec(dst, t.Spec)
	}
	dst = binary.AppendUvarint(dst, uint64(len(t.Updates)))
	for i := range t.Updates {
		dst = appendUpdate(dst, &t.Updates[i])
	}
	dst = binary.AppendUvarint(dst, uint64(len(t.Terminals)))
	for i := range t.Terminals {
		dst = appendTerminal(dst, &t.Terminals[i])
		if lives {
			dst = binary.AppendUvarint(dst, uint64(t.Terminals[i].Life))
		}
	}
	if len(t.Failures) > 0 {
		dst = binary.AppendUvarint(dst, uint64(len(t.Failures)))
		for i := range t.Failures {
			dst = appendFailure(dst, &t.Failures[i])
		}
	}
	if lives {
		dst = binary.AppendUvarint(dst, uint64(len(t.Revivals)))
		for _, r := range t.Revivals {
			dst = binary.AppendUvarint(dst, uint64(r.Life))
			dst = appendTimestamp(dst, r.At)
		}
	}
	return dst
}

// hasLives reports whether t has more than its first life: a revival, or
// a terminal event of a later life (flagLives).
func (t *Task) hasLives() bool {
	if len(t.Revivals) > 0 {
		return true
	}
	for i := range t.Terminals {
		if t.Terminals[i].Life != 0 {
			return true
		}
	}
	return false
}

// The flags byte's bits.
const (
	flagSpec     = 0x01
	flagRetry    = 0x02
	flagFailures = 0x04
	flagLives    = 0x08 // terminals carry their lives; revivals follow the failures
	flagDeadline = 0x10 // the spec ends with its deadline
	flagUnique   = 0x20 // the spec ends with its unique key and window
	flagFairness = 0x40 // the spec ends with its fairness key and weight
)

// Digest is the xxhash of an encoding. Equal states have equal digests.
func Digest(encoding []byte) uint64 { return xxhash.Sum64(encoding) }

// Digest returns the digest of t's canonical encoding.
func (t *Task) Digest() uint64 { return Digest(t.Encode()) }

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendTimestamp(dst []byte, t Timestamp) []byte {
	dst = binary.AppendVarint(dst, t.WallMs)
	dst = binary.AppendUvarint(dst, uint64(t.Logical))
	return binary.AppendUvarint(dst, uint64(t.Node))
}

func appendUpdate(dst []byte, u *Update) []byte {
	dst = binary.AppendUvarint(dst, u.Claim)
	dst = binary.AppendUvarint(dst, u.Seq)
	dst = appendTimestamp(dst, u.At)
	dst = binary.BigEndian.AppendUint64(dst, math.Float64bits(u.Progress))
	dst = appendString(dst, u.Message)
	return appendBytes(dst, u.Data)
}

func appendTerminal(dst []byte, t *Terminal) []byte {
	dst = appendTimestamp(dst, t.At)
	dst = append(dst, byte(t.Kind))
	dst = binary.AppendUvarint(dst, t.Claim)
	dst = appendErrors(dst, t.Errors)
	return appendBytes(dst, t.Result)
}

func appendFailure(dst []byte, f *Failure) []byte {
	dst = binary.AppendUvarint(dst, f.Claim)
	dst = appendTimestamp(dst, f.At)
	if f.Expired {
		dst = append(dst, 1)
	} else {
		dst = append(dst, 0)
	}
	return appendErrors(dst, f.Errors)
}

func appendErrors(dst []byte, errs []TaskError) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(errs)))
	for i := range errs {
		e := &errs[i]
		dst = appendString(dst, e.Code)
		dst = appendString(dst, e.Description)
		dst = binary.AppendUvarint(dst, uint64(len(e.Args)))
		for _, a := range e.Args {
			dst = appendString(dst, a)
		}
	}
	return dst
}

// Decode parses a canonical task encoding. It never panics; on malformed
// input it returns an error wrapping ErrCorrupt. The returned Task does not
// share memory with b.
func Decode(b []byte) (*Task, error) {
	r := reader{buf: b}
	t := r.task()
	if r.err == nil && r.off != len(r.buf) {
		r.fail("%d trailing bytes", len(r.buf)-r.off)
	}
	if r.err != nil {
		return nil, r.err
	}
	return t, nil
}

// DecodeHead parses what an index needs of a canonical task encoding: the
// id, the spec without its payload, and the first (winning) terminal event
// without its errors and result, the rest skipped. It checks the framing
// but not the canonical form: use it on encodings that Decode accepted
// when they were stored. The returned Task does not share memory with b;
// it is not canonical (Encode would not give b back).
func DecodeHead(b []byte) (*Task, error) {
	r := reader{buf: b}
	t, flags := r.idAndSpec(false)
	if r.err == nil && flags&flagLives != 0 {
		return decodeHeadOfLives(b) // the deciding event may be any of them
	}
	for n := r.count(13); n > 0 && r.err == nil; n-- {
		r.uvarint() // claim
		r.uvarint() // seq
		r.timestamp()
		r.skip(8) // progress
		r.skip(r.count(1))
		r.skip(r.count(1))
	}
	if n := r.count(7); n > 0 {
		ev := Terminal{At: r.timestamp(), Kind: TerminalKind(r.byte())}
		if r.err == nil && !ev.Kind.valid() {
			r.fail("unknown terminal kind %d", ev.Kind)
		}
		ev.Claim = r.uvarint()
		t.Terminals = []Terminal{ev}
	}
	if r.err != nil {
		return nil, r.err
	}
	return t, nil
}

// skip passes over n bytes.
func (r *reader) skip(n int) {
	if r.err != nil {
		return
	}
	if n > len(r.buf)-r.off {
		r.fail("unexpected end")
		return
	}
	r.off += n
}

// reader decodes with sticky errors: after the first failure every read
// returns a zero value and the error stays.
type reader struct {
	buf []byte
	off int
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w at byte %d: %s", ErrCorrupt, r.off, fmt.Sprintf(format, args...))
	}
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.buf) {
		r.fail("unexpected end")
		return 0
	}
	c := r.buf[r.off]
	r.off++
	return c
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.buf[r.off:])
	if n <= 0 {
		r.fail("bad uvarint")
		return 0
	}
	if n != uvarintLen(v) {
		r.fail("non-minimal uvarint")
		return 0
	}
	r.off += n
	return v
}

func (r *reader) varint() int64 {
	u := r.uvarint()
	x := int64(u >> 1)
	if u&1 != 0 {
		x = ^x
	}
	return x
}

func (r *reader) uint32() uint32 {
	v := r.uvarint()
	if v > math.MaxUint32 {
		r.fail("value %d overflows uint32", v)
		return 0
	}
	return uint32(v)
}

// count reads a length or element count and checks that at least
// minBytesEach*n bytes remain, so a corrupt count cannot make Decode
// allocate more than the input's size.
func (r *reader) count(minBytesEach int) int {
	n := r.uvarint()
	if r.err != nil {
		return 0
	}
	if rem := uint64(len(r.buf) - r.off); n > rem || n*uint64(minBytesEach) > rem {
		r.fail("count %d exceeds remaining %d bytes", n, rem)
		return 0
	}
	return int(n)
}

func (r *reader) bytes() []byte {
	n := r.count(1)
	if r.err != nil || n == 0 {
		return nil
	}
	b := make([]byte, n)
	copy(b, r.buf[r.off:])
	r.off += n
	return b
}

func (r *reader) string() string {
	n := r.count(1)
	if r.err != nil {
		return ""
	}
	s := string(r.buf[r.off : r.off+n])
	r.off += n
	return s
}

func (r *reader) timestamp() Timestamp {
	return Timestamp{WallMs: r.varint(), Logical: r.uint32(), Node: r.uint32()}
}

// idAndSpec reads a task's version, id and spec (with its payload or
// not).
func (r *reader) idAndSpec(payload bool) (*Task, byte) {
	if v := r.byte(); r.err == nil && v != encodingVersion {
		r.fail("unknown format version %d", v)
	}
	t := &Task{ID: r.uvarint()}
	flags := r.byte()
	switch {
	case r.err != nil:
	case flags&^(flagSpec|flagRetry|flagFailures|flagLives|flagDeadline|flagUnique|flagFairness) != 0:
		r.fail("unknown flags %#x", flags)
	case flags&(flagRetry|flagDeadline|flagUnique|flagFairness) != 0 && flags&flagSpec == 0:
		r.fail("flags %#x: a retry policy, deadline, unique key or fairness key without a spec", flags)
	case flags&flagSpec != 0:
		t.Spec = r.spec(payload, specParts{retry: flags&flagRetry != 0, deadline: flags&flagDeadline != 0,
			unique: flags&flagUnique != 0, fairness: flags&flagFairness != 0})
	}
	return t, flags
}

func (r *reader) task() *Task {
	t, flags := r.idAndSpec(true)
	if n := r.count(13); n > 0 {
		t.Updates = make([]Update, n)
		for i := range t.Updates {
			r.update(&t.Updates[i])
			if i > 0 && r.err == nil && compareUpdateKey(&t.Updates[i-1], &t.Updates[i]) >= 0 {
				r.fail("updates not sorted by (claim, seq) or repeated")
			}
		}
	}
	if n := r.count(7); n > 0 {
		t.Terminals = make([]Terminal, n)
		for i := range t.Terminals {
			r.terminal(&t.Terminals[i])
			if flags&flagLives != 0 {
				t.Terminals[i].Life = r.uint32()
			}
			if i > 0 && r.err == nil && compareTerminalKey(&t.Terminals[i-1], &t.Terminals[i]) >= 0 {
				r.fail("terminals not sorted by (at, kind, claim) or repeated")
			}
		}
	}
	if flags&flagFailures != 0 {
		n := r.count(5)
		if r.err == nil && n == 0 {
			r.fail("an empty failures section")
		}
		if n > 0 {
			t.Failures = make([]Failure, n)
			for i := range t.Failures {
				r.failure(&t.Failures[i])
				if i > 0 && r.err == nil && t.Failures[i-1].Claim >= t.Failures[i].Claim {
					r.fail("failures not sorted by claim or repeated")
				}
			}
		}
	}
	if flags&flagLives != 0 {
		if n := r.count(4); n > 0 {
			t.Revivals = make([]Revival, n)
			for i := range t.Revivals {
				t.Revivals[i] = Revival{Life: r.uint32(), At: r.timestamp()}
				if r.err == nil && t.Revivals[i].Life == 0 {
					r.fail("revival of life 0")
				}
				if i > 0 && r.err == nil && t.Revivals[i-1].Life >= t.Revivals[i].Life {
					r.fail("revivals not sorted by life or repeated")
				}
			}
		}
		if r.err == nil && !t.hasLives() {
			r.fail("the lives flag without a life")
		}
	}
	return t
}

func (r *reader) failure(f *Failure) {
	f.Claim = r.uvarint()
	if r.err == nil && f.Claim == 0 {
		r.fail("failure of claim 0")
	}
	f.At = r.timestamp()
	switch e := r.byte(); {
	case r.err != nil:
	case e == 1:
		f.Expired = true
	case e != 0:
		r.fail("expired byte %d", e)
	}
	f.Errors = r.errors()
}

func (r *reader) update(u *Update) {
	u.Claim = r.uvarint()
	u.Seq = r.uvarint()
	u.At = r.timestamp()
	if r.err == nil && len(r.buf)-r.off < 8 {
		r.fail("unexpected end in progress")
	}
	if r.err != nil {
		return
	}
	u.Progress = math.Float64frombits(binary.BigEndian.Uint64(r.buf[r.off:]))
	r.off += 8
	if !(u.Progress >= 0 && u.Progress <= 1) { // also rejects NaN
		r.fail("progress %v outside [0, 1]", u.Progress)
	}
	u.Message = r.string()
	u.Data = r.bytes()
}

func (r *reader) terminal(t *Terminal) {
	t.At = r.timestamp()
	t.Kind = TerminalKind(r.byte())
	if r.err == nil && !t.Kind.valid() {
		r.fail("unknown terminal kind %d", t.Kind)
	}
	t.Claim = r.uvarint()
	t.Errors = r.errors()
	t.Result = r.bytes()
}

func (r *reader) errors() []TaskError {
	n := r.count(3)
	if n == 0 {
		return nil
	}
	errs := make([]TaskError, n)
	for i := range errs {
		e := &errs[i]
		e.Code = r.string()
		e.Description = r.string()
		if m := r.count(1); m > 0 {
			e.Args = make([]string, m)
			for j := range e.Args {
				e.Args[j] = r.string()
			}
		}
	}
	return errs
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// decodeHeadOfLives is DecodeHead of a task with more than one life: the
// event that decides its status is the first of its current life, which
// may come after others, so every event is read.
func decodeHeadOfLives(b []byte) (*Task, error) {
	x, err := Decode(b)
	if err != nil {
		return nil, err
	}
	h := &Task{ID: x.ID}
	if x.Spec != nil {
		s := *x.Spec
		s.Payload = nil
		h.Spec = &s
	}
	if ev, ok := x.Terminal(); ok {
		h.Terminals = []Terminal{{At: ev.At, Kind: ev.Kind, Claim: ev.Claim, Life: ev.Life}}
	}
	return h, nil
}
