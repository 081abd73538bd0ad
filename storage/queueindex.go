package storage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/norn-dev/norn/crdt"
)

// The queue index (store format 6): a key per stored task with a spec,
//
//	p 0x0a queue 0x00 id -> (empty)
//
// so that the tasks of one queue of a partition are one span of keys in
// id order, and listing a queue (ScanQueue) reads its tasks without
// stepping over other queues'. The queue name is encoded as in the
// counter keys (countKey): queue names hold no 0x00 byte.
//
// The key is written in the batch that stores the task's spec (its first
// store with a spec, in prepareMerge), and deleted in the batch that
// deletes the task (DeleteTasks, which retention calls); a partition drop
// deletes it with the rest of the partition's span. A task stored without
// a spec (a cancel that arrived first) has no key until its spec does. A
// spec is written once; should two replicas hold different specs, the
// join picks one (crdt.Join) and the key follows it to its queue.
//
// The index is local bookkeeping, like the meta keys: anti-entropy
// compares digests of the task keys only (scanTaskDigests, the segment
// index), never these keys.

// queueIndexPrefix is the span of queue's keys in partition p: p 0x0a
// queue 0x00.
func queueIndexPrefix(p uint16, queue string) []byte {
	k := append(partitionPrefix(p, tagQueue), queue...)
	return append(k, 0)
}

// queueIndexKey is the queue index key of task id of queue in partition p.
func queueIndexKey(p uint16, queue string, id uint64) []byte {
	return binary.BigEndian.AppendUint64(queueIndexPrefix(p, queue), id)
}

// moveQueueKey keeps task id's queue index key in step with its spec
// going from oldSpec to newSpec (nil: none, or no task stored).
func moveQueueKey(b *sortedBatch, p uint16, id uint64, oldSpec, newSpec *crdt.Spec) error {
	switch {
	case oldSpec == nil && newSpec == nil:
		return nil
	case oldSpec != nil && newSpec != nil && oldSpec.Queue == newSpec.Queue:
		return nil
	}
	if oldSpec != nil {
		if err := b.Delete(queueIndexKey(p, oldSpec.Queue, id)); err != nil {
			return err
		}
	}
	if newSpec != nil {
		return b.Set(queueIndexKey(p, newSpec.Queue, id), nil)
	}
	return nil
}

// ScanQueue returns up to limit tasks of queue in partition p with id >=
// start, in id order, without their index state (Index is IndexNone), as
// ScanTasks does for every task: next is the id to pass as start for the
// following page; more is false on the last page. It reads the queue
// index, so tasks of other queues cost nothing. The index and the tasks
// are read at one point in time (one Pebble view): an index key whose
// task is missing, or holds another queue, is an error wrapping
// ErrCorrupt.
func (s *Store) ScanQueue(p uint16, queue string, start uint64, limit int) (tasks []*StoredTask, next uint64, more bool, err error) {
	return s.scanQueue(p, queue, start, limit, false)
}

// ScanQueueBack is ScanQueue backwards: up to limit tasks of queue in
// partition p with id <= from, newest (highest id) first; next is the
// id to pass as from for the following page.
func (s *Store) ScanQueueBack(p uint16, queue string, from uint64, limit int) (tasks []*StoredTask, next uint64, more bool, err error) {
	return s.scanQueue(p, queue, from, limit, true)
}

func (s *Store) scanQueue(p uint16, queue string, from uint64, limit int, back bool) (tasks []*StoredTask, next uint64, more bool, err error) {
	if limit <= 0 {
		return nil, 0, false, fmt.Errorf("storage: ScanQueue limit %d must be positive", limit)
	}
	prefix := queueIndexPrefix(p, queue)
	bounds := &pebble.IterOptions{LowerBound: queueIndexKey(p, queue, from), UpperBound: prefixEnd(prefix)}
	if back {
		bounds = &pebble.IterOptions{LowerBound: prefix, UpperBound: idBound(queueIndexKey(p, queue, from))}
	}
	keys, err := s.db.NewIter(bounds)
	if err != nil {
		return nil, 0, false, err
	}
	defer keys.Close()
	tlo, thi := tagSpan(p, tagTask)
	vals, err := keys.Clone(pebble.CloneOptions{IterOptions: &pebble.IterOptions{LowerBound: tlo, UpperBound: thi}})
	if err != nil {
		return nil, 0, false, err
	}
	defer vals.Close()
	first, step := keys.First, keys.Next
	if back {
		first, step = keys.Last, keys.Prev
	}
	for ok := first(); ok; ok = step() {
		k := keys.Key()
		if len(k) != len(prefix)+8 {
			return nil, 0, false, corrupt(k, "bad queue index key")
		}
		id := idFromKey(k)
		if len(tasks) == limit {
			return tasks, id, true, nil
		}
		tk := taskKey(p, id)
		// Ids ascend (or descend): Pebble turns these seeks into steps.
		if !vals.SeekGE(tk) || !bytes.Equal(vals.Key(), tk) {
			if err := vals.Error(); err != nil {
				return nil, 0, false, err
			}
			return nil, 0, false, corrupt(k, "queue index key of a task not stored")
		}
		v, err := vals.ValueAndErr()
		if err != nil {
			return nil, 0, false, err
		}
		st, err := decodeTask(p, tk, v)
		if err != nil {
			return nil, 0, false, err
		}
		if st.Task.Spec == nil || st.Task.Spec.Queue != queue {
			return nil, 0, false, corrupt(k, "queue index key of a task of another queue")
		}
		tasks = append(tasks, st)
	}
	return tasks, 0, false, keys.Error()
}

