package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/testhooks"
)

// The retention index (store format 7): a key per terminal task,
//
//	p 0x0b queue 0x00 terminalMs id -> (empty)
//
// under its queue ("" for a task stored without a spec), so that each
// queue's terminal tasks are one span in the order they ended, and a
// retention pass deletes every queue's expired tasks from the front of
// its span at its own horizon (QueueSettings.retention, issue 43) without
// reading another queue's. terminalMs is the wall time of the task's
// deciding terminal event. The key is moved with the task's merges
// (moveTerminalKey: an earlier terminal event, or the spec's arrival,
// moves it) and deleted with the task (DeleteTasks). Before format 7 the
// index was one span per partition, p 0x07 terminalMs id; the upgrade
// rebuilds it from the task keys (upgradeTerminalIndex).

// Horizons are retention horizons (Unix ms): a terminal task whose
// deciding terminal event is before its queue's horizon is deleted.
type Horizons struct {
	// Default is the horizon of every queue not in Queues: now minus the
	// node's retention.
	Default int64
	// Queues holds the horizons of the queues with a retention of their
	// own (QueueSettings.retention).
	Queues map[string]int64
}

// Of returns queue's horizon.
func (h Horizons) Of(queue string) int64 {
	if ms, ok := h.Queues[queue]; ok {
		return ms
	}
	return h.Default
}

// Later returns the later of h's and o's horizon for every queue, the
// queues of both.
func (h Horizons) Later(o Horizons) Horizons {
	out := Horizons{Default: max(h.Default, o.Default)}
	for q := range h.Queues {
		out.set(q, max(h.Of(q), o.Of(q)))
	}
	for q := range o.Queues {
		out.set(q, max(h.Of(q), o.Of(q)))
	}
	return out
}

func (h *Horizons) set(q string, ms int64) {
	if h.Queues == nil {
		h.Queues = map[string]int64{}
	}
	h.Queues[q] = ms
}

// terminalPrefix is the span of queue's retention keys in partition p.
func terminalPrefix(p uint16, queue string) []byte {
	k := append(partitionPrefix(p, tagTerminalQ), queue...)
	return append(k, 0)
}

// queueOfTask is t's queue in the retention index: its spec's, "" when
// it has none.
func queueOfTask(t *crdt.Task) string {
	if t.Spec == nil {
		return ""
	}
	return t.Spec.Queue
}

// terminalKey is the retention index key of a terminal task. nil when not
// terminal.
func terminalKey(p uint16, t *crdt.Task) []byte {
	ev, ok := t.Terminal()
	if !ok {
		return nil
	}
	k := binary.BigEndian.AppendUint64(terminalPrefix(p, queueOfTask(t)), uint64(max(ev.At.WallMs, 0)))
	return binary.BigEndian.AppendUint64(k, t.ID)
}

// retentionKey is terminalKey, or with the seeded bug
// RetentionFromEnqueue the key at the task's enqueue time.
func (s *Store) retentionKey(p uint16, t *crdt.Task) []byte {
	k := terminalKey(p, t)
	if !(testhooks.Built && s.early) || k == nil || t.Spec == nil {
		return k
	}
	k = binary.BigEndian.AppendUint64(terminalPrefix(p, queueOfTask(t)), uint64(max(t.Spec.CreatedAt.WallMs, 0)))
	return binary.BigEndian.AppendUint64(k, t.ID)
}

// parseTerminalKey splits a retention key of partition p into its queue,
// time and id.
func parseTerminalKey(k []byte) (queue string, ms int64, id uint64, err error) {
	if len(k) < 3+1+16 || k[2] != tagTerminalQ {
		return "", 0, 0, corrupt(k, "bad retention index key")
	}
	body := k[3 : len(k)-16]
	if body[len(body)-1] != 0 || bytes.IndexByte(body, 0) != len(body)-1 {
		return "", 0, 0, corrupt(k, "bad retention index key")
	}
	ms = int64(binary.BigEndian.Uint64(k[len(k)-16:]))
	return string(body[:len(body)-1]), ms, binary.BigEndian.Uint64(k[len(k)-8:]), nil
}

