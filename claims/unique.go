package claims

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/norn-dev/norn/storage"
)

// Unique keys (docs/SCHEDULING.md, "Unique tasks"): the claim FSM of a
// key's partition decides which task holds the key. OpUnique carries
// UniqueOps; each is decided from the entry and the key's record alone.

// UniqueKind is what a UniqueOp decides.
type UniqueKind uint8

// UniqueOp kinds (the API's UniqueKeyOp.Kind).
const (
	// UniqueTake takes the key for ID unless another task holds it.
	UniqueTake UniqueKind = 1
	// UniqueReplace takes the key for ID from Holder, which the
	// coordinator saw finished in HolderLife (or gone), if the record
	// still names Holder in that life or an earlier one and its window
	// has passed at the entry's time.
	UniqueReplace UniqueKind = 2
	// UniqueReacquire is a Retry of ID to Life: the key is ID's again in
	// Life (its window starts afresh), unless another task holds it.
	UniqueReacquire UniqueKind = 3
	// UniqueForget deletes the record if it still names Holder in
	// HolderLife or an earlier life (the holder is gone).
	UniqueForget UniqueKind = 4
)

// ErrUniqueHeld: another task holds the key (Outcome.Unique names it).
var ErrUniqueHeld = errors.New("unique key held by another task")

// UniqueOp is one decision about a unique key, in an OpUnique.
type UniqueOp struct {
	Kind       UniqueKind
	Queue, Key string
	ID         uint64
	Digest     uint64 // crdt.SpecDigest of the spec that takes the key
	WindowMs   int64  // TaskSpec.unique_for; 0 for none
	Holder     uint64 // UniqueReplace, UniqueForget
	HolderLife uint32 // UniqueReplace, UniqueForget
	Life       uint32 // UniqueReacquire
}

// UniqueRecord is who holds a unique key: task ID in its life Life,
// since CreatedMs (the deciding entry's time), for at least WindowMs.
type UniqueRecord struct {
	ID        uint64
	Life      uint32
	CreatedMs int64
	WindowMs  int64
	Digest    uint64
}

// WindowOpen reports whether the record's window still holds the key at
// nowMs, whatever its task's state.
func (r *UniqueRecord) WindowOpen(nowMs int64) bool { return nowMs < r.CreatedMs+r.WindowMs }

// Holder is what a majority read found of a key's holder: whether any
// replica read has it, its current life, and whether it is finished
// (COMPLETED, DEAD, ABORTED, CANCELLED) in that life.
type Holder struct {
	Found    bool
	Life     uint32
	Finished bool
}

// Free reports whether the key of r may be taken from its holder h (read
// at a majority) at nowMs, and the holder's life to name in the replace
// or forget: the window has passed, and the holder is finished in the
// record's life or a later one, or no majority has it and the record is
// older than phantomAfterMs (no replica that may hold it can come back:
// docs/SCHEDULING.md, "Phantoms").
func (r *UniqueRecord) Free(nowMs int64, h Holder, phantomAfterMs int64) (life uint32, free bool) {
	switch {
	case r.WindowOpen(nowMs):
		return 0, false
	case !h.Found && nowMs-r.CreatedMs >= phantomAfterMs:
		return r.Life, true
	case !h.Found:
		return 0, false
	case !h.Finished || r.Life > h.Life:
		return 0, false
	}
	return h.Life, true
}

const uniqueRecordVersion = 1

// Encode returns the record's binary encoding.
func (r *UniqueRecord) Encode() []byte {
	b := []byte{uniqueRecordVersion}
	b = binary.AppendUvarint(b, r.ID)
	b = binary.AppendUvarint(b, uint64(r.Life))
	b = binary.AppendVarint(b, r.CreatedMs)
	b = binary.AppendVarint(b, r.WindowMs)
	return binary.BigEndian.AppendUint64(b, r.Digest)
}

// DecodeUniqueRecord parses a record; malformed input gives an error
// wrapping ErrCorrupt.
func DecodeUniqueRecord(b []byte) (*UniqueRecord, error) {
	d := decoder{buf: b}
	if v := d.byte(); d.err == nil && v != uniqueRecordVersion {
		d.fail("unique record version %d", v)
	}
	r := &UniqueRecord{ID: d.uvarint(), Life: d.uint32(), CreatedMs: d.varint(), WindowMs: d.varint()}
	r.Digest = d.uint64()
	if err := d.finish(); err != nil {
		return nil, err
	}
	return r, nil
}

