package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/norn-dev/norn/crdt"
)

// StoredTask is a task as this replica holds it.
type StoredTask struct {
	Partition uint16
	Task      *crdt.Task
	Digest    uint64     // crdt.Digest of the stored encoding
	Index     IndexState // local index placement
	ExpiryMs  int64      // lease expiry when Index is IndexClaimed
	DueMs     int64      // when Index is IndexDelayed by a retry: its backoff's end
}

// GetTask returns the state of id in partition p with its digest and index
// state, or ErrNotFound.
func (s *Store) GetTask(p uint16, id uint64) (*StoredTask, error) {
	return s.getTask(p, id)
}

// TaskState returns only the CRDT state of id in partition p, or
// ErrNotFound: one point read, for callers that need neither the digest
// nor the index state (the node's request paths).
func (s *Store) TaskState(p uint16, id uint64) (*crdt.Task, error) {
	if r, ok := s.rows.lookup(p, id); ok {
		if r.enc == nil {
			return nil, ErrNotFound
		}
		return decodeTaskState(taskKey(p, id), id, r.enc)
	}
	enc, err := s.get(taskKey(p, id))
	if err != nil {
		return nil, err
	}
	return decodeTaskState(taskKey(p, id), id, enc)
}

func decodeTaskState(key []byte, id uint64, enc []byte) (*crdt.Task, error) {
	t, err := crdt.Decode(enc)
	if err != nil {
		return nil, corrupt(key, "%v", err)
	}
	if t.ID != id {
		return nil, corrupt(key, "stored task has id %d", t.ID)
	}
	return t, nil
}

func (s *Store) getTask(p uint16, id uint64) (*StoredTask, error) {
	if r, ok := s.rows.lookup(p, id); ok {
		return r.storedTask(p, id)
	}
	key := taskKey(p, id)
	enc, err := s.get(key)
	if err != nil {
		return nil, err
	}
	m, found, err := s.getMeta(p, id)
	if err != nil {
		return nil, err
	}
	return row{enc: enc, m: m, mFound: found}.storedTask(p, id)
}

// readRow reads what id's task and meta keys hold, from the row cache or
// from Pebble. The caller holds id's stripe lock: a row read from Pebble
// goes into the cache.
func (s *Store) readRow(p uint16, id uint64) (row, error) {
	if r, ok := s.rows.lookup(p, id); ok {
		return r, nil
	}
	gen := s.rows.gen(p)
	enc, err := s.get(taskKey(p, id))
	switch {
	case errors.Is(err, ErrNotFound):
		enc = nil
	case err != nil:
		return row{}, err
	}
	m, found, err := s.getMeta(p, id)
	if err != nil {
		return row{}, err
	}
	r := row{enc: enc, m: m, mFound: found}
	s.rows.fill(p, id, r, gen)
	return r, nil
}

// storedTask decodes a row that holds a task; ErrNotFound when it holds
// none.
func (r row) storedTask(p uint16, id uint64) (*StoredTask, error) {
	if r.enc == nil {
		return nil, ErrNotFound
	}
	st, err := decodeTask(p, taskKey(p, id), r.enc)
	if err != nil {
		return nil, err
	}
	m := r.meta()
	st.Index, st.ExpiryMs, st.DueMs = m.state, m.expiryMs, m.dueMs
	return st, nil
}

// meta returns the row's index state: its meta key's value, or for a task
// stored without one, ready (moveIndex writes no meta key for a ready
// task that has none). Before this rule every stored task had a meta key,
// so data written before it reads the same.
func (r row) meta() meta {
	if !r.mFound && r.enc != nil {
		return meta{state: IndexReady}
	}
	return r.m
}

// getMeta returns the meta key of id. A claim can be recorded (by the
// claim FSM) before the task's state reaches this replica, so meta may
// exist without a task; a ready task may have none (row.meta).
func (s *Store) getMeta(p uint16, id uint64) (m meta, found bool, err error) {
	if r, ok := s.rows.lookup(p, id); ok {
		return r.m, r.mFound, nil
	}
	mv, err := s.get(metaKey(p, id))
	switch {
	case errors.Is(err, ErrNotFound):
		return meta{}, false, nil
	case err != nil:
		return meta{}, false, err
	}
	m, ok := decodeMeta(mv)
	if !ok {
		return meta{}, false, corrupt(metaKey(p, id), "bad meta value %x", mv)
	}
	return m, true, nil
}

// decodeTask decodes the task stored at key, without its index state.
func decodeTask(p uint16, key, enc []byte) (*StoredTask, error) {
	if len(key) != len(taskKey(p, 0)) {
		return nil, corrupt(key, "bad task key")
	}
	t, err := decodeTaskState(key, idFromKey(key), enc)
	if err != nil {
		return nil, err
	}
	return &StoredTask{Partition: p, Task: t, Digest: crdt.Digest(enc)}, nil
}

// get returns a copy of the value at key, or ErrNotFound.
func (s *Store) get(key []byte) ([]byte, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("storage: get %x: %w", key, err)
	}
	out := bytes.Clone(v)
	if out == nil {
		out = []byte{}
	}
	closer.Close()
	return out, nil
}

func corrupt(key []byte, format string, args ...any) error {
	return fmt.Errorf("%w: key %x: %s", ErrCorrupt, key, fmt.Sprintf(format, args...))
}

// ScanTasks returns up to limit tasks of partition p with id >= start, in id
// order, without their index state (Index is IndexNone). next is the id to
// pass as start for the following page; more is false on the last page.
func (s *Store) ScanTasks(p uint16, start uint64, limit int) (tasks []*StoredTask, next uint64, more bool, err error) {
	return s.scanTasks(p, start, limit, false)
}

// ScanTasksBack is ScanTasks backwards: up to limit tasks of partition p
// with id <= from, newest (highest id) first; next is the id to pass as
// from for the following page.
func (s *Store) ScanTasksBack(p uint16, from uint64, limit int) (tasks []*StoredTask, next uint64, more bool, err error) {
	return s.scanTasks(p, from, limit, true)
}

func (s *Store) scanTasks(p uint16, from uint64, limit int, back bool) (tasks []*StoredTask, next uint64, more bool, err error) {
	if limit <= 0 {
		return nil, 0, false, fmt.Errorf("storage: ScanTasks limit %d must be positive", limit)
	}
	lo, end := tagSpan(p, tagTask)
	bounds := &pebble.IterOptions{LowerBound: taskKey(p, from), UpperBound: end}
	if back {
		bounds = &pebble.IterOptions{LowerBound: lo, UpperBound: idBound(taskKey(p, from))}
	}
	it, err := s.db.NewIter(bounds)
	if err != nil {
		return nil, 0, false, err
	}
	defer it.Close()
	first, step := it.First, it.Next
	if back {
		first, step = it.Last, it.Prev
	}
	for ok := first(); ok; ok = step() {
		if len(tasks) == limit {
			return tasks, idFromKey(it.Key()), true, nil
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, 0, false, err
		}
		st, err := decodeTask(p, it.Key(), v)
		if err != nil {
			return nil, 0, false, err
		}
		tasks = append(tasks, st)
	}
	return tasks, 0, false, it.Error()
}

func idFromKey(k []byte) uint64 { return binary.BigEndian.Uint64(k[len(k)-8:]) }