// moveTerminalKey keeps the retention index in step with a merge (an
// earlier terminal event arriving later, or the spec, moves the key).
func (s *Store) moveTerminalKey(b *sortedBatch, p uint16, old *StoredTask, out *crdt.Task) error {
	var oldKey []byte
	if old != nil {
		oldKey = s.retentionKey(p, old.Task)
	}
	newKey := s.retentionKey(p, out)
	if bytes.Equal(oldKey, newKey) {
		return nil
	}
	if oldKey != nil {
		if err := b.Delete(oldKey); err != nil {
			return err
		}
	}
	if newKey != nil {
		return b.Set(newKey, nil)
	}
	return nil
}

// terminalBounds keeps, per partition, the earliest time of each queue's
// retention span, so that the monitor's pass over every partition every
// 250 ms opens no iterator when nothing is due. With 1,024 idle
// partitions per node those iterators were about 7% of an idle node's
// CPU (docs/SCALING.md).
//
// A queue's bound is lowered after every commit that inserted a key of
// it (once the key is visible), and set only by a scan: the full scan of
// a partition (scanQueues, which sees every queue's first key) makes the
// partition's table known; a queue's deletion pass sets its bound to the
// first key it left. Every lowering bumps the partition's version, and a
// scan sets bounds only if the version did not change since it began, so
// a key committed while it read (which it may not have seen) is never
// hidden: either the lowering came after, or the scan's result is
// dropped (the next pass scans again). Unknown (after an open or a
// drop): scan.
type terminalBounds struct {
	mu    sync.Mutex
	parts map[uint16]*partBounds
}

type partBounds struct {
	known   bool             // queues holds every queue of the span (a full scan saw it)
	queues  map[string]int64 // a queue's earliest time; absent: none (when known)
	version uint64
}

func (d *terminalBounds) part(p uint16) *partBounds {
	if d.parts == nil {
		d.parts = map[uint16]*partBounds{}
	}
	b := d.parts[p]
	if b == nil {
		b = &partBounds{queues: map[string]int64{}}
		d.parts[p] = b
	}
	return b
}

// lower lowers the bounds for the retention keys the ops insert.
func (d *terminalBounds) lower(ops []batchOp) {
	var locked bool
	for _, op := range ops {
		if op.del || op.absent || len(op.key) < 3 || op.key[2] != tagTerminalQ {
			continue
		}
		q, ms, _, err := parseTerminalKey(op.key)
		if err != nil {
			continue
		}
		if !locked {
			d.mu.Lock()
			defer d.mu.Unlock()
			locked = true
		}
		b := d.part(binary.BigEndian.Uint16(op.key))
		if cur, ok := b.queues[q]; !ok || ms < cur {
			b.queues[q] = ms
		}
		b.version++
	}
}

// due returns the queues of partition p with a key before their horizon
// in h, and whether the table is known (when not, the caller scans); and
// the version to pass to set.
func (d *terminalBounds) due(p uint16, h Horizons) (queues []string, known bool, version uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.part(p)
	if !b.known {
		return nil, false, b.version
	}
	for q, ms := range b.queues {
		if ms < h.Of(q) {
			queues = append(queues, q)
		}
	}
	return queues, true, b.version
}

// version is partition p's version (bumped by every insert), to pass to
// setQueue after a scan.
func (d *terminalBounds) version(p uint16) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.part(p).version
}

// setAll makes partition p's table the result of a full scan (queue ->
// earliest time) unless a key was inserted since it began.
func (d *terminalBounds) setAll(p uint16, version uint64, queues map[string]int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if b := d.part(p); b.version == version {
		b.known, b.queues = true, queues
	}
}

// setQueue sets queue's bound in partition p to ms (emptyIndex: none
// left) unless a key was inserted since the scan began.
func (d *terminalBounds) setQueue(p uint16, version uint64, queue string, ms int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.part(p)
	if b.version != version {
		return
	}
	if ms == emptyIndex {
		delete(b.queues, queue)
	} else {
		b.queues[queue] = ms
	}
}

// forget makes partition p's table unknown (a drop).
func (d *terminalBounds) forget(p uint16) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if b := d.parts[p]; b != nil {
		b.known, b.queues = false, map[string]int64{}
		b.version++
	}
}

// emptyIndex is the bound of an index seen empty.
const emptyIndex = 1<<63 - 1

