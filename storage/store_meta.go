package storage

import (
	"encoding/binary"
	"fmt"

	"github.com/norn-dev/norn/crdt"
)

// IndexState is where a task currently sits in this replica's local
// indexes. It is local bookkeeping, not part of the replicated CRDT.
type IndexState uint8

// Index states.
const (
	IndexNone    IndexState = 0 // no spec yet, or terminal: in no index
	IndexReady   IndexState = 1 // in the ready index
	IndexDelayed IndexState = 2 // in the delayed index (not_before in the future)
	IndexClaimed IndexState = 3 // in the claimed index (by lease expiry)
)

func (s IndexState) String() string {
	switch s {
	case IndexNone:
		return "none"
	case IndexReady:
		return "ready"
	case IndexDelayed:
		return "delayed"
	case IndexClaimed:
		return "claimed"
	}
	return fmt.Sprintf("IndexState(%d)", uint8(s))
}

// meta is the value under the meta key: the index state and, when claimed,
// the lease expiry that keys the claimed index; when delayed by a retry's
// backoff, the time the backoff ends (the delayed index is keyed by the
// later of it and the spec's not-before time).
type meta struct {
	state    IndexState
	expiryMs int64 // IndexClaimed
	dueMs    int64 // IndexDelayed: a retry's backoff ends; 0 = none
}

// encode is the state byte, then 8 bytes of the lease expiry (claimed)
// or of the backoff's end (delayed by a retry; a delayed task without
// one, as every task before retries, keeps the single byte).
func (m meta) encode() []byte {
	switch {
	case m.state == IndexClaimed:
		return binary.BigEndian.AppendUint64([]byte{byte(m.state)}, uint64(m.expiryMs))
	case m.state == IndexDelayed && m.dueMs != 0:
		return binary.BigEndian.AppendUint64([]byte{byte(m.state)}, uint64(m.dueMs))
	}
	return []byte{byte(m.state)}
}

func decodeMeta(b []byte) (meta, bool) {
	switch {
	case len(b) == 1 && IndexState(b[0]) <= IndexDelayed:
		return meta{state: IndexState(b[0])}, true
	case len(b) == 9 && IndexState(b[0]) == IndexClaimed:
		return meta{state: IndexClaimed, expiryMs: int64(binary.BigEndian.Uint64(b[1:]))}, true
	case len(b) == 9 && IndexState(b[0]) == IndexDelayed:
		due := int64(binary.BigEndian.Uint64(b[1:]))
		return meta{state: IndexDelayed, dueMs: due}, due != 0
	}
	return meta{}, false
}

// indexChange is a task entering (insert) or leaving one of the
// in-memory indexes: a queue's ready index (tag tagReady, queue and e), or
// the delayed, claimed or deadline index (tagDelayed, tagClaimed,
// tagDeadline: due). It is
// applied once its batch is visible (applyIndex).
type indexChange struct {
	p      uint16
	tag    byte
	queue  string
	e      ReadyEntry
	due    DueEntry
	insert bool // false: deleted
}

// moveIndex writes into b the new meta value, and returns the changes of
// the in-memory indexes, from (old, oldSpec) to (new, newSpec).
// metaStored tells whether id's meta key holds a value now.
//
// A stored task without a meta key is ready (see row.meta): a task that
// is ready and has no meta key keeps none, so that an enqueue writes
// three keys, not four (the store's CPU per new task fell by about a
// sixth without it, BenchmarkMergeTasksBatch).
func (s *Store) moveIndex(b *sortedBatch, p uint16, id uint64, old meta, oldSpec *crdt.Spec, new meta, newSpec *crdt.Spec, metaStored bool) ([]indexChange, error) {
	// Every write of a task (prepareMerge) or a meta comes here: raise the
	// horizon before the batch is applied. A meta can be written for a
	// task not stored here (a claim recorded first).
	if err := s.horizons.note(p, id); err != nil {
		return nil, err
	}
	if new.state == IndexReady && !metaStored && newSpec != nil {
		b.NoteAbsent(metaKey(p, id))
	} else if err := b.Set(metaKey(p, id), new.encode()); err != nil {
		return nil, err
	}
	return indexMoves(p, id, old, oldSpec, new, newSpec), nil
}

// indexMoves returns the in-memory index changes of a task going from
// (old, oldSpec) to (new, newSpec).
func indexMoves(p uint16, id uint64, old meta, oldSpec *crdt.Spec, new meta, newSpec *crdt.Spec) []indexChange {
	var changes []indexChange
	wasReady := old.state == IndexReady && oldSpec != nil
	isReady := new.state == IndexReady && newSpec != nil
	if !(wasReady && isReady && readyEntryOf(id, oldSpec) == readyEntryOf(id, newSpec) && oldSpec.Queue == newSpec.Queue) {
		if wasReady {
			changes = append(changes, indexChange{p: p, tag: tagReady, queue: oldSpec.Queue, e: readyEntryOf(id, oldSpec)})
		}
		if isReady {
			changes = append(changes, indexChange{p: p, tag: tagReady, queue: newSpec.Queue, e: readyEntryOf(id, newSpec), insert: true})
		}
	}
	oldTag, oldDue, hadTime := timeEntry(id, old, oldSpec)
	newTag, newDue, hasTime := timeEntry(id, new, newSpec)
	changes = dueMoves(changes, p, oldTag, oldDue, hadTime, newTag, newDue, hasTime)
	oldDl, hadDl := deadlineEntry(id, old, oldSpec)
	newDl, hasDl := deadlineEntry(id, new, newSpec)
	return dueMoves(changes, p, tagDeadline, oldDl, hadDl, tagDeadline, newDl, hasDl)
}

// dueMoves appends to changes the move of a task in a time index from
// (oldTag, oldDue), if had, to (newTag, newDue), if has.
func dueMoves(changes []indexChange, p uint16, oldTag byte, oldDue DueEntry, had bool, newTag byte, newDue DueEntry, has bool) []indexChange {
	if had && has && oldTag == newTag && oldDue == newDue {
		return changes
	}
	if had {
		changes = append(changes, indexChange{p: p, tag: oldTag, due: oldDue})
	}
	if has {
		changes = append(changes, indexChange{p: p, tag: newTag, due: newDue, insert: true})
	}
	return changes
}
