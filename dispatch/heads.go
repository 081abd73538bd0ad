package dispatch

import (
	"container/heap"
	"slices"

	"github.com/norn-dev/norn/storage"
)

// headMerger yields the ready heads of one queue across partitions in
// claim order by merging each partition's already sorted head lazily: a
// claim of n tasks reads a few entries per partition, not a fixed number
// from every one, and sorts nothing.
//
// Claim order is partition-affine: the first head is the best of all
// (highest priority, then oldest); after that, the merger stays in the
// partition of the head it returned last as long as that partition's next
// head has the best priority still available anywhere, and only then
// moves to the best head of all again. So priority is strict, each
// partition is FIFO, every claim starts with the oldest task of the best
// priority, and a claim of n tasks takes them from as few partitions as
// the priorities allow: one Raft entry for the batch instead of one per
// partition touched (Raft entries, each replicated to the cohort, are what
// a claim costs). Across partitions, tasks of one priority come out
// roughly, not exactly, in age order.
//
// With fairness keys (fair set, fair.go), heads of one priority go by
// their keys' start at this node before their ids, and the merger stays
// in a partition only while its next head starts no later than the best
// of all; it then finds the best by a pass over the partitions (O(the
// partitions led) a head, independent of the number of keys).
type headMerger struct {
	store  *storage.Store
	queue  string
	h      cursorHeap
	sticky *headCursor // the partition of the last head returned
	err    error
	keyed  bool      // a head with a fairness key was read
	fair   *fairView // set by the caller once keyed (or the queue has a clock)
}

// headCursor walks one partition's ready head.
type headCursor struct {
	p        uint16
	entries  []storage.ReadyEntry
	i        int
	full     bool     // entries held as many as asked for: there may be more
	returned []uint64 // the ids next returned, when full (a read further skips them)
	used     []bool   // with fairness keys: which entries next returned (c.i: the first not)
}

// firstHeadRead is how many entries of each partition's head a merge reads
// first; a partition whose entries run out is read again, four times
// further each time.
const firstHeadRead = 4

func newHeadMerger(store *storage.Store, queue string, partitions []uint16) (*headMerger, error) {
	m := &headMerger{store: store, queue: queue}
	for _, p := range partitions {
		c := &headCursor{p: p}
		if err := m.read(c, firstHeadRead); err != nil {
			return nil, err
		}
		if c.i < len(c.entries) {
			m.h = append(m.h, c)
		}
	}
	heap.Init(&m.h)
	return m, nil
}

func (m *headMerger) read(c *headCursor, n int) error {
	e, err := m.store.ReadyHead(c.p, m.queue, n)
	if err != nil {
		return err
	}
	c.entries, c.full = e, len(e) == n
	for _, x := range e {
		if x.Key != "" {
			m.keyed = true
			break
		}
	}
	return nil
}

// choose returns the cursor next takes its head from, its index in the
// heap, and the index in its entries of the head (c.i but with fairness
// keys, fairHead).
func (m *headMerger) choose() (c *headCursor, at, j int) {
	if m.fair != nil {
		return m.chooseFair()
	}
	c, at = m.h[0], 0
	if s := m.sticky; s != nil && s != c && s.i < len(s.entries) && s.entries[s.i].Priority == c.entries[c.i].Priority {
		c, at = s, slices.Index(m.h, s)
	}
	return c, at, c.i
}

// peek returns the head next would return, without taking it.
func (m *headMerger) peek() (storage.ReadyEntry, bool) {
	if len(m.h) == 0 || m.err != nil {
		return storage.ReadyEntry{}, false
	}
	c, _, j := m.choose()
	return c.entries[j], true
}

// next returns the best head not yet returned; ok is false when every
// partition's head is exhausted or a read failed (see err).
func (m *headMerger) next() (p uint16, e storage.ReadyEntry, ok bool) {
	if len(m.h) == 0 || m.err != nil {
		return 0, storage.ReadyEntry{}, false
	}
	c, at, j := m.choose()
	m.sticky = c
	p, e = c.p, c.entries[j]
	if m.fair != nil {
		if !m.takeFair(c, j) {
			return 0, storage.ReadyEntry{}, false
		}
		if c.i == len(c.entries) {
			// No heap once fair: choose passes over them all.
			m.h[at] = m.h[len(m.h)-1]
			m.h = m.h[:len(m.h)-1]
			m.sticky = nil
		}
		return p, e, true
	}
	c.i++
	if c.full {
		c.returned = append(c.returned, e.ID)
	}
	if c.i == len(c.entries) && c.full {
		if !m.readFurther(c) {
			return 0, storage.ReadyEntry{}, false
		}
	}
	if c.i < len(c.entries) {
		heap.Fix(&m.h, at)
	} else {
		heap.Remove(&m.h, at)
		m.sticky = nil
	}
	return p, e, true
}

// readFurther reads four times more of c's partition's head. The head may
// have changed meanwhile (a concurrent claim or enqueue): the entries
// returned are left out, so none is returned twice.
func (m *headMerger) readFurther(c *headCursor) bool {
	if err := m.read(c, 4*max(len(c.entries), firstHeadRead)); err != nil {
		m.err = err
		return false
	}
	returned := make(map[uint64]bool, len(c.returned))
	for _, id := range c.returned {
		returned[id] = true
	}
	c.entries = slices.DeleteFunc(c.entries, func(x storage.ReadyEntry) bool { return returned[x.ID] })
	c.i, c.used = 0, nil
	return true
}

// headLess orders ready entries for claiming without fairness keys:
// higher priority first, then older (lower id).
func headLess(a, b storage.ReadyEntry) bool { return (*fairView)(nil).less(a, b) }

type cursorHeap []*headCursor

func (h cursorHeap) Len() int { return len(h) }
func (h cursorHeap) Less(i, j int) bool {
	return headLess(h[i].entries[h[i].i], h[j].entries[h[j].i])
}
func (h cursorHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *cursorHeap) Push(x any)   { *h = append(*h, x.(*headCursor)) }
func (h *cursorHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}
