package storage

import (
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/testhooks"
)

// MergeItem is one task state to merge into partition Partition.
type MergeItem struct {
	Partition uint16
	Task      *crdt.Task
	// Encoding, when not nil, is Task's canonical encoding (the bytes
	// crdt.Decode made Task from, or Task.Encode's): a task new to this
	// replica is stored as these bytes rather than encoded again. A
	// replicated write is encoded once, by its coordinator.
	Encoding []byte
}

// MergeResult reports what a merge did to one task.
type MergeResult struct {
	ID           uint64
	Existed      bool   // the replica held a state for the id before
	OldDigest    uint64 // digest before the merge; 0 when !Existed
	NewDigest    uint64 // digest after the merge
	SpecConflict bool   // the stored and incoming specs differed (see crdt.Join)
}

// Changed reports whether the merge changed the stored state.
func (r MergeResult) Changed() bool { return !r.Existed || r.OldDigest != r.NewDigest }

// MergeTask joins t into the state stored for t.ID in partition p and
// writes the result, with its meta, retention and queue index keys and
// counters, in one synced batch. See MergeTasks.
func (s *Store) MergeTask(p uint16, t *crdt.Task) (MergeResult, error) {
	res, err := s.MergeTasks([]MergeItem{{Partition: p, Task: t}})
	if err != nil {
		return MergeResult{}, err
	}
	return res[0], nil
}

// MergeTasks joins every item into its stored state and commits all of them
// in one synced batch (one fsync for the whole batch, shared with concurrent
// callers by Pebble's group commit). When it returns nil, every result is
// durable. Results are in item order; items for the same task are joined
// together first and report the same result.
//
// Per task the write is a read-modify-write under a per-id lock: concurrent
// merges of one id never lose each other's events.
func (s *Store) MergeTasks(items []MergeItem) ([]MergeResult, error) {
	return s.mergeTasks(items, true)
}

// mergeTasks is MergeTasks; with sync false it commits without waiting for
// the WAL's sync (the claim FSM's merges, which the Raft log makes
// durable: see ClaimFSMUpdate.Merges).
func (s *Store) mergeTasks(items []MergeItem, sync bool) ([]MergeResult, error) {
	// Lock the stripes of every id, in order, so that batches cannot
	// deadlock each other.
	ids := make([]uint64, len(items))
	for i, it := range items {
		ids[i] = it.Task.ID
	}
	s.dropMu.RLock()
	for _, it := range items {
		if s.dropped[it.Partition] {
			s.dropMu.RUnlock()
			return nil, fmt.Errorf("%w: partition %d", ErrPartitionDropped, it.Partition)
		}
	}
	unlockIDs := s.lockIDs(ids)
	unlock := func() { unlockIDs(); s.dropMu.RUnlock() }

	results, batch, ops, changes, digests, err := s.prepareMerge(items)
	if err != nil {
		unlock()
		return nil, err
	}
	if batch == nil {
		// Nothing changed. An earlier write of these states may be visible
		// but not yet synced (see below), so sync the WAL before acking.
		unlock()
		if !sync || (testhooks.Built && s.noSync) {
			return results, nil // not asked to, or the seeded bug: no sync
		}
		if err := s.db.LogData(nil, pebble.Sync); err != nil {
			return nil, fmt.Errorf("storage: sync: %w", err)
		}
		return results, nil
	}
	// Publish under the locks, then release them before waiting for the
	// fsync, so that the next writer of the same ids pipelines behind this
	// batch instead of waiting out its fsync. Pebble makes a batch visible
	// before its WAL sync either way. The seeded bug AckBeforeSync commits
	// without a sync.
	if !sync || (testhooks.Built && s.noSync) {
		err = s.db.Apply(batch, pebble.NoSync)
		sync = false
	} else {
		err = s.db.ApplyNoSyncWait(batch, pebble.Sync)
	}
	if err == nil {
		s.notifyDigests(digests)
		s.rows.apply(ops)
		s.terminal.lower(ops)
		s.applyIndex(changes)
	}
	unlock()
	if err == nil {
		s.announceReady(changes)
		if sync {
			err = batch.SyncWait()
		}
	}
	batch.Close()
	if err != nil {
		return nil, fmt.Errorf("storage: commit: %w", err)
	}
	return results, nil
}

