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
	defer s.announceReady(changes)
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

// announceReady calls Config.OnReady once per partition and queue that
// gained ready tasks.
func (s *Store) announceReady(changes []readyChange) {
	if s.onReady == nil {
		return
	}
	type pq struct {
		p     uint16
		queue string
	}
	var told []pq
	for _, c := range changes {
		if k := (pq{c.p, c.queue}); c.insert && !slices.Contains(told, k) {
			told = append(told, k)
			s.onReady(c.p, c.queue)
		}
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
	// Render the answer before installing keys: once installed, writers
	// insert into and delete from its backing array under h.mu.
	out := readyEntries(keys[:min(limit, len(keys))])
	if s.testHookRefillRead != nil {
		s.testHookRefillRead()
	}
	h.mu.Lock()
	if h.version == version {
		h.valid, h.keys, h.hi = true, keys, hi
	}
	h.mu.Unlock()
	return out, nil
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
	k := dueKey{p, tag}
	skip, version := s.due.nothingDue(k, ms)
	if skip {
		return nil, nil
	}
	start, end := tagSpan(p, tag)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []DueEntry
	next := int64(emptyIndex) // the earliest time in the index
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		k := it.Key()
		if len(k) != 3+8+8 {
			return nil, corrupt(k, "bad time index key")
		}
		e := DueEntry{ID: idFromKey(k), AtMs: int64(binary.BigEndian.Uint64(k[3:11]))}
		next = min(next, e.AtMs)
		if e.AtMs > ms {
			break
		}
		out = append(out, e)
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	s.due.raise(k, version, next)
	return out, nil
}
