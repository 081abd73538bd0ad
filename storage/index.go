package storage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// ReadyEntry is one task in a queue's ready index.
type ReadyEntry struct {
	ID       uint64
	Priority int32
}

// DueEntry is one task in the delayed or claimed index with its time.
type DueEntry struct {
	ID   uint64
	AtMs int64 // not-before time (delayed) or lease expiry (claimed), Unix ms
}

// cursorKey names one queue of one partition.
type cursorKey struct {
	p     uint16
	queue string
}

// readyCursor is a lower bound below which a queue's ready index holds no
// live key. Removing heads leaves tombstones at the front of the index that
// a seek from the queue's first key would step over one by one until
// compaction drops them (the LSM tombstone trap); seeking from the bound
// skips them.
//
// Invariant: every live ready key of the queue is >= bound. Inserts lower
// the bound after their batch is visible and bump version; a reader raises
// the bound to the head it found only if no insert happened since it read
// the bound (version unchanged), so a key it could not see is never skipped.
type readyCursor struct {
	mu      sync.Mutex
	bound   []byte
	version uint64
}

func (s *Store) cursor(p uint16, queue string) *readyCursor {
	k := cursorKey{p, queue}
	s.cursorsMu.Lock()
	defer s.cursorsMu.Unlock()
	c, ok := s.cursors[k]
	if !ok {
		c = &readyCursor{bound: readyQueuePrefix(p, queue)}
		s.cursors[k] = c
	}
	return c
}

// noteReadyInserts lowers the cursors of queues that got new ready keys.
// Call it after the batch that wrote them is visible.
func (s *Store) noteReadyInserts(ins []readyInsert) {
	for _, in := range ins {
		c := s.cursor(in.p, in.queue)
		c.mu.Lock()
		if bytes.Compare(in.key, c.bound) < 0 {
			c.bound = in.key
		}
		c.version++
		c.mu.Unlock()
	}
}

// ReadyHead returns up to limit tasks at the head of queue's ready index in
// partition p: priority descending, then id ascending. It does not scan
// tasks that are not ready, and heads removed earlier cost nothing.
func (s *Store) ReadyHead(p uint16, queue string, limit int) ([]ReadyEntry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("storage: ReadyHead limit %d must be positive", limit)
	}
	c := s.cursor(p, queue)
	c.mu.Lock()
	lo, version := c.bound, c.version
	c.mu.Unlock()

	hi := prefixEnd(readyQueuePrefix(p, queue))
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []ReadyEntry
	var head []byte
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		k := it.Key()
		if head == nil {
			head = bytes.Clone(k)
		}
		if len(k) < 12 {
			return nil, corrupt(k, "short ready index key")
		}
		prio := prioFromBits(binary.BigEndian.Uint32(k[len(k)-12:]))
		out = append(out, ReadyEntry{ID: idFromKey(k), Priority: prio})
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	if head == nil {
		head = hi // empty: no live key below the end
	}
	c.mu.Lock()
	if c.version == version && bytes.Compare(head, c.bound) > 0 {
		c.bound = head
	}
	c.mu.Unlock()
	return out, nil
}

// DelayedDue returns up to limit tasks of partition p whose not-before time
// is at or before nowMs, earliest first.
func (s *Store) DelayedDue(p uint16, nowMs int64, limit int) ([]DueEntry, error) {
	return s.dueBefore(p, tagDelayed, nowMs, limit)
}

// ClaimsExpiring returns up to limit claimed tasks of partition p whose lease
// expiry is at or before ms, earliest first.
func (s *Store) ClaimsExpiring(p uint16, ms int64, limit int) ([]DueEntry, error) {
	return s.dueBefore(p, tagClaimed, ms, limit)
}

func (s *Store) dueBefore(p uint16, tag byte, ms int64, limit int) ([]DueEntry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("storage: limit %d must be positive", limit)
	}
	if ms < 0 {
		return nil, nil
	}
	start, _ := tagSpan(p, tag)
	end := binary.BigEndian.AppendUint64(partitionPrefix(p, tag), uint64(ms)+1)
	if uint64(ms)+1 == 0 {
		_, end = tagSpan(p, tag)
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []DueEntry
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		k := it.Key()
		if len(k) != 3+8+8 {
			return nil, corrupt(k, "bad time index key")
		}
		out = append(out, DueEntry{ID: idFromKey(k), AtMs: int64(binary.BigEndian.Uint64(k[3:11]))})
	}
	return out, it.Error()
}