// scanQueues reads the first key of every queue's span of partition p
// (one seek per queue): each queue's earliest time.
func (s *Store) scanQueues(p uint16) (map[string]int64, error) {
	lo, hi := tagSpan(p, tagTerminalQ)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	out := map[string]int64{}
	for ok := it.First(); ok; {
		q, ms, _, err := parseTerminalKey(it.Key())
		if err != nil {
			return nil, err
		}
		out[q] = ms
		ok = it.SeekGE(prefixEnd(terminalPrefix(p, q)))
	}
	return out, it.Error()
}

// terminalDue returns up to limit terminal tasks of queue in partition p
// whose deciding terminal event is before ms, oldest first, and the
// earliest time left in the queue's span after them (emptyIndex: none).
func (s *Store) terminalDue(p uint16, queue string, ms int64, limit int) ([]DueEntry, int64, error) {
	prefix := terminalPrefix(p, queue)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return nil, 0, err
	}
	defer it.Close()
	var out []DueEntry
	next := int64(emptyIndex)
	for ok := it.First(); ok; ok = it.Next() {
		_, at, id, err := parseTerminalKey(it.Key())
		if err != nil {
			return nil, 0, err
		}
		if at >= ms || len(out) == limit {
			next = at
			break
		}
		out = append(out, DueEntry{ID: id, AtMs: at})
	}
	return out, next, it.Error()
}

// TerminalBefore returns up to limit terminal tasks of partition p whose
// deciding terminal event is at or before ms, queue by queue, oldest
// first within each: the candidates for deletion at one horizon for
// every queue.
func (s *Store) TerminalBefore(p uint16, ms int64, limit int) ([]DueEntry, error) {
	queues, err := s.scanQueues(p)
	if err != nil {
		return nil, err
	}
	var out []DueEntry
	for q := range queues {
		due, _, err := s.terminalDue(p, q, ms+1, limit-len(out))
		if err != nil {
			return nil, err
		}
		out = append(out, due...)
		if len(out) == limit {
			break
		}
	}
	return out, nil
}

// deleteHorizons is the discard rule of retention: a state whose deciding
// terminal event is before its queue's horizon counts as deleted. A merge
// of such a state into a replica that does not hold the task stores
// nothing, so a stale copy (read repair, a late write, anti-entropy from
// a replica that has not deleted it yet) never brings a deleted task
// back. It is kept in memory: after a restart the first retention pass
// sets it again.
type deleteHorizons struct {
	mu  sync.Mutex // serializes raises
	cur atomic.Pointer[Horizons]
}

// RaiseDeleteHorizons raises the store's delete horizons to h: every
// queue's horizon (those named in h, and those the store already has one
// for) to h's for it, never lowering one. A queue that gets a horizon of
// its own starts from the one it had (the default's), so a longer
// retention set later never lets back a task deleted before.
func (s *Store) RaiseDeleteHorizons(h Horizons) {
	d := &s.deleteHorizon
	d.mu.Lock()
	defer d.mu.Unlock()
	cur := d.cur.Load()
	if cur == nil {
		cur = &Horizons{}
	}
	next := &Horizons{Default: max(cur.Default, h.Default), Queues: maps.Clone(cur.Queues)}
	for q := range cur.Queues {
		next.Queues[q] = max(cur.Queues[q], h.Of(q))
	}
	for q, ms := range h.Queues {
		if _, ok := cur.Queues[q]; !ok {
			next.set(q, max(cur.Default, ms))
		}
	}
	if next.Default == cur.Default && maps.Equal(next.Queues, cur.Queues) && d.cur.Load() != nil {
		return // nothing rose (the monitor's passes, four a second per partition)
	}
	d.cur.Store(next)
}

// RaiseDeleteHorizon raises the store's delete horizon of every queue to
// ms (RaiseDeleteHorizons of a default alone).
func (s *Store) RaiseDeleteHorizon(ms int64) { s.RaiseDeleteHorizons(Horizons{Default: ms}) }

// DeleteHorizons returns the store's delete horizons (zero before the
// first raise).
func (s *Store) DeleteHorizons() Horizons {
	if h := s.deleteHorizon.cur.Load(); h != nil {
		return *h
	}
	return Horizons{}
}

