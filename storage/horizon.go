package storage

import (
	"errors"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// idHorizons tracks, per partition, an upper bound of the ids whose task or
// meta key may be stored: every such key is at or below its partition's
// horizon. A merge of an id above the horizon is of a task this replica
// has never seen, so it skips the two point reads (state and meta) that a
// read-modify-write would otherwise do; that is the common case for
// enqueues, whose sonyflake ids grow with time.
//
// The horizon only grows. Deletes leave it where it is, which costs a read
// but never correctness. It is loaded lazily, once per partition, from the
// last task and meta keys on disk.
//
// Correctness rests on two rules: every write of a task or meta key raises
// the horizon (note, in Store.moveIndex, which every such write goes
// through) before its batch becomes visible, while the writer
// holds the id's lock; and a merge tests the horizon (above) under the same
// lock. A later writer of the same id therefore sees the horizon at or above
// it.
type idHorizons struct {
	mu  sync.Mutex
	max map[uint16]uint64 // absent: not loaded yet
}

// above reports whether id is above partition p's horizon, that is, whether
// neither its task nor its meta key is stored.
func (h *idHorizons) above(db *pebble.DB, p uint16, id uint64) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, err := h.loadLocked(db, p)
	return id > m, err
}

// note raises partition p's horizon to id. Call it before the batch that
// writes id's task or meta key is applied.
func (h *idHorizons) note(db *pebble.DB, p uint16, id uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, err := h.loadLocked(db, p)
	if err != nil {
		return err
	}
	if id > m {
		h.max[p] = id
	}
	return nil
}

func (h *idHorizons) loadLocked(db *pebble.DB, p uint16) (uint64, error) {
	if m, ok := h.max[p]; ok {
		return m, nil
	}
	var m uint64
	for _, tag := range []byte{tagTask, tagMeta} {
		last, found, err := lastID(db, p, tag)
		if err != nil {
			return 0, err
		}
		if found {
			m = max(m, last)
		}
	}
	if h.max == nil {
		h.max = make(map[uint16]uint64)
	}
	h.max[p] = m
	return m, nil
}

// lastID returns the largest id stored under one id-keyed tag of partition
// p.
func lastID(db *pebble.DB, p uint16, tag byte) (uint64, bool, error) {
	lo, hi := tagSpan(p, tag)
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return 0, false, err
	}
	var id uint64
	found := it.Last()
	if found {
		id = idFromKey(it.Key())
	}
	return id, found, errors.Join(it.Error(), it.Close())
}