// prepareMerge reads the stored states, joins, and builds the batch. It
// returns a nil batch when no state changed. The caller holds the stripes.
func (s *Store) prepareMerge(items []MergeItem) ([]MergeResult, *pebble.Batch, []batchOp, []indexChange, []digestChange, error) {
	type key struct {
		p  uint16
		id uint64
	}
	// Join duplicates first so that each task is read and written once.
	// By index of order: the task, and its encoding if given (not
	// joined with a duplicate).
	at := make(map[key]int, len(items))
	order := make([]key, 0, len(items))
	merged := make([]*crdt.Task, 0, len(items))
	encs := make([][]byte, 0, len(items))
	conflicts := make(map[key]bool)
	for _, it := range items {
		k := key{it.Partition, it.Task.ID}
		i, ok := at[k]
		if !ok {
			at[k] = len(order)
			order = append(order, k)
			merged = append(merged, it.Task)
			encs = append(encs, it.Encoding)
			continue
		}
		j, conflict, err := crdt.Join(merged[i], it.Task)
		if err != nil {
			return nil, nil, nil, nil, nil, err
		}
		merged[i], encs[i] = j, nil
		conflicts[k] = conflicts[k] || conflict
	}

	now := s.clock.Now().UnixMilli()
	// A new task writes its task key and notes its meta key absent.
	sb := sortedBatch{ops: make([]batchOp, 0, 2*len(order))}
	changes := make([]indexChange, 0, len(order))
	digests := make([]digestChange, 0, len(order))
	byOrder := make([]MergeResult, len(order))
	// Which tasks are new here, decided for all before any horizon rises.
	unseen := make([]bool, len(order))
	for i, k := range order {
		var err error
		if unseen[i], err = s.horizons.above(k.p, k.id); err != nil {
			return nil, nil, nil, nil, nil, err
		}
	}
	for i, k := range order {
		in := merged[i]
		res := MergeResult{ID: k.id, SpecConflict: conflicts[k]}
		var old *StoredTask
		var err error
		var stored row // what the task's keys hold; zero when unseen
		if !unseen[i] {
			if stored, err = s.readRow(k.p, k.id); err != nil {
				return nil, nil, nil, nil, nil, err
			}
			if stored.enc != nil {
				if old, err = stored.storedTask(k.p, k.id); err != nil {
					return nil, nil, nil, nil, nil, err
				}
			}
		}
		out := in
		if old != nil {
			res.Existed, res.OldDigest = true, old.Digest
			j, conflict, err := crdt.Join(old.Task, in)
			if err != nil {
				return nil, nil, nil, nil, nil, err
			}
			out = j
			res.SpecConflict = res.SpecConflict || conflict
		} else if encs[i] == nil {
			out = cloneNormalized(in)
		} // else in is canonical: its encoding is given
		enc := encs[i]
		if out != in || enc == nil {
			enc = out.Encode()
		}
		res.NewDigest = crdt.Digest(enc)
		byOrder[i] = res
		if !res.Changed() {
			continue
		}
		if old == nil && s.pastHorizon(out) {
			continue // deleted by retention: not brought back
		}
		digests = append(digests, digestChange{p: k.p, id: k.id, old: res.OldDigest, had: res.Existed, new: res.NewDigest, has: true})
		if err := sb.Set(taskKey(k.p, k.id), enc); err != nil {
			return nil, nil, nil, nil, nil, err
		}
		var oldMeta meta
		var oldSpec *crdt.Spec
		if old != nil {
			oldMeta = meta{state: old.Index, expiryMs: old.ExpiryMs, dueMs: old.DueMs}
			oldSpec = old.Task.Spec
		} else {
			oldMeta = stored.m
		}
		if err := moveQueueKey(&sb, k.p, k.id, oldSpec, out.Spec); err != nil {
			return nil, nil, nil, nil, nil, err
		}
		if err := s.moveTerminalKey(&sb, k.p, old, out); err != nil {
			return nil, nil, nil, nil, nil, err
		}
		newMeta := placeAfterMerge(oldMeta, oldSpec, out, now)
		var oldTask *crdt.Task
		if old != nil {
			oldTask = old.Task
		}
		if err := sb.recount(k.p, k.id, oldTask, oldMeta, out, newMeta); err != nil {
			return nil, nil, nil, nil, nil, err
		}
		if old != nil && newMeta == oldMeta && sameIndexFields(oldSpec, out.Spec) {
			// The task stays where it is (a completion of a claimed
			// task, an update, a replayed state): its meta and index
			// keys are written already.
			continue
		}
		ins, err := s.moveIndex(&sb, k.p, k.id, oldMeta, oldSpec, newMeta, out.Spec, stored.mFound)
		if err != nil {
			return nil, nil, nil, nil, nil, err
		}
		changes = append(changes, ins...)
	}
	results := make([]MergeResult, len(items))
	for i, it := range items {
		results[i] = byOrder[at[key{it.Partition, it.Task.ID}]]
	}
	if sb.Empty() {
		return results, nil, nil, changes, digests, nil
	}
	batch, err := sb.build(s.db)
	if err != nil {
		return nil, nil, nil, nil, nil, err
	}
	return results, batch, sb.ops, changes, digests, nil
}

