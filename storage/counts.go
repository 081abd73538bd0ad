package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2"

	"github.com/norn-dev/norn/crdt"
)

// Class is what a task counts as in its partition's counters: the status a
// replica can tell from what it stores, without the time or the
// dependencies' outcomes.
type Class uint8

// Classes. A task without a spec is not counted.
const (
	ClassReady     Class = 1 // in the ready index, no dependencies
	ClassWaiting   Class = 2 // in the ready index, with dependencies (see ScanWaiting)
	ClassDelayed   Class = 3 // in the delayed index
	ClassClaimed   Class = 4 // in the claimed index, not terminal
	ClassCompleted Class = 5 // terminal: completed
	ClassAborted   Class = 6 // terminal: aborted
	ClassCancelled Class = 7 // terminal: cancelled
	// ClassOther: not terminal and in no index. A task is there only
	// between states (no stored state reaches it today); counted so
	// that the counters always add up to the tasks stored.
	ClassOther Class = 8
	ClassDead  Class = 9 // terminal: dead (its last allowed attempt failed)
)

func (c Class) String() string {
	switch c {
	case ClassReady:
		return "ready"
	case ClassWaiting:
		return "waiting"
	case ClassDelayed:
		return "delayed"
	case ClassClaimed:
		return "claimed"
	case ClassCompleted:
		return "completed"
	case ClassAborted:
		return "aborted"
	case ClassCancelled:
		return "cancelled"
	case ClassOther:
		return "other"
	case ClassDead:
		return "dead"
	}
	return fmt.Sprintf("Class(%d)", uint8(c))
}

// classOf is the class of a stored task t (nil: none stored) whose
// effective meta (row.meta) is m; ok is false when it is not counted.
func classOf(t *crdt.Task, m meta) (queue string, c Class, ok bool) {
	if t == nil || t.Spec == nil {
		return "", 0, false
	}
	if ev, terminal := t.Terminal(); terminal {
		switch ev.Kind {
		case crdt.Completed:
			return t.Spec.Queue, ClassCompleted, true
		case crdt.Aborted:
			return t.Spec.Queue, ClassAborted, true
		case crdt.Dead:
			return t.Spec.Queue, ClassDead, true
		default:
			return t.Spec.Queue, ClassCancelled, true
		}
	}
	switch m.state {
	case IndexReady:
		if len(t.Spec.DependsOn) > 0 {
			return t.Spec.Queue, ClassWaiting, true
		}
		return t.Spec.Queue, ClassReady, true
	case IndexDelayed:
		return t.Spec.Queue, ClassDelayed, true
	case IndexClaimed:
		return t.Spec.Queue, ClassClaimed, true
	}
	return t.Spec.Queue, ClassOther, true
}

// countKey is the counter of one class of one queue in partition p:
//
//	p 0x08 queue 0x00 class -> int64 (merged by countMerger)
//
// Queue names hold no 0x00 byte (the API refuses them), as in the ready
// index.
func countKey(p uint16, queue string, c Class) []byte {
	k := append(partitionPrefix(p, tagCount), queue...)
	return append(k, 0, byte(c))
}

// waitingKey marks a task of partition p in the ready index with
// dependencies (ClassWaiting): p 0x09 id -> (empty).
func waitingKey(p uint16, id uint64) []byte { return idKey(p, tagWaiting, id) }

// recount records in b the counter changes of one task going from (t0, m0)
// to (t1, m1) (nil task: none stored), and keeps its waiting key in step.
func (b *sortedBatch) recount(p uint16, id uint64, t0 *crdt.Task, m0 meta, t1 *crdt.Task, m1 meta) error {
	q0, c0, ok0 := classOf(t0, m0)
	q1, c1, ok1 := classOf(t1, m1)
	if ok0 == ok1 && q0 == q1 && c0 == c1 {
		return nil
	}
	if ok0 {
		b.count(p, q0, c0, -1)
	}
	if ok1 {
		b.count(p, q1, c1, +1)
	}
	switch {
	case c1 == ClassWaiting && ok1 && (c0 != ClassWaiting || !ok0):
		return b.Set(waitingKey(p, id), nil)
	case c0 == ClassWaiting && ok0 && (c1 != ClassWaiting || !ok1):
		return b.Delete(waitingKey(p, id))
	}
	return nil
}

