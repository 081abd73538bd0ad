package storage

import (
	"errors"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// idHorizons tracks, per partition (and per lane of ids, see horizon), an
// upper bound of the ids that have a key of one kind stored: task state or meta (Store.horizons), or a claim
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

	mu    sync.Mutex
	parts map[uint16]*horizon // absent: not loaded yet
}

// horizon is one partition's bounds. The ids are split into lanes by their
// low 16 bits, a sonyflake id's machine id: each of a node's id generators
// hands out growing ids in a lane of its own, but the lanes interleave (the
// ids of two coordinators in one 10 ms tick order by sequence number
// first), so one bound for the partition would lie above most new ids of
// every coordinator but the fastest, and cost their enqueues a read on
// every replica. A lane's bound is the partition's bound when it was
// loaded, raised by the ids of the lane noted since.
type horizon struct {
	base  uint64            // every id stored when loaded is at or below it
	max   uint64            // every id stored is at or below it
	lanes map[uint16]uint64 // per lane, the highest id noted since the load; nil once folded
}

// maxLanes bounds the lanes kept per partition (8 per node: 32 nodes'
// coordinators). Past it, the partition folds them into max (one bound, as
// before lanes): ids that do not come from sonyflake (given by clients)
// cannot grow the map without bound.
const maxLanes = 256

func lane(id uint64) uint16 { return uint16(id) }

// bound returns the horizon of id's lane.
func (h *horizon) bound(id uint64) uint64 {
	if h.lanes == nil {
		return h.max
	}
	return max(h.base, h.lanes[lane(id)])
}

// note raises the bounds to id.
func (h *horizon) note(id uint64) {
	h.max = max(h.max, id)
	if h.lanes == nil {
		return
	}
	l := lane(id)
	if cur, ok := h.lanes[l]; ok || len(h.lanes) < maxLanes {
		h.lanes[l] = max(cur, id)
		return
	}
	h.lanes = nil // fold
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
	hz, err := h.loadLocked(p)
	if err != nil {
		return false, err
	}
	return id > hz.bound(id), nil
}

// note raises partition p's horizon to id. Call it before the batch that
// writes id's task or meta key is applied.
func (h *idHorizons) note(p uint16, id uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	hz, err := h.loadLocked(p)
	if err != nil {
		return err
	}
	hz.note(id)
	return nil
}

func (h *idHorizons) loadLocked(p uint16) (*horizon, error) {
	if hz, ok := h.parts[p]; ok {
		return hz, nil
	}
	var m uint64
	for _, span := range h.spans(p) {
		last, found, err := lastID(h.db, span[0], span[1])
		if err != nil {
			return nil, err
		}
		if found {
			m = max(m, last)
		}
	}
	if h.parts == nil {
		h.parts = make(map[uint16]*horizon)
	}
	hz := &horizon{base: m, max: m, lanes: map[uint16]uint64{}}
	h.parts[p] = hz
	return hz, nil
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