// ClaimMark sets a task's lease expiry in the claimed index.
type ClaimMark struct {
	ID       uint64
	ExpiryMs int64
}

// MarkClaimed moves tasks of partition p into the claimed index with their
// lease expiry (from ready or delayed, or within it for a renewal), in one
// synced batch. It fails with ErrNotClaimable, changing nothing, if any task
// is terminal or has no spec, and with ErrNotFound if any is not stored.
func (s *Store) MarkClaimed(p uint16, marks []ClaimMark) error {
	expiry := make(map[uint64]int64, len(marks))
	ids := make([]uint64, 0, len(marks))
	for _, m := range marks {
		expiry[m.ID] = m.ExpiryMs
		ids = append(ids, m.ID)
	}
	return s.transition(p, ids, func(st *StoredTask, _ int64) (meta, error) {
		if st.Index == IndexNone {
			return meta{}, fmt.Errorf("%w: task %d", ErrNotClaimable, st.Task.ID)
		}
		return meta{state: IndexClaimed, expiryMs: expiry[st.Task.ID]}, nil
	})
}

// ReleaseClaims takes tasks of partition p out of the claimed index (a claim
// ended by expiry or yield): back to ready, or delayed if their not-before
// time is still ahead. Tasks not claimed are left alone, so a release is
// idempotent; missing tasks fail with ErrNotFound.
func (s *Store) ReleaseClaims(p uint16, ids []uint64) error {
	return s.transition(p, ids, func(st *StoredTask, nowMs int64) (meta, error) {
		if st.Index != IndexClaimed {
			return meta{state: st.Index, expiryMs: st.ExpiryMs}, nil
		}
		return initialPlacement(st.Task.Spec, nowMs), nil
	})
}

// PromoteDelayed moves up to limit delayed tasks of partition p whose
// not-before time has passed into the ready index, and returns how many it
// moved.
func (s *Store) PromoteDelayed(p uint16, limit int) (int, error) {
	now := s.clock.Now().UnixMilli()
	due, err := s.DelayedDue(p, now, limit)
	if err != nil || len(due) == 0 {
		return 0, err
	}
	ids := make([]uint64, len(due))
	for i, d := range due {
		ids[i] = d.ID
	}
	moved := 0
	err = s.transition(p, ids, func(st *StoredTask, nowMs int64) (meta, error) {
		if st.Index != IndexDelayed || st.Task.Spec.NotBeforeMs > nowMs {
			return meta{state: st.Index, expiryMs: st.ExpiryMs}, nil
		}
		moved++
		return meta{state: IndexReady}, nil
	})
	return moved, err
}

// transition changes the index state of tasks of partition p as next says,
// in one synced batch, holding their locks while it reads and publishes.
func (s *Store) transition(p uint16, ids []uint64, next func(st *StoredTask, nowMs int64) (meta, error)) error {
	stripes := make([]int, 0, len(ids))
	for _, id := range ids {
		stripes = append(stripes, stripeOf(id))
	}
	slices.Sort(stripes)
	stripes = slices.Compact(stripes)
	for _, i := range stripes {
		s.stripes[i].Lock()
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			for _, i := range stripes {
				s.stripes[i].Unlock()
			}
		}
	}
	defer unlock()

	now := s.clock.Now().UnixMilli()
	b := s.db.NewBatch()
	defer b.Close()
	var inserted []readyInsert
	for _, id := range slices.Compact(slices.Sorted(slices.Values(ids))) {
		st, err := s.getTask(p, id)
		if err != nil {
			return fmt.Errorf("storage: task %d: %w", id, err)
		}
		old := meta{state: st.Index, expiryMs: st.ExpiryMs}
		m, err := next(st, now)
		if err != nil {
			return err
		}
		if m == old {
			continue
		}
		ins, err := moveIndex(b, p, id, old, st.Task.Spec, m, st.Task.Spec)
		if err != nil {
			return err
		}
		inserted = append(inserted, ins...)
	}
	if b.Empty() {
		return nil
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("storage: commit: %w", err)
	}
	unlock()
	s.noteReadyInserts(inserted)
	return nil
}
