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

// queueKey names one queue of one partition.
type queueKey struct {
	p     uint16
	queue string
}

// defaultHeadCacheLen is how many ready keys a queue's head cache is filled
// with; it is trimmed back to this when inserts grow it past twice as many.
const defaultHeadCacheLen = 256

// readyHead caches the first keys of one queue's ready index in memory.
//
// Invariant: when valid, keys holds, in order, every live ready key of the
// queue that is below hi (hi == nil: up to the queue's end). Writers apply
// their changes to the cache after their batch is visible and bump version;
// a refill from Pebble installs its result only if version did not change
// while it read, so it never drops a key it could not see.
//
// The cache answers most head reads without touching Pebble, and the refill
// seeks from hi, past the heads removed since the last refill: their
// tombstones at the front of the queue's key range (the LSM tombstone trap)
// are never stepped over. After a restart the first refill starts at the
// queue's first key.
//
// Between a write becoming visible and its cache update, a reader may see
// the head as it was just before the write; callers (the claim FSM)
// validate what they pick anyway.
type readyHead struct {
	mu      sync.Mutex
	valid   bool
	keys    [][]byte
	hi      []byte // exclusive; nil = the queue's end
	version uint64
}

func (s *Store) readyHead(p uint16, queue string) *readyHead {
	k := queueKey{p, queue}
	s.headsMu.Lock()
	defer s.headsMu.Unlock()
	h, ok := s.heads[k]
	if !ok {
		h = &readyHead{}
		s.heads[k] = h
	}
	return h
}

// below reports whether key is in the range the cache covers.
func (h *readyHead) below(key []byte) bool { return h.hi == nil || bytes.Compare(key, h.hi) < 0 }

// noteReadyChanges applies ready-index changes to the head caches. Call it
// after the batch that made them is visible.
func (s *Store) noteReadyChanges(changes []readyChange) {
	for _, c := range changes {
		h := s.readyHead(c.p, c.queue)
		h.mu.Lock()
		h.version++
		if h.valid && h.below(c.key) {
			i, found := slices.BinarySearchFunc(h.keys, c.key, bytes.Compare)
			switch {
			case c.insert && !found:
				h.keys = slices.Insert(h.keys, i, c.key)
				if len(h.keys) > 2*s.headCacheLen {
					h.hi = h.keys[s.headCacheLen]
					h.keys = slices.Clip(h.keys[:s.headCacheLen])
				}
			case !c.insert && found:
				h.keys = slices.Delete(h.keys, i, i+1)
			}
		}
		h.mu.Unlock()
	}
}

// ReadyHead returns up to limit tasks at the head of queue's ready index in
// partition p: priority descending, then id ascending. It does not scan
// tasks that are not ready, and heads removed earlier cost nothing.
func (s *Store) ReadyHead(p uint16, queue string, limit int) ([]ReadyEntry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("storage: ReadyHead limit %d must be positive", limit)
	}
	h := s.readyHead(p, queue)
	h.mu.Lock()
	if h.valid && (len(h.keys) >= limit || h.hi == nil) {
		out := readyEntries(h.keys[:min(limit, len(h.keys))])
		h.mu.Unlock()
		return out, nil
	}
	// Refill: keep what the cache holds and read on from where it ends.
	version := h.version
	keys := slices.Clone(h.keys)
	from := readyQueuePrefix(p, queue)
	if h.valid {
		from = h.hi
	}
	h.mu.Unlock()

	prefix := readyQueuePrefix(p, queue)
	end := prefixEnd(prefix)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: from, UpperBound: end})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	want := max(limit, s.headCacheLen)
	var hi []byte
	for ok := it.First(); ok; ok = it.Next() {
		if len(keys) == want {
			hi = bytes.Clone(it.Key())
			break
		}
		if len(it.Key()) != len(prefix)+12 {
			return nil, corrupt(it.Key(), "short ready index key")
		}
		keys = append(keys, bytes.Clone(it.Key()))
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	if s.testHookRefillRead != nil {
		s.testHookRefillRead()
	}
	h.mu.Lock()
	if h.version == version {
		h.valid, h.keys, h.hi = true, keys, hi
	}
	h.mu.Unlock()
	return readyEntries(keys[:min(limit, len(keys))]), nil
}

func readyEntries(keys [][]byte) []ReadyEntry {
	out := make([]ReadyEntry, len(keys))
	for i, k := range keys {
		out[i] = ReadyEntry{ID: idFromKey(k), Priority: prioFromBits(binary.BigEndian.Uint32(k[len(k)-12:]))}
	}
	return out
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
	var changes []readyChange
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
		changes = append(changes, ins...)
	}
	if b.Empty() {
		return nil
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("storage: commit: %w", err)
	}
	unlock()
	s.noteReadyChanges(changes)
	return nil
}
