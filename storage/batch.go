package storage

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// sortedBatch collects the writes of one commit and hands them to Pebble in
// key order.
//
// Why: Pebble applies a batch to the memtable skiplist one key after the
// other, and each insert starts from the splice of the insert before it
// (arenaskl.Inserter). When the next key lies right after the previous one
// (no key already in the memtable between them) the splice brackets it and
// the insert costs O(1); otherwise it searches the skiplist from the top,
// O(log n) key comparisons. Task ids grow over time (sonyflake), so in key
// order a batch's task, meta and ready keys of one partition mostly append
// after each other. Written in the order the code produces them (task,
// segment, meta, index, then the next task) every insert searched from the
// top: 30% of a node's CPU during the enqueue benchmark was
// arenaskl.findSpliceForLevel.
//
// Range deletions are applied first (as every caller writes them before the
// point writes they make room for); point writes of the same key keep the
// order they were made in.
type sortedBatch struct {
	ops    []batchOp
	ranges [][2][]byte
	counts map[countDelta]int64 // counter changes (recount), merged at build
}

type batchOp struct {
	key, value []byte
	del        bool
	merge      bool // a merge operand (a counter delta)
	// absent marks a key known to hold nothing that the batch does not
	// write: recorded for the row cache (rowCache.apply), never sent to
	// Pebble.
	absent bool
	seq    int // order of the write among writes of the same key
}

// Set writes key = value.
func (b *sortedBatch) Set(key, value []byte) error {
	b.ops = append(b.ops, batchOp{key: key, value: value, seq: len(b.ops)})
	return nil
}

// Delete deletes key.
func (b *sortedBatch) Delete(key []byte) error {
	b.ops = append(b.ops, batchOp{key: key, del: true, seq: len(b.ops)})
	return nil
}

// NoteAbsent records that key holds nothing, without writing it (see
// batchOp.absent).
func (b *sortedBatch) NoteAbsent(key []byte) {
	b.ops = append(b.ops, batchOp{key: key, del: true, absent: true, seq: len(b.ops)})
}

// DeleteRange deletes the keys in [start, end).
func (b *sortedBatch) DeleteRange(start, end []byte) {
	b.ranges = append(b.ranges, [2][]byte{start, end})
}

// Empty reports whether nothing was written.
func (b *sortedBatch) Empty() bool {
	if len(b.ranges) > 0 {
		return false
	}
	for _, d := range b.counts {
		if d != 0 {
			return false
		}
	}
	for _, op := range b.ops {
		if !op.absent {
			return false
		}
	}
	return true
}

// build returns a Pebble batch holding the writes in key order. The caller
// closes it.
func (b *sortedBatch) build(db *pebble.DB) (*pebble.Batch, error) {
	for k, d := range b.counts {
		if d != 0 {
			b.ops = append(b.ops, batchOp{key: countKey(k.p, k.queue, k.class), value: encodeCount(d), merge: true, seq: len(b.ops)})
		}
	}
	b.counts = nil
	size := 0
	for _, op := range b.ops {
		if !op.absent {
			size += len(op.key) + len(op.value) + 8
		}
	}
	pb := db.NewBatchWithSize(size)
	for _, r := range b.ranges {
		if err := pb.DeleteRange(r[0], r[1], nil); err != nil {
			pb.Close()
			return nil, err
		}
	}
	b.sortOps()
	for _, op := range b.ops {
		var err error
		if op.absent {
			continue
		}
		switch {
		case op.del:
			err = pb.Delete(op.key, nil)
		case op.merge:
			err = pb.Merge(op.key, op.value, nil)
		default:
			err = pb.Set(op.key, op.value, nil)
		}
		if err != nil {
			pb.Close()
			return nil, err
		}
	}
	return pb, nil
}

// sortOps puts ops in key order, writes of one key in the order they were
// made. It sorts a permutation of small entries whose first 16 key bytes
// decide most comparisons as two integers (every key of a partition
// shares its first bytes, so bytes.Compare on the keys themselves walked
// them each time, and the sort moved 64-byte ops): the sort was 4% of a
// commitUnsynced commits what b holds without syncing and empties b: a
// pass of an upgrade or rebuild at Open, which syncs once at its end.
func (b *sortedBatch) commitUnsynced(db *pebble.DB) error {
	if b.Empty() {
		return nil
	}
	pb, err := b.build(db)
	if err != nil {
		return err
	}
	defer pb.Close()
	*b = sortedBatch{}
	return pb.Commit(pebble.NoSync)
}

// node's CPU during the enqueue benchmark.
func (b *sortedBatch) sortOps() {
	if len(b.ops) < 2 {
		return
	}
	perm := make([]opOrder, len(b.ops))
	for i := range b.ops {
		hi, lo := keyPrefix(b.ops[i].key)
		perm[i] = opOrder{hi: hi, lo: lo, i: int32(i)}
	}
	ops := b.ops
	slices.SortFunc(perm, func(x, y opOrder) int {
		if c := cmp.Compare(x.hi, y.hi); c != 0 {
			return c
		}
		if c := cmp.Compare(x.lo, y.lo); c != 0 {
			return c
		}
		if c := bytes.Compare(ops[x.i].key, ops[y.i].key); c != 0 {
			return c
		}
		return cmp.Compare(ops[x.i].seq, ops[y.i].seq)
	})
	sorted := make([]batchOp, len(ops))
	for j, o := range perm {
		sorted[j] = ops[o.i]
	}
	b.ops = sorted
}

// opOrder is one op of a sortedBatch being sorted: its key's first 16
// bytes (zero-padded) and its index.
type opOrder struct {
	hi, lo uint64
	i      int32
}

// keyPrefix returns the first 16 bytes of k as two big-endian integers,
// zero-padded: comparing them orders keys as bytes.Compare does, up to
// keys that agree on those bytes (a key and its zero-padded extension
// too, which the full comparison then tells apart).
func keyPrefix(k []byte) (hi, lo uint64) {
	var b [16]byte
	copy(b[:], k)
	return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
}