// UniqueGetter returns the record of a key, or nil when there is none.
type UniqueGetter func(queue, key string) (*UniqueRecord, error)

// UniqueChange is a key record an OpUnique wrote (Record nil: deleted).
type UniqueChange struct {
	Queue, Key string
	Record     *UniqueRecord
}

// ApplyUnique applies an OpUnique: per op an Outcome (ID: the op's ID;
// Unique: the key's record after the op, nil when none; Err nil when the
// op took effect, ErrUniqueHeld when another task holds the key), and
// the records it changed, in order. Deterministic, like Apply.
func ApplyUnique(cmd *Command, get UniqueGetter) ([]Outcome, []UniqueChange, error) {
	if err := validate(cmd); err != nil {
		return []Outcome{{Err: err}}, nil, nil
	}
	type qk struct{ q, k string }
	recs := map[qk]*UniqueRecord{}
	var order []qk
	outs := make([]Outcome, 0, len(cmd.Uniques))
	for _, op := range cmd.Uniques {
		k := qk{op.Queue, op.Key}
		r, seen := recs[k]
		if !seen {
			var err error
			if r, err = get(op.Queue, op.Key); err != nil {
				return nil, nil, fmt.Errorf("claims: read unique key %q of queue %q: %w", op.Key, op.Queue, err)
			}
		}
		next, err := decideUnique(cmd.NowMs, op, r)
		if next != r {
			if !seen {
				order = append(order, k)
			}
			seen = true
		}
		if seen {
			recs[k] = next
		}
		o := Outcome{ID: op.ID, Err: err}
		if next != nil {
			cp := *next
			o.Unique = &cp
		}
		outs = append(outs, o)
	}
	changes := make([]UniqueChange, 0, len(order))
	for _, k := range order {
		changes = append(changes, UniqueChange{Queue: k.q, Key: k.k, Record: recs[k]})
	}
	return outs, changes, nil
}

// decideUnique returns the key's record after op (r itself when op
// changes nothing) and op's error.
func decideUnique(nowMs int64, op UniqueOp, r *UniqueRecord) (*UniqueRecord, error) {
	taken := &UniqueRecord{ID: op.ID, Life: op.Life, CreatedMs: nowMs, WindowMs: op.WindowMs, Digest: op.Digest}
	switch op.Kind {
	case UniqueTake:
		switch {
		case r == nil:
			return taken, nil
		case r.ID == op.ID:
			return r, nil
		}
	case UniqueReplace:
		switch {
		case r == nil:
			return taken, nil
		case r.ID == op.ID:
			return r, nil
		case r.ID == op.Holder && r.Life <= op.HolderLife && !r.WindowOpen(nowMs):
			return taken, nil
		}
	case UniqueReacquire:
		switch {
		case r == nil:
			return taken, nil
		case r.ID == op.ID:
			next := *r
			next.Life, next.CreatedMs = max(r.Life, op.Life), nowMs
			if op.WindowMs != 0 {
				next.WindowMs = op.WindowMs
			}
			return &next, nil
		}
	case UniqueForget:
		switch {
		case r == nil:
			return nil, nil
		case r.ID == op.Holder && r.Life <= op.HolderLife:
			return nil, nil
		}
	}
	return r, ErrUniqueHeld
}

// validateUnique checks an OpUnique on its own.
func validateUnique(cmd *Command) error {
	if len(cmd.Uniques) == 0 {
		return fmt.Errorf("%w: unique without ops", ErrBadCommand)
	}
	for _, op := range cmd.Uniques {
		switch {
		case op.Kind < UniqueTake || op.Kind > UniqueForget:
			return fmt.Errorf("%w: unique op kind %d", ErrBadCommand, op.Kind)
		case op.Queue == "" || op.Key == "":
			return fmt.Errorf("%w: unique op without a queue or key", ErrBadCommand)
		case op.Kind != UniqueForget && op.ID == 0:
			return fmt.Errorf("%w: unique op on key %q without a task", ErrBadCommand, op.Key)
		case op.WindowMs < 0:
			return fmt.Errorf("%w: unique key %q with window %d", ErrBadCommand, op.Key, op.WindowMs)
		}
	}
	return nil
}

