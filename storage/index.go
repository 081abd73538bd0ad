package storage

import (
	"encoding/binary"
	"errors"
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

// readyQueue is one queue's ready index in one partition, in memory:
// the tasks whose index state is ready, by priority descending then id
// ascending. It is built at Open from the task and meta keys
// (buildReadyIndex) and follows every committed batch: a writer applies
// its batch's ready changes after the batch is visible and before it
// releases the ids' stripe locks (applyReady), so the changes of one id
// land in the order of its writes.
//
// Between a batch becoming visible and its changes landing, a reader may
// see the queue as it was just before; callers (the claim FSM) validate
// what they pick anyway.
type readyQueue struct {
	mu sync.Mutex
	l  readyList
}

// readyQueue returns queue's ready index in partition p, made when
// missing if create, nil otherwise.
func (s *Store) readyQueue(p uint16, queue string, create bool) *readyQueue {
	k := queueKey{p, queue}
	s.readyMu.RLock()
	q := s.ready[k]
	s.readyMu.RUnlock()
	if q != nil || !create {
		return q
	}
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if q = s.ready[k]; q == nil {
		q = &readyQueue{}
		s.ready[k] = q
	}
	return q
}

// applyReady applies a committed batch's ready changes to the in-memory
// index. The caller holds the stripe locks of every id they name, and
// calls it after the batch is visible.
func (s *Store) applyReady(changes []readyChange) {
	var q *readyQueue
	var qk queueKey
	for _, c := range changes {
		if k := (queueKey{c.p, c.queue}); q == nil || k != qk {
			if q != nil {
				q.mu.Unlock()
			}
			qk = k
			if q = s.readyQueue(c.p, c.queue, c.insert); q == nil {
				continue // a delete from a queue that holds nothing
			}
			q.mu.Lock()
		}
		if c.insert {
			q.l.insert(c.e)
		} else {
			q.l.remove(c.e)
		}
	}
	if q != nil {
		q.mu.Unlock()
	}
}

// announceReady calls Config.OnReady once per partition and queue that
// gained ready tasks. Call it after the ids' locks are released.
func (s *Store) announceReady(changes []readyChange) {
	if s.onReady == nil {
		return
	}
	var told []queueKey
	for _, c := range changes {
		if k := (queueKey{c.p, c.queue}); c.insert && !slices.Contains(told, k) {
			told = append(told, k)
			s.onReady(c.p, c.queue)
		}
	}
}

// ReadyHead returns up to limit tasks at the head of queue's ready index in
// partition p: priority descending, then id ascending. It reads memory
// only: tasks that are not ready cost nothing, nor do heads removed before.
func (s *Store) ReadyHead(p uint16, queue string, limit int) ([]ReadyEntry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("storage: ReadyHead limit %d must be positive", limit)
	}
	q := s.readyQueue(p, queue, false)
	if q == nil {
		return nil, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.l.head(limit, make([]ReadyEntry, 0, min(limit, q.l.len()))), nil
}

// dropReady forgets partition p's ready index.
func (s *Store) dropReady(p uint16) {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	for k := range s.ready {
		if k.p == p {
			delete(s.ready, k)
		}
	}
}

// buildReadyIndex fills the ready index of partition p from its task and
// meta keys: a stored task is ready when its meta key says so or when it
// has none (row.meta). Open runs it for every partition before the store
// takes writes; only the tasks without a meta key, or ready by it, are
// decoded.
func (s *Store) buildReadyIndex(p uint16) error {
	tlo, thi := tagSpan(p, tagTask)
	tasks, err := s.db.NewIter(&pebble.IterOptions{LowerBound: tlo, UpperBound: thi})
	if err != nil {
		return err
	}
	defer tasks.Close()
	mlo, mhi := tagSpan(p, tagMeta)
	metas, err := s.db.NewIter(&pebble.IterOptions{LowerBound: mlo, UpperBound: mhi})
	if err != nil {
		return err
	}
	defer metas.Close()
	byQueue := map[string][]ReadyEntry{}
	mok := metas.First()
	for ok := tasks.First(); ok; ok = tasks.Next() {
		key := tasks.Key()
		if len(key) != 3+8 {
			return corrupt(key, "bad task key")
		}
		id := idFromKey(key)
		for mok && idFromKey(metas.Key()) < id {
			mok = metas.Next()
		}
		if mok && idFromKey(metas.Key()) == id {
			mv, err := metas.ValueAndErr()
			if err != nil {
				return err
			}
			m, valid := decodeMeta(mv)
			if !valid {
				return corrupt(metas.Key(), "bad meta value %x", mv)
			}
			if m.state != IndexReady {
				continue
			}
		}
		v, err := tasks.ValueAndErr()
		if err != nil {
			return err
		}
		st, err := decodeTask(p, slices.Clone(key), v)
		if err != nil {
			return err
		}
		if st.Task.Spec == nil {
			continue
		}
		byQueue[st.Task.Spec.Queue] = append(byQueue[st.Task.Spec.Queue], ReadyEntry{ID: id, Priority: st.Task.Spec.Priority})
	}
	if err := errors.Join(tasks.Error(), metas.Error()); err != nil {
		return err
	}
	for queue, entries := range byQueue {
		q := s.readyQueue(p, queue, true)
		q.mu.Lock()
		for _, e := range entries {
			q.l.insert(e)
		}
		q.mu.Unlock()
	}
	return nil
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
