package storage

import (
	"errors"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// idHorizons tracks, per partition, an upper bound of the ids that have a
// key of one kind stored: task state or meta (Store.horizons), or a claim
// FSM record (Store.recordHorizons). Every such key is at or below its
// partition's horizon, so a read of an id above it can answer "not stored"
// without a point read. That is the common case: sonyflake ids grow with
// time, so enqueues merge tasks no replica has seen (saving two reads per
// replica), and first claims read records that do not exist yet.
//
// The horizon only grows. Deletes leave it where it is, which costs a read
// but never correctness. It is loaded lazily, once per partition, from the
// last keys on disk.
//
// Correctness rests on two rules: every write of a tracked key raises the
// horizon (note) before its batch becomes visible; and the writer that
// tests the horizon (above) before a read-modify-write holds what orders
// it after earlier writers of the id: the id's lock for task state and
// meta (every such write goes through Store.moveIndex, which notes), the
// partition's FSM apply order for records. A reader without either sees
// a state the id had at some point during its call.
type idHorizons struct {
	db *pebble.DB
	// spans returns the key ranges [lo, hi) of partition p whose keys end
	// in the ids tracked (each range in id order).
	spans func(p uint16) [][2][]byte

	mu  sync.Mutex
	max map[uint16]uint64 // absent: not loaded yet
}

// stateSpans are the task state and meta keys of p.
func stateSpans(p uint16) [][2][]byte {
	tlo, thi := tagSpan(p, tagTask)
	mlo, mhi := tagSpan(p, tagMeta)
	return [][2][]byte{{tlo, thi}, {mlo, mhi}}
}

// recordSpans are the claim FSM's record keys of p.
func recordSpans(p uint16) [][2][]byte {
	prefix := append(partitionPrefix(p, tagClaimFSM), fsmRecord)
	return [][2][]byte{{prefix, prefixEnd(prefix)}}
}

// above reports whether id is above partition p's horizon, that is, whether
// neither its task nor its meta key is stored.
func (h *idHorizons) above(p uint16, id uint64) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, err := h.loadLocked(p)
	return id > m, err
}

// note raises partition p's horizon to id. Call it before the batch that
// writes id's task or meta key is applied.
func (h *idHorizons) note(p uint16, id uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, err := h.loadLocked(p)
	if err != nil {
		return err
	}
	if id > m {
		h.max[p] = id
	}
	return nil
}

func (h *idHorizons) loadLocked(p uint16) (uint64, error) {
	if m, ok := h.max[p]; ok {
		return m, nil
	}
	var m uint64
	for _, span := range h.spans(p) {
		last, found, err := lastID(h.db, span[0], span[1])
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

// lastID returns the id at the end of the last key in [lo, hi).
func lastID(db *pebble.DB, lo, hi []byte) (uint64, bool, error) {
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
