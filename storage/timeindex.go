package storage

import (
	"sync"

	"github.com/google/btree"

	"github.com/norn-dev/norn/crdt"
)

// timeIndex is one partition's delayed index (not-before time, id),
// claimed index (lease expiry, id) or deadline index (deadline, id: the
// tasks with a deadline that are not terminal here), in memory. Like the ready index it is
// built at Open from the task and meta keys (buildIndexes) and follows
// every committed batch under the ids' stripe locks (applyIndex). The
// claimed index stays a pure function of the claim FSM: its entries come
// from the meta keys the FSM writes, on every replica alike.
//
// A B-tree (google/btree): its entries are inserted in no particular
// order (leases of different lengths, renewals, not-before times of any
// date), unlike the ready index's appends. It holds the claimed and
// delayed tasks only.
type timeIndex struct {
	mu sync.Mutex
	t  *btree.BTreeG[DueEntry]
}

func dueLess(a, b DueEntry) bool {
	if a.AtMs != b.AtMs {
		return a.AtMs < b.AtMs
	}
	return a.ID < b.ID
}

// timeIndex returns partition p's index for tag (tagDelayed, tagClaimed
// or tagDeadline), made when missing if create, nil otherwise.
func (s *Store) timeIndex(p uint16, tag byte, create bool) *timeIndex {
	return lookupIndex(&s.readyMu, s.times, dueKey{p, tag}, create, func() *timeIndex {
		return &timeIndex{t: btree.NewG(16, dueLess)}
	})
}

// before returns up to limit entries at or before ms, earliest first.
func (x *timeIndex) before(ms int64, limit int) []DueEntry {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []DueEntry
	x.t.Ascend(func(e DueEntry) bool {
		if e.AtMs > ms || len(out) >= limit {
			return false
		}
		out = append(out, e)
		return true
	})
	return out
}

// ids returns the ids the index holds.
func (x *timeIndex) ids() []uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]uint64, 0, x.t.Len())
	x.t.Ascend(func(e DueEntry) bool { out = append(out, e.ID); return true })
	return out
}

// timeEntry returns the time index entry of a task in state m (spec: its
// spec, needed for a delayed task's not-before time), if it has one.
func timeEntry(id uint64, m meta, spec *crdt.Spec) (tag byte, e DueEntry, ok bool) {
	switch {
	case m.state == IndexClaimed:
		return tagClaimed, DueEntry{ID: id, AtMs: max(m.expiryMs, 0)}, true
	case m.state == IndexDelayed && spec != nil:
		return tagDelayed, DueEntry{ID: id, AtMs: max(spec.NotBeforeMs, m.dueMs, 0)}, true
	}
	return 0, DueEntry{}, false
}

// deadlineEntry returns the deadline index entry of a task in state m
// (spec: its spec, nil when not known here): one for a task with a
// deadline that is ready, delayed or claimed.
func deadlineEntry(id uint64, m meta, spec *crdt.Spec) (DueEntry, bool) {
	if spec == nil || spec.DeadlineMs == 0 || m.state == IndexNone {
		return DueEntry{}, false
	}
	return DueEntry{ID: id, AtMs: spec.DeadlineMs}, true
}