// DeleteTasks deletes tasks of partition p: their state, meta, index
// entries (the retention and queue index keys among them), in one synced
// batch. The claim FSM's records
// are the FSM's to delete (through Raft). Missing ids are skipped.
func (s *Store) DeleteTasks(p uint16, ids []uint64) error {
	var digests []digestChange
	return s.commitMoves(p, ids, func(b *sortedBatch) ([]indexChange, error) {
		var changes []indexChange
		for _, id := range ids {
			ti, err := s.loadIndex(p, id)
			if err != nil {
				return nil, err
			}
			if ti.task == nil && !ti.metaFound {
				continue
			}
			if err := b.recount(p, id, ti.task, ti.m, nil, meta{}); err != nil {
				return nil, err
			}
			var spec *crdt.Spec
			if ti.task != nil {
				spec = ti.task.Spec
				digests = append(digests, digestChange{p: p, id: id, old: ti.digest(), had: true})
				if err := moveQueueKey(b, p, id, spec, nil); err != nil {
					return nil, err
				}
				for _, k := range [][]byte{taskKey(p, id), s.retentionKey(p, ti.task)} {
					if k != nil {
						if err := b.Delete(k); err != nil {
							return nil, err
						}
					}
				}
			}
			changes = append(changes, indexMoves(p, id, ti.m, spec, meta{}, nil)...)
			if ti.metaFound {
				if err := b.Delete(metaKey(p, id)); err != nil {
					return nil, err
				}
			} else {
				b.NoteAbsent(metaKey(p, id))
			}
		}
		return changes, nil
	}, &digests)
}

// cloneNormalized returns t in canonical form without modifying the
// caller's slices.
func cloneNormalized(t *crdt.Task) *crdt.Task {
	c := &crdt.Task{ID: t.ID, Spec: t.Spec,
		Updates: slices.Clone(t.Updates), Terminals: slices.Clone(t.Terminals), Failures: slices.Clone(t.Failures), Revivals: slices.Clone(t.Revivals)}
	c.Normalize()
	return c
}

// placeAfterMerge decides the index state of a task after a merge. A
// claimed task stays claimed, terminal or not (the claimed index belongs to
// the claim FSM, which releases it); a terminal task or one without a spec
// is in no index; a task already ready or
// delayed stays so unless its spec changed (a resolved spec conflict); a
// task seen with a spec for the first time is delayed when its not-before
// time is after now, ready otherwise.
func placeAfterMerge(old meta, oldSpec *crdt.Spec, t *crdt.Task, nowMs int64) meta {
	if old.state == IndexClaimed {
		return old
	}
	if _, terminal := t.Terminal(); terminal || t.Spec == nil {
		return meta{state: IndexNone}
	}
	if old.state != IndexNone && sameIndexFields(oldSpec, t.Spec) {
		return old
	}
	if old.state == IndexDelayed && old.dueMs > nowMs {
		return old // a retry's backoff outlasts a change of spec
	}
	return initialPlacement(t.Spec, nowMs)
}

// sameIndexFields reports whether two specs put a task at the same index
// keys.
func sameIndexFields(a, b *crdt.Spec) bool {
	return a != nil && b != nil && a.Queue == b.Queue && a.Priority == b.Priority && a.NotBeforeMs == b.NotBeforeMs
}

func initialPlacement(spec *crdt.Spec, nowMs int64) meta {
	if spec.NotBeforeMs > nowMs {
		return meta{state: IndexDelayed}
	}
	return meta{state: IndexReady}
}