// idBound is the exclusive upper bound of the keys at or below k, a key
// ending in an id: k with its id plus one (carrying into the prefix when
// the id is the largest).
func idBound(k []byte) []byte {
	end := slices.Clone(k)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i]++; end[i] != 0 {
			return end
		}
	}
	return nil // all ones: no bound
}

// upgradeQueueIndex builds the queue index of every partition of a store
// written before it (format 5 and before): one pass over the task keys,
// committed in batches, with progress logged every million tasks. Nothing
// else writes to the store meanwhile (Open runs it); a crash before the
// format key is written runs it again from scratch.
func (s *Store) upgradeQueueIndex() error {
	began := time.Now()
	var indexed int
	logged := 0
	for p, ok, err := s.nextPartition(0); ok || err != nil; p, ok, err = s.nextPartition(uint32(p) + 1) {
		if err != nil {
			return err
		}
		n, err := s.buildQueueIndex(p, func(n int) {
			if indexed+n >= logged+queueIndexLogEvery {
				logged = indexed + n
				s.log.Info("building the queue index (store format 6)", "tasks", logged, "partition", p, "took", time.Since(began).Round(time.Millisecond))
			}
		})
		if err != nil {
			return fmt.Errorf("storage: building the queue index of partition %d: %w", p, err)
		}
		indexed += n
	}
	if indexed > 0 {
		s.log.Info("built the queue index (store format 6)", "tasks", indexed, "took", time.Since(began).Round(time.Millisecond))
	}
	return nil
}

// queueIndexLogEvery is how many tasks the queue index upgrade indexes
// between two progress lines.
const queueIndexLogEvery = 1_000_000

// buildQueueIndex replaces partition p's queue index with one built from
// its task keys, and returns how many tasks it indexed. progress is called
// after each commit with the count so far.
func (s *Store) buildQueueIndex(p uint16, progress func(n int)) (int, error) {
	return s.buildIndex(p, []byte{tagQueue}, progress, func(t *crdt.Task) []byte {
		if t.Spec == nil {
			return nil
		}
		return queueIndexKey(p, t.Spec.Queue, t.ID)
	})
}

// buildIndex replaces partition p's keys of the tags with keyOf of every
// stored task (nil: none), from one pass over its task keys (the heads:
// crdt.DecodeHead), committed in batches; it returns how many keys it
// wrote, and calls progress after each commit with the count so far.
func (s *Store) buildIndex(p uint16, tags []byte, progress func(n int), keyOf func(*crdt.Task) []byte) (int, error) {
	var sb sortedBatch
	for _, tag := range tags {
		lo, hi := tagSpan(p, tag)
		sb.DeleteRange(lo, hi)
	}
	n := 0
	flush := func() error {
		if sb.Empty() {
			return nil
		}
		if err := sb.commitUnsynced(s.db); err != nil {
			return err
		}
		progress(n)
		return nil
	}
	tlo, thi := tagSpan(p, tagTask)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: tlo, UpperBound: thi})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != len(tlo)+8 {
			return 0, corrupt(k, "bad task key")
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return 0, err
		}
		t, err := crdt.DecodeHead(v) // the spec without the payload
		if err != nil {
			return 0, corrupt(k, "%v", err)
		}
		if t.ID != idFromKey(k) {
			return 0, corrupt(k, "stored task has id %d", t.ID)
		}
		key := keyOf(t)
		if key == nil {
			continue
		}
		if err := sb.Set(key, nil); err != nil {
			return 0, err
		}
		n++
		if len(sb.ops) >= 16384 {
			if err := flush(); err != nil {
				return 0, err
			}
		}
	}
	if err := it.Error(); err != nil {
		return 0, err
	}
	return n, flush()
}