func appendUniques(b []byte, ops []UniqueOp) []byte {
	b = binary.AppendUvarint(b, uint64(len(ops)))
	for _, op := range ops {
		b = append(b, byte(op.Kind))
		b = appendString(b, op.Queue)
		b = appendString(b, op.Key)
		b = binary.AppendUvarint(b, op.ID)
		b = binary.BigEndian.AppendUint64(b, op.Digest)
		b = binary.AppendVarint(b, op.WindowMs)
		b = binary.AppendUvarint(b, op.Holder)
		b = binary.AppendUvarint(b, uint64(op.HolderLife))
		b = binary.AppendUvarint(b, uint64(op.Life))
	}
	return b
}

func (d *decoder) uniques() []UniqueOp {
	n := d.count(16)
	if n == 0 {
		return nil
	}
	ops := make([]UniqueOp, n)
	for i := range ops {
		ops[i] = UniqueOp{Kind: UniqueKind(d.byte()), Queue: d.string(), Key: d.string(), ID: d.uvarint()}
		ops[i].Digest, ops[i].WindowMs, ops[i].Holder = d.uint64(), d.varint(), d.uvarint()
		ops[i].HolderLife, ops[i].Life = d.uint32(), d.uint32()
	}
	return ops
}

// uint64 reads 8 big-endian bytes.
func (d *decoder) uint64() uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.buf)-d.off < 8 {
		d.fail("truncated: 8 bytes wanted at %d", d.off)
		return 0
	}
	v := binary.BigEndian.Uint64(d.buf[d.off:])
	d.off += 8
	return v
}

// uniqueOverlay is the unique key records a batch of entries read and
// wrote, over the store's.
type uniqueOverlay struct {
	kv    KV
	p     uint16
	recs  map[[2]string]*UniqueRecord
	order [][2]string
}

func newUniqueOverlay(kv KV, p uint16) *uniqueOverlay {
	return &uniqueOverlay{kv: kv, p: p}
}

func (o *uniqueOverlay) get(queue, key string) (*UniqueRecord, error) {
	if r, ok := o.recs[[2]string{queue, key}]; ok {
		return r, nil
	}
	b, err := o.kv.ClaimFSMUnique(o.p, queue, key)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return DecodeUniqueRecord(b)
}

func (o *uniqueOverlay) note(changes []UniqueChange) {
	if o.recs == nil {
		o.recs = map[[2]string]*UniqueRecord{}
	}
	for _, c := range changes {
		k := [2]string{c.Queue, c.Key}
		if _, ok := o.recs[k]; !ok {
			o.order = append(o.order, k)
		}
		o.recs[k] = c.Record
	}
}

// changes returns the records to store, nil when there are none.
func (o *uniqueOverlay) changes() []storage.FSMUnique {
	if len(o.order) == 0 {
		return nil
	}
	out := make([]storage.FSMUnique, 0, len(o.order))
	for _, k := range o.order {
		u := storage.FSMUnique{Queue: k[0], Key: k[1]}
		if r := o.recs[k]; r != nil {
			u.Value = r.Encode()
		}
		out = append(out, u)
	}
	return out
}

// persistUniques writes the snapshot's unique key records after its task
// records (see fsmSnapshot), nothing when it has none.
func persistUniques(w *bufio.Writer, snap *storage.FSMSnapshot) error {
	first := true
	return snap.Uniques(func(queue, key string, value []byte) error {
		var b []byte
		if first {
			b, first = make([]byte, 8), false // the marker: id 0
		}
		for _, s := range [][]byte{[]byte(queue), []byte(key), value} {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
		_, err := w.Write(b)
		return err
	})
}

// restoreUniques reads the unique key records of a snapshot stream, up
// to its end.
func restoreUniques(r *bufio.Reader) ([]storage.FSMUnique, error) {
	var out []storage.FSMUnique
	read := func() ([]byte, error) {
		n, err := binary.ReadUvarint(r)
		if err != nil {
			return nil, err
		}
		if n > 1<<20 {
			return nil, fmt.Errorf("length %d", n)
		}
		v := make([]byte, n)
		_, err = io.ReadFull(r, v)
		return v, err
	}
	for {
		if _, err := r.Peek(1); err == io.EOF {
			return out, nil
		}
		var f [3][]byte
		for i := range f {
			v, err := read()
			if err != nil {
				return nil, fmt.Errorf("claims: snapshot unique key record %d: %w", len(out), err)
			}
			f[i] = v
		}
		if _, err := DecodeUniqueRecord(f[2]); err != nil {
			return nil, fmt.Errorf("claims: snapshot unique key %q of queue %q: %w", f[1], f[0], err)
		}
		out = append(out, storage.FSMUnique{Queue: string(f[0]), Key: string(f[1]), Value: f[2]})
	}
}
