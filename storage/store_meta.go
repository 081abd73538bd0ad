package storage

import (
	"bytes"
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
// the lease expiry that keys the claimed index.
type meta struct {
	state    IndexState
	expiryMs int64
}

func (m meta) encode() []byte {
	if m.state == IndexClaimed {
		return binary.BigEndian.AppendUint64([]byte{byte(m.state)}, uint64(m.expiryMs))
	}
	return []byte{byte(m.state)}
}

func decodeMeta(b []byte) (meta, bool) {
	switch {
	case len(b) == 1 && IndexState(b[0]) <= IndexDelayed:
		return meta{state: IndexState(b[0])}, true
	case len(b) == 9 && IndexState(b[0]) == IndexClaimed:
		return meta{state: IndexClaimed, expiryMs: int64(binary.BigEndian.Uint64(b[1:]))}, true
	}
	return meta{}, false
}

// readyChange is a task entering (insert) or leaving a queue's ready
// index, applied to the in-memory index once its batch is visible
// (applyReady).
type readyChange struct {
	p      uint16
	queue  string
	e      ReadyEntry
	insert bool // false: deleted
}

// moveIndex writes into b the new meta value and the index changes from
// (old, oldSpec) to (new, newSpec). metaStored tells whether id's meta key
// holds a value now. It returns the ready-index changes.
//
// A stored task without a meta key is ready (see row.meta): a task that
// is ready and has no meta key keeps none, so that an enqueue writes
// three keys, not four (the store's CPU per new task fell by about a
// sixth without it, BenchmarkMergeTasksBatch).
func (s *Store) moveIndex(b *sortedBatch, p uint16, id uint64, old meta, oldSpec *crdt.Spec, new meta, newSpec *crdt.Spec, metaStored bool) ([]readyChange, error) {
	oldKey, newKey := indexKey(p, id, old, oldSpec), indexKey(p, id, new, newSpec)
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
	if err := moveIndexKeys(b, oldKey, newKey); err != nil {
		return nil, err
	}
	return readyMoves(p, id, old, oldSpec, new, newSpec), nil
}

// moveIndexKeys replaces oldKey by newKey in the indexes kept in Pebble.
func moveIndexKeys(b *sortedBatch, oldKey, newKey []byte) error {
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

// readyMoves returns the ready-index changes of a task going from (old,
// oldSpec) to (new, newSpec).
func readyMoves(p uint16, id uint64, old meta, oldSpec *crdt.Spec, new meta, newSpec *crdt.Spec) []readyChange {
	wasReady := old.state == IndexReady && oldSpec != nil
	isReady := new.state == IndexReady && newSpec != nil
	if wasReady && isReady && oldSpec.Queue == newSpec.Queue && oldSpec.Priority == newSpec.Priority {
		return nil
	}
	var changes []readyChange
	if wasReady {
		changes = append(changes, readyChange{p: p, queue: oldSpec.Queue, e: ReadyEntry{ID: id, Priority: oldSpec.Priority}})
	}
	if isReady {
		changes = append(changes, readyChange{p: p, queue: newSpec.Queue, e: ReadyEntry{ID: id, Priority: newSpec.Priority}, insert: true})
	}
	return changes
}

// indexKey returns the Pebble index key of a task in state m, or nil for
// IndexNone and IndexReady (the ready index is in memory: readyQueue).
func indexKey(p uint16, id uint64, m meta, spec *crdt.Spec) []byte {
	switch m.state {
	case IndexDelayed:
		return timeIDKey(p, tagDelayed, spec.NotBeforeMs, id)
	case IndexClaimed:
		return timeIDKey(p, tagClaimed, m.expiryMs, id)
	}
	return nil
}
