package storage

import (
	"errors"
	"sync"
	"sync/atomic"

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

// digestSinks is the registry of TrackDigests.
type digestSinks struct {
	mu    sync.RWMutex
	sinks map[uint16]DigestSink
}

// TrackDigests makes sink follow partition p's segment index: it first
// gets every stored entry (as changes from nothing), then every committed
// change until UntrackDigests. The load runs with every id lock held, so
// no write is counted twice or missed; writes wait for it. A partition has
// at most one sink; tracking again replaces it (and loads again).
func (s *Store) TrackDigests(p uint16, sink DigestSink) error {
	unlock := s.lockAll()
	defer unlock()
	err := s.ScanSegments(p, 0, 1<<16, func(seg uint16, e SegmentEntry) error {
		sink.DigestChanged(seg, e.ID, 0, false, e.Digest, true)
		return nil
	})
	if err != nil {
		return err
	}
	s.digests.mu.Lock()
	if s.digests.sinks == nil {
		s.digests.sinks = make(map[uint16]DigestSink)
	}
	s.digests.sinks[p] = sink
	s.digests.mu.Unlock()
	return nil
}

// UntrackDigests stops the sink of partition p, if any. Call it before
// DropPartition.
func (s *Store) UntrackDigests(p uint16) {
	s.digests.mu.Lock()
	delete(s.digests.sinks, p)
	s.digests.mu.Unlock()
}

// notifyDigests reports committed changes to their partitions' sinks. The
// caller holds the ids' locks and the changes are visible.
func (s *Store) notifyDigests(changes []digestChange) {
	if len(changes) == 0 {
		return
	}
	s.digests.mu.RLock()
	defer s.digests.mu.RUnlock()
	for _, c := range changes {
		if sink := s.digests.sinks[c.p]; sink != nil {
			sink.DigestChanged(Segment(c.id), c.id, c.old, c.had, c.new, c.has)
		}
	}
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

// deleteHorizon is the discard rule of retention: a state whose deciding
// terminal event is before the horizon counts as deleted. A merge of such
// a state into a replica that does not hold the task stores nothing, so a
// stale copy (read repair, a late write, anti-entropy from a replica that
// has not deleted it yet) never brings a deleted task back.
type deleteHorizon struct{ ms atomic.Int64 }

// RaiseDeleteHorizon raises the store's delete horizon (Unix ms) to ms; it
// never lowers it. The node raises it to now - retention on every retention
// pass, and anti-entropy to the horizon both replicas agreed on. It is kept
// in memory: after a restart the first retention pass sets it again.
func (s *Store) RaiseDeleteHorizon(ms int64) {
	for {
		cur := s.deleteHorizon.ms.Load()
		if ms <= cur || s.deleteHorizon.ms.CompareAndSwap(cur, ms) {
			return
		}
	}
}

// DeleteHorizon returns the store's delete horizon (Unix ms; 0 before the
// first RaiseDeleteHorizon).
func (s *Store) DeleteHorizon() int64 { return s.deleteHorizon.ms.Load() }

// pastHorizon reports whether t is terminal with its deciding event before
// the delete horizon.
func (s *Store) pastHorizon(t *crdt.Task) bool {
	ev, ok := t.Terminal()
	return ok && ev.At.WallMs < s.deleteHorizon.ms.Load()
}

// DeleteTerminalBefore raises the delete horizon to ms and deletes every
// terminal task of partition p whose deciding terminal event is before ms,
// in batches of batch. It returns how many it deleted. The claim FSM's
// records are not touched: forget, if not nil, runs before each batch is
// deleted (the partition's leader forgets their records through Raft) and
// its error stops the deletion.
func (s *Store) DeleteTerminalBefore(p uint16, ms int64, batch int, forget func(ids []uint64) error) (int, error) {
	if batch <= 0 {
		return 0, errors.New("storage: DeleteTerminalBefore batch must be positive")
	}
	s.RaiseDeleteHorizon(ms)
	deleted := 0
	for {
		due, err := s.TerminalBefore(p, ms-1, batch)
		if err != nil || len(due) == 0 {
			return deleted, err
		}
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
		if len(due) < batch {
			return deleted, nil
		}
	}
}
