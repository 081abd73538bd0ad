package storage

import (
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/norn-dev/norn/crdt"
)

// DigestSink follows one partition's segment index, the (segment, id,
// digest) set anti-entropy compares: TrackDigests feeds it every stored
// entry, then every change. The Store calls it under the changed id's
// lock, after the change is visible, so the calls for one id come in
// commit order; calls for different ids may be concurrent. It must not
// block or call back into the Store.
type DigestSink interface {
	// DigestChanged reports that id went from digest old (had false: no
	// state) to digest new (has false: deleted).
	DigestChanged(seg uint16, id uint64, old uint64, had bool, new uint64, has bool)
}

// digestChange is one committed change of a task's digest.
type digestChange struct {
	p        uint16
	id       uint64
	old, new uint64
	had, has bool
}

// digestSinks is the registry of TrackDigests: the tracked partitions'
// segment indexes, kept in memory. The index is not stored (format 3): a
// task's digest is the hash of its stored encoding, so TrackDigests builds
// it from the task keys and every committed change keeps it current. One
// key fewer per change saves about a quarter of the store's CPU per merged
// task (docs/BENCHMARKS.md, session 14).
type digestSinks struct {
	mu    sync.RWMutex
	parts map[uint16]*trackedDigests
}

// trackedDigests is one tracked partition: its sink and its segment index.
type trackedDigests struct {
	sink  DigestSink
	mu    sync.Mutex
	index *segIndex
}

// TrackDigests makes sink follow partition p's segment index: it first
// gets every stored entry (as changes from nothing), then every committed
// change until UntrackDigests. The load runs with every id lock held, so
// no write is counted twice or missed; writes wait for it. A partition has
// at most one sink; tracking again replaces it (and loads again). While a
// partition is tracked, ScanSegmentRanges reads its index from memory.
func (s *Store) TrackDigests(p uint16, sink DigestSink) error {
	unlock := s.lockAll()
	defer unlock()
	var items []segItem
	err := s.scanTaskDigests(p, func(id, digest uint64) error {
		seg := Segment(id)
		items = append(items, segItem{seg, id, digest})
		sink.DigestChanged(seg, id, 0, false, digest, true)
		return nil
	})
	if err != nil {
		return err
	}
	t := &trackedDigests{sink: sink, index: newSegIndex(items)}
	s.digests.mu.Lock()
	if s.digests.parts == nil {
		s.digests.parts = make(map[uint16]*trackedDigests)
	}
	s.digests.parts[p] = t
	s.digests.mu.Unlock()
	return nil
}

// UntrackDigests stops the sink of partition p, if any, and drops its
// index from memory. Call it before DropPartition.
func (s *Store) UntrackDigests(p uint16) {
	s.digests.mu.Lock()
	delete(s.digests.parts, p)
	s.digests.mu.Unlock()
}

// notifyDigests reports committed changes to their partitions' indexes and
// sinks. The caller holds the ids' locks and the changes are visible.
func (s *Store) notifyDigests(changes []digestChange) {
	if len(changes) == 0 {
		return
	}
	s.digests.mu.RLock()
	defer s.digests.mu.RUnlock()
	for _, c := range changes {
		t := s.digests.parts[c.p]
		if t == nil {
			continue
		}
		t.mu.Lock()
		if c.has {
			t.index.set(c.id, c.new)
		} else {
			t.index.remove(c.id)
		}
		t.mu.Unlock()
		t.sink.DigestChanged(Segment(c.id), c.id, c.old, c.had, c.new, c.has)
	}
}

// scanTaskDigests calls fn with the id and digest of every stored task of
// partition p, in id order.
func (s *Store) scanTaskDigests(p uint16, fn func(id, digest uint64) error) error {
	lo, hi := tagSpan(p, tagTask)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != len(lo)+8 {
			return corrupt(k, "bad task key")
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if err := fn(idFromKey(k), crdt.Digest(v)); err != nil {
			return err
		}
	}
	return it.Error()
}

// SegmentEntry is one (id, digest) pair of the anti-entropy segment index.
type SegmentEntry struct {
	ID     uint64
	Digest uint64
}

// SegmentRange is the segments [Lo, Hi) of a partition.
type SegmentRange struct{ Lo, Hi uint32 }

// ScanSegmentRanges calls fn for every segment index entry of partition p
// in one of the ranges, in (segment, id) order; the ranges must be
// ascending and disjoint. A tracked partition's index is read from memory
// (segIndex); an untracked one's is computed from its
// task keys (one scan for all the ranges). fn's error stops the scan and
// is returned.
func (s *Store) ScanSegmentRanges(p uint16, ranges []SegmentRange, fn func(seg uint16, e SegmentEntry) error) error {
	var ents []segItem
	s.digests.mu.RLock()
	t := s.digests.parts[p]
	s.digests.mu.RUnlock()
	if t != nil {
		t.mu.Lock()
		ents = t.index.list(ranges)
		t.mu.Unlock()
	} else {
		err := s.scanTaskDigests(p, func(id, d uint64) error {
			if seg := Segment(id); inRanges(ranges, seg) {
				ents = append(ents, segItem{seg, id, d})
			}
			return nil
		})
		if err != nil {
			return err
		}
		slices.SortFunc(ents, compareSegItems)
	}
	for _, e := range ents {
		if err := fn(e.seg, SegmentEntry{ID: e.id, Digest: e.digest}); err != nil {
			return err
		}
	}
	return nil
}

// lockAll locks every id stripe, in order.
func (s *Store) lockAll() (unlock func()) {
	for i := range s.stripes {
		s.stripes[i].Lock()
	}
	return func() {
		for i := range s.stripes {
			s.stripes[i].Unlock()
		}
	}
}
