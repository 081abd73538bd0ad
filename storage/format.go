package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// The store's format version, under a key above every partition's span
// (partitionSpan ends at (p, 0xff), so no partition drop reaches it):
//
//	0xff 0xff 0xff "format" -> uint32
//
// 1 (or no key in a database that holds keys): before the task counters.
// 2: the counters (tagCount) and waiting keys (tagWaiting) are kept.
// 3: the anti-entropy segment index (tagSegment) is no longer stored; it
// is built in memory from the task keys (TrackDigests).
// 4: the ready index (tagReady) is no longer stored; it is built in memory
// from the task and meta keys at Open (buildIndexes).
// 5: nor are the delayed and claimed indexes (tagDelayed, tagClaimed).
// 6: the queue index (tagQueue) is kept; an upgrade builds it from the
// task keys (upgradeQueueIndex).
// 7: the retention index is per queue (tagTerminalQ replaces
// tagTerminal); an upgrade builds it from the task keys
// (upgradeTerminalIndex).
const formatVersion = 7

var formatKey = []byte("\xff\xff\xffformat")

// upgrade brings an opened store to formatVersion: a new store gets the
// version key; one of format 1 gets its counters and waiting keys built
// from the stored tasks, partition by partition; one before format 3 has
// its segment index keys deleted, one before format 5 its ready, delayed
// and claimed index keys; one before format 6 gets its queue index built
// from the stored tasks, one before 7 its per-queue retention index; then
// the key. A crash before the key is written
// starts the upgrade over (each step can run again).
func (s *Store) upgrade() error {
	v, err := s.get(formatKey)
	from := uint32(1)
	switch {
	case err == nil && len(v) == 4:
		from = binary.BigEndian.Uint32(v)
	case err == nil:
		return corrupt(formatKey, "format of %d bytes", len(v))
	case !errors.Is(err, ErrNotFound):
		return err
	}
	if from == formatVersion {
		return nil
	}
	if from > formatVersion {
		return fmt.Errorf("storage: the data directory has format %d; this build reads up to %d (a downgrade is not supported)", from, formatVersion)
	}
	for p, ok, err := s.nextPartition(0); ok || err != nil; p, ok, err = s.nextPartition(uint32(p) + 1) {
		if err != nil {
			return err
		}
		if from < 2 {
			if err := s.rebuildCounts(p); err != nil {
				return fmt.Errorf("storage: building the counters of partition %d: %w", p, err)
			}
		}
		if from < 3 {
			lo, hi := tagSpan(p, tagSegment)
			if err := s.db.DeleteRange(lo, hi, pebble.NoSync); err != nil {
				return fmt.Errorf("storage: deleting the segment index of partition %d: %w", p, err)
			}
		}
		if from >= 5 {
			continue
		}
		for _, tag := range []byte{tagReady, tagDelayed, tagClaimed} {
			lo, hi := tagSpan(p, tag)
			if err := s.db.DeleteRange(lo, hi, pebble.NoSync); err != nil {
				return fmt.Errorf("storage: deleting the index %#x of partition %d: %w", tag, p, err)
			}
		}
	}
	if from < 6 {
		if err := s.upgradeQueueIndex(); err != nil {
			return err
		}
	}
	if from < 7 {
		if err := s.upgradeTerminalIndex(); err != nil {
			return err
		}
	}
	return s.db.Set(formatKey, binary.BigEndian.AppendUint32(nil, formatVersion), pebble.Sync)
}

// nextPartition returns the first partition >= from that holds a key.
func (s *Store) nextPartition(from uint32) (p uint16, ok bool, err error) {
	if from > 0xffff {
		return 0, false, nil
	}
	it, err := s.db.NewIter(&pebble.IterOptions{
		LowerBound: []byte{byte(from >> 8), byte(from)},
		UpperBound: formatKey,
	})
	if err != nil {
		return 0, false, err
	}
	defer it.Close()
	if !it.First() {
		return 0, false, it.Error()
	}
	k := it.Key()
	if len(k) < 2 {
		return 0, false, corrupt(k, "key without a partition")
	}
	return binary.BigEndian.Uint16(k), true, nil
}

// rebuildCounts replaces partition p's counters and waiting keys with
// ones computed from its stored tasks. Nothing else writes to the store
// meanwhile (Open runs it).
func (s *Store) rebuildCounts(p uint16) error {
	var sb sortedBatch
	lo, hi := tagSpan(p, tagCount)
	sb.DeleteRange(lo, hi)
	lo, hi = tagSpan(p, tagWaiting)
	sb.DeleteRange(lo, hi)
	flush := func() error { return sb.commitUnsynced(s.db) }
	counts := map[countDelta]int64{}
	tlo, thi := tagSpan(p, tagTask)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: tlo, UpperBound: thi})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		key := slices.Clone(it.Key())
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		st, err := decodeTask(p, key, v)
		if err != nil {
			return err
		}
		m, found, err := s.getMeta(p, st.Task.ID)
		if err != nil {
			return err
		}
		if !found {
			m = meta{state: IndexReady}
		}
		q, c, counted := classOf(st.Task, m)
		if !counted {
			continue
		}
		counts[countDelta{p, q, c}]++
		if c == ClassWaiting {
			if err := sb.Set(waitingKey(p, st.Task.ID), nil); err != nil {
				return err
			}
			if len(sb.ops) >= 4096 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	for k, n := range counts {
		if err := sb.Set(countKey(k.p, k.queue, k.class), encodeCount(n)); err != nil {
			return err
		}
	}
	return flush()
}