// countDelta is one counter's change in a batch.
type countDelta struct {
	p     uint16
	queue string
	class Class
}

// count adds delta to a counter in the batch.
func (b *sortedBatch) count(p uint16, queue string, c Class, delta int64) {
	if b.counts == nil {
		b.counts = map[countDelta]int64{}
	}
	b.counts[countDelta{p, queue, c}] += delta
}

// countMerger sums counters: every operand and value is an int64,
// 8 bytes big-endian. Deltas commute, so batches that commit concurrently
// need no order between them. The counters are the only keys Norn writes
// merge operands to.
//
// It carries the name of Pebble's default merger (which concatenates) on
// purpose: Pebble refuses to open a database, or read an sstable, that
// names another merger than the one it is given, and every store written
// before the counters names the default (it wrote no merge operand, so
// nothing was ever concatenated). A tool that opens a store with Pebble's
// default merger reads a counter as its operands concatenated.
var countMerger = &pebble.Merger{
	Name: pebble.DefaultMerger.Name,
	Merge: func(key, value []byte) (pebble.ValueMerger, error) {
		v, err := decodeCount(key, value)
		if err != nil {
			return nil, err
		}
		return &countSum{key: key, n: v}, nil
	},
}

func decodeCount(key, v []byte) (int64, error) {
	if len(v) != 8 {
		return 0, corrupt(key, "counter of %d bytes", len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

func encodeCount(n int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(n)) }

type countSum struct {
	key []byte
	n   int64
}

func (s *countSum) add(v []byte) error {
	d, err := decodeCount(s.key, v)
	s.n += d
	return err
}

func (s *countSum) MergeNewer(v []byte) error { return s.add(v) }
func (s *countSum) MergeOlder(v []byte) error { return s.add(v) }
func (s *countSum) Finish(bool) ([]byte, io.Closer, error) {
	return encodeCount(s.n), nil, nil
}

// CountEntry is one counter of a partition.
type CountEntry struct {
	Queue string
	Class Class
	N     int64
}

// Counts returns partition p's counters of queue (every queue when
// queue is ""), in (queue, class) order; counters at zero are left out.
// It reads one short span of keys: O(queues x classes), not O(tasks).
func (s *Store) Counts(p uint16, queue string) ([]CountEntry, error) {
	lo, hi := tagSpan(p, tagCount)
	if queue != "" {
		lo = append(partitionPrefix(p, tagCount), queue...)
		lo = append(lo, 0)
		hi = prefixEnd(lo)
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []CountEntry
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		i := bytes.IndexByte(k[3:], 0)
		if i < 0 || len(k) != 3+i+2 {
			return nil, corrupt(k, "bad counter key")
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, err
		}
		n, err := decodeCount(k, v)
		if err != nil {
			return nil, err
		}
		if n != 0 {
			out = append(out, CountEntry{Queue: string(k[3 : 3+i]), Class: Class(k[len(k)-1]), N: n})
		}
	}
	return out, it.Error()
}

// ScanWaiting calls fn for every task of partition p counted as
// ClassWaiting (ready, with dependencies), in id order: a count tells
// which of them wait for a dependency from the dependencies' outcomes,
// which the store does not know. fn's error stops the scan.
func (s *Store) ScanWaiting(p uint16, fn func(t *crdt.Task) error) error {
	lo, hi := tagSpan(p, tagWaiting)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		if len(it.Key()) != 3+8 {
			return corrupt(it.Key(), "bad waiting key")
		}
		t, err := s.TaskState(p, idFromKey(it.Key()))
		if errors.Is(err, ErrNotFound) {
			continue // deleted since the iterator's view
		}
		if err != nil {
			return err
		}
		if err := fn(t); err != nil {
			return err
		}
	}
	return it.Error()
}
