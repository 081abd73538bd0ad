package storage

import (
	"encoding/binary"
	"math"
	"sync"
)

// dueTable keeps, per partition, a lower bound of the earliest time in
// the retention index (terminal), so that the monitor's pass over every
// partition every 250 ms opens no iterator on an index with nothing due.
// (The delayed and claimed indexes, which it served too, are in memory
// since store format 5: timeIndex.) With 1,024 idle partitions per node those iterators were
// about 7% of an idle node's CPU (docs/SCALING.md).
//
// A bound is lowered after every commit that inserted a key into the
// index (once the key is visible), and raised only by a scan that saw
// the whole index: dueBefore sets it to the earliest time it found, or
// past every time when the index was empty. Every lowering bumps a
// version, and a scan raises the bound only if the version did not
// change since it began, so a key committed while it read (which it may
// not have seen) is never hidden by its raise: either the lowering came
// after the raise, or the raise is dropped. Between a commit and its
// lowering a pass may miss the key; the next pass finds it. Unknown
// (after an open or a drop): scan.
type dueTable struct {
	mu     sync.Mutex
	bounds map[dueKey]*dueBound
}

type dueKey struct {
	p   uint16
	tag byte
}

type dueBound struct {
	known   bool  // minMs holds: a scan saw the whole index below it
	minMs   int64 // no key of the index is earlier (when known)
	version uint64
}

// emptyIndex is the bound of an index seen empty.
const emptyIndex = math.MaxInt64

func (d *dueTable) bound(k dueKey) *dueBound {
	if d.bounds == nil {
		d.bounds = map[dueKey]*dueBound{}
	}
	b := d.bounds[k]
	if b == nil {
		b = &dueBound{}
		d.bounds[k] = b
	}
	return b
}

// isTimeTag reports whether tag is a time index kept in Pebble
// (timeIDKey layout).
func isTimeTag(tag byte) bool { return tag == tagTerminal }

// lower lowers the bounds for the time index keys the ops insert.
func (d *dueTable) lower(ops []batchOp) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, op := range ops {
		if op.del || op.absent || len(op.key) != 3+8+8 || !isTimeTag(op.key[2]) {
			continue
		}
		b := d.bound(dueKey{binary.BigEndian.Uint16(op.key), op.key[2]})
		b.minMs = min(b.minMs, int64(binary.BigEndian.Uint64(op.key[3:11])))
		b.version++
	}
}

// nothingDue reports whether the index holds no key at or before ms, as
// far as the bound tells; and the version to pass to raise.
func (d *dueTable) nothingDue(k dueKey, ms int64) (bool, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.bound(k)
	return b.known && b.minMs > ms, b.version
}

// raise sets the bound to minMs (the earliest time a scan found, or
// emptyIndex) unless an insert came since the scan began (version).
func (d *dueTable) raise(k dueKey, version uint64, minMs int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if b := d.bound(k); b.version == version {
		b.known, b.minMs = true, minMs
	}
}

// forget makes partition p's bounds unknown (a drop).
func (d *dueTable) forget(p uint16) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if b := d.bounds[dueKey{p, tagTerminal}]; b != nil {
		b.known = false
		b.version++
	}
}
