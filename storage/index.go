package storage

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/norn-dev/norn/crdt"
)

// ReadyEntry is one task in a queue's ready index.
type ReadyEntry struct {
	ID       uint64
	Priority int32
	Key      string // the task's fairness key ("": none)
	Weight   uint32 // the key's weight, as its spec says (0: 1)
}

// readyEntryOf is the ready index entry of task id with spec.
func readyEntryOf(id uint64, spec *crdt.Spec) ReadyEntry {
	return ReadyEntry{ID: id, Priority: spec.Priority, Key: spec.FairnessKey, Weight: spec.FairnessWeight}
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
	return lookupIndex(&s.readyMu, s.ready, queueKey{p, queue}, create, func() *readyQueue { return &readyQueue{} })
}

// lookupIndex returns m[k] under mu, made by mk when missing if create,
// nil otherwise (the maps of the in-memory indexes).
func lookupIndex[K comparable, V any](mu *sync.RWMutex, m map[K]*V, k K, create bool, mk func() *V) *V {
	mu.RLock()
	v := m[k]
	mu.RUnlock()
	if v != nil || !create {
		return v
	}
	mu.Lock()
	defer mu.Unlock()
	if v = m[k]; v == nil {
		v = mk()
		m[k] = v
	}
	return v
}

// applyIndex applies a committed batch's index changes to the in-memory
// indexes. The caller holds the stripe locks of every id they name, and
// calls it after the batch is visible.
func (s *Store) applyIndex(changes []indexChange) {
	var q *readyQueue
	var qk queueKey
	unlockQ := func() {
		if q != nil {
			q.mu.Unlock()
			q = nil
		}
	}
	defer unlockQ()
	for _, c := range changes {
		if c.tag != tagReady {
			if x := s.timeIndex(c.p, c.tag, c.insert); x != nil {
				x.mu.Lock()
				if c.insert {
					x.t.ReplaceOrInsert(c.due)
				} else {
					x.t.Delete(c.due)
				}
				x.mu.Unlock()
			}
			continue
		}
		if k := (queueKey{c.p, c.queue}); q == nil || k != qk {
			unlockQ()
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
}

// announceReady calls Config.OnReady once per partition and queue that
// gained ready tasks. Call it after the ids' locks are released.
func (s *Store) announceReady(changes []indexChange) {
	if s.onReady == nil {
		return
	}
	var told []queueKey
	for _, c := range changes {
		if k := (queueKey{c.p, c.queue}); c.tag == tagReady && c.insert && !slices.Contains(told, k) {
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

// OldestReady returns the smallest id in queue's ready index in
// partition p (the oldest ready task, ids growing with time), and false
// when it holds none. It reads memory only, O(priorities x fairness
// keys) of the queue in p (for queue statistics, not claims).
func (s *Store) OldestReady(p uint16, queue string) (uint64, bool) {
	q := s.readyQueue(p, queue, false)
	if q == nil {
		return 0, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.l.oldest()
}

// dropIndexes forgets partition p's in-memory indexes.
func (s *Store) dropIndexes(p uint16) {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	for k := range s.ready {
		if k.p == p {
			delete(s.ready, k)
		}
	}
	delete(s.times, dueKey{p, tagDelayed})
	delete(s.times, dueKey{p, tagClaimed})
	delete(s.times, dueKey{p, tagDeadline})
}

// buildIndexes fills the in-memory indexes of partition p from its task
// and meta keys: a stored task is ready when its meta key says so or when
// it has none (row.meta), delayed or claimed when its meta key says so; a
// claim recorded before its task arrived (a meta key without a task) is
// claimed too. Open runs it for every partition before the store takes
// writes; only the ready, delayed and claimed tasks are decoded (a
// claimed task's deadline is in the deadline index).
func (s *Store) buildIndexes(p uint16) error {
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
	var times []indexChange
	tok, mok := tasks.First(), metas.First()
	for tok || mok {
		if tok && len(tasks.Key()) != 3+8 {
			return corrupt(tasks.Key(), "bad task key")
		}
		if mok && len(metas.Key()) != 3+8 {
			return corrupt(metas.Key(), "bad meta key")
		}
		var id uint64
		haveTask, haveMeta := false, false
		switch {
		case !mok || (tok && idFromKey(tasks.Key()) < idFromKey(metas.Key())):
			id, haveTask = idFromKey(tasks.Key()), true
		case !tok || idFromKey(metas.Key()) < idFromKey(tasks.Key()):
			id, haveMeta = idFromKey(metas.Key()), true
		default:
			id, haveTask, haveMeta = idFromKey(tasks.Key()), true, true
		}
		m := meta{state: IndexReady} // a stored task without a meta key
		if haveMeta {
			mv, err := metas.ValueAndErr()
			if err != nil {
				return err
			}
			var valid bool
			if m, valid = decodeMeta(mv); !valid {
				return corrupt(metas.Key(), "bad meta value %x", mv)
			}
		}
		var spec *crdt.Spec
		if haveTask && m.state != IndexNone {
			v, err := tasks.ValueAndErr()
			if err != nil {
				return err
			}
			st, err := decodeTask(p, slices.Clone(tasks.Key()), v)
			if err != nil {
				return err
			}
			spec = st.Task.Spec
		}
		if m.state == IndexReady && spec != nil {
			byQueue[spec.Queue] = append(byQueue[spec.Queue], readyEntryOf(id, spec))
		}
		if tag, e, ok := timeEntry(id, m, spec); ok {
			times = append(times, indexChange{p: p, tag: tag, due: e, insert: true})
		}
		if e, ok := deadlineEntry(id, m, spec); ok {
			times = append(times, indexChange{p: p, tag: tagDeadline, due: e, insert: true})
		}
		if haveTask {
			tok = tasks.Next()
		}
		if haveMeta {
			mok = metas.Next()
		}
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
	s.applyIndex(times)
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

// DeadlinesDue returns up to limit tasks of partition p with a deadline
// at or before ms that are not terminal here, earliest first.
func (s *Store) DeadlinesDue(p uint16, ms int64, limit int) ([]DueEntry, error) {
	return s.dueBefore(p, tagDeadline, ms, limit)
}

func (s *Store) dueBefore(p uint16, tag byte, ms int64, limit int) ([]DueEntry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("storage: limit %d must be positive", limit)
	}
	if ms < 0 {
		return nil, nil
	}
	x := s.timeIndex(p, tag, false)
	if x == nil {
		return nil, nil
	}
	return x.before(ms, limit), nil
}