// DeleteHorizon returns the store's default delete horizon (Unix ms; 0
// before the first raise).
func (s *Store) DeleteHorizon() int64 { return s.DeleteHorizons().Default }

// pastHorizon reports whether t is terminal with its deciding event before
// its queue's delete horizon.
func (s *Store) pastHorizon(t *crdt.Task) bool {
	ev, ok := t.Terminal()
	if !ok {
		return false
	}
	h := s.deleteHorizon.cur.Load()
	return h != nil && ev.At.WallMs < h.Of(queueOfTask(t))
}

// DeleteTerminalBefore is DeleteExpired at the horizon ms for every queue.
func (s *Store) DeleteTerminalBefore(p uint16, ms int64, batch int, forget func(ids []uint64) error) (int, error) {
	return s.DeleteExpired(p, Horizons{Default: ms}, batch, forget)
}

// DeleteExpired raises the delete horizons to h and deletes every
// terminal task of partition p whose deciding terminal event is before
// its queue's horizon, in batches of batch. It returns how many it
// deleted. The claim FSM's records are not touched: forget, if not nil,
// runs before each batch is deleted (the partition's leader forgets
// their records through Raft) and its error stops the deletion.
func (s *Store) DeleteExpired(p uint16, h Horizons, batch int, forget func(ids []uint64) error) (int, error) {
	if batch <= 0 {
		return 0, errors.New("storage: DeleteExpired batch must be positive")
	}
	s.RaiseDeleteHorizons(h)
	queues, known, version := s.terminal.due(p, h)
	if !known {
		all, err := s.scanQueues(p)
		if err != nil {
			return 0, err
		}
		s.terminal.setAll(p, version, maps.Clone(all))
		queues = queues[:0]
		for q, ms := range all {
			if ms < h.Of(q) {
				queues = append(queues, q)
			}
		}
	}
	deleted := 0
	for _, q := range queues {
		for {
			version := s.terminal.version(p)
			due, next, err := s.terminalDue(p, q, h.Of(q), batch)
			if err != nil {
				return deleted, err
			}
			if len(due) > 0 {
				ids := make([]uint64, len(due))
				for i, d := range due {
					ids[i] = d.ID
				}
				if forget != nil {
					if err := forget(ids); err != nil {
						return deleted, err
					}
				}
				if err := s.DeleteTasks(p, ids); err != nil {
					return deleted, err
				}
				deleted += len(ids)
			}
			if len(due) < batch {
				s.terminal.setQueue(p, version, q, next)
				break
			}
		}
	}
	return deleted, nil
}

// upgradeTerminalIndex replaces the retention index of every partition
// of a store written before format 7 (one span per partition, p 0x07
// terminalMs id) with the per-queue one, built from the task keys: one
// pass, committed in batches, progress logged every million tasks.
// Nothing else writes to the store meanwhile (Open runs it); a crash
// before the format key is written runs it again from scratch.
func (s *Store) upgradeTerminalIndex() error {
	began := time.Now()
	indexed, logged := 0, 0
	for p, ok, err := s.nextPartition(0); ok || err != nil; p, ok, err = s.nextPartition(uint32(p) + 1) {
		if err != nil {
			return err
		}
		n, err := s.buildTerminalIndex(p, func(n int) {
			if indexed+n >= logged+queueIndexLogEvery {
				logged = indexed + n
				s.log.Info("building the per-queue retention index (store format 7)", "tasks", logged, "partition", p, "took", time.Since(began).Round(time.Millisecond))
			}
		})
		if err != nil {
			return fmt.Errorf("storage: building the retention index of partition %d: %w", p, err)
		}
		indexed += n
	}
	if indexed > 0 {
		s.log.Info("built the per-queue retention index (store format 7)", "terminal tasks", indexed, "took", time.Since(began).Round(time.Millisecond))
	}
	return nil
}

// buildTerminalIndex replaces partition p's retention index (both forms)
// with one built from its task keys, and returns how many terminal tasks
// it indexed. progress is called after each commit with the count so far.
func (s *Store) buildTerminalIndex(p uint16, progress func(n int)) (int, error) {
	return s.buildIndex(p, []byte{tagTerminal, tagTerminalQ}, progress, func(t *crdt.Task) []byte { return s.retentionKey(p, t) })
}
