package dispatch

import (
	"container/heap"
	"slices"
	"sync"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
)

// Fair claims across partitions (docs/SCHEDULING.md, "Fair claims"). Each
// partition's ready index serves a priority's fairness keys in turns
// (storage.readyList); this node, where claims are served, weighs the
// heads of many partitions and of the other leaders by each key's
// virtual time here: start-time fair queueing. A key's next task starts
// at the later of the node's virtual time and the end of the key's last
// task served (its start plus 1/weight); heads of one priority go by
// start, then id; serving a task moves the node's virtual time to its
// start. A key that had nothing ready starts at the virtual time: it
// cannot bank turns. The times live in memory per queue and node: a
// restart starts them afresh.
//
// A queue none of whose heads has a key never makes a clock: its claims
// compare priority and id as before keys existed.

// fairClock is one queue's virtual times at this node.
type fairClock struct {
	mu     sync.Mutex
	v      float64            // the start of the last task served
	finish map[string]float64 // per key: the end of its last task served
	count  int                // tasks served since the last prune
}

// fairPrune: every this many tasks served, the keys whose end is behind
// the virtual time (as good as unknown: they start at it) are forgotten,
// so the map holds about the keys served lately.
const fairPrune = 4096

// fairClocks are the clocks of the queues with keys.
type fairClocks struct {
	mu sync.Mutex
	m  map[string]*fairClock
}

// get returns queue's clock; nil, unless create, when it has none.
func (fc *fairClocks) get(queue string, create bool) *fairClock {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	c := fc.m[queue]
	if c == nil && create {
		if fc.m == nil {
			fc.m = map[string]*fairClock{}
		}
		c = &fairClock{finish: map[string]float64{}}
		fc.m[queue] = c
	}
	return c
}

// served records tasks claimed here: each key's end moves on by
// 1/weight from its start, and the virtual time to the last start.
func (c *fairClock) served(entries []storage.ReadyEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range entries {
		start := max(c.v, c.finish[e.Key])
		c.finish[e.Key] = start + 1/float64(max(e.Weight, 1))
		c.v = start
	}
	if c.count += len(entries); c.count >= fairPrune {
		c.count = 0
		for k, f := range c.finish {
			if f <= c.v {
				delete(c.finish, k)
			}
		}
	}
}

// fairView is one merge's view of a queue's clock: what it picks moves
// its own copy of the times, not the clock (the picks may not all be
// claimed; served records those that are). A nil view (a queue without
// keys, or the seeded bug) orders by priority and id alone.
type fairView struct {
	clock  *fairClock
	v      float64
	finish map[string]float64 // the keys this merge picked
	picked bool               // v is this merge's
}

// view returns a view of c; nil for a nil clock.
func (c *fairClock) view() *fairView {
	if c == nil {
		return nil
	}
	return &fairView{clock: c, finish: map[string]float64{}}
}

// start is when key's next task starts in the view.
func (fv *fairView) start(key string) float64 {
	f, ok := fv.finish[key]
	fv.clock.mu.Lock()
	if !ok {
		f = fv.clock.finish[key]
	}
	v := fv.clock.v
	fv.clock.mu.Unlock()
	if fv.picked {
		v = max(v, fv.v)
	}
	return max(v, f)
}

// pick records in the view that e's task is taken.
func (fv *fairView) pick(e storage.ReadyEntry) {
	start := fv.start(e.Key)
	fv.finish[e.Key] = start + 1/float64(max(e.Weight, 1))
	fv.v, fv.picked = start, true
}

// less orders two heads for claiming: higher priority first, then (with
// a view) the earlier start of their keys, then older (lower id).
func (fv *fairView) less(a, b storage.ReadyEntry) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	if fv != nil && a.Key != b.Key {
		if sa, sb := fv.start(a.Key), fv.start(b.Key); sa != sb {
			return sa < sb
		}
	}
	return a.ID < b.ID
}

// fairFor returns the view a merge of queue uses: nil while the queue
// has no clock and keyed is false (no head with a key seen); with the
// seeded bug FairIgnoresKeys, always nil.
func (d *Dispatcher) fairFor(queue string, keyed bool) *fairView {
	if testhooks.Built && d.cfg.FairIgnoresKeys {
		return nil
	}
	return d.fair.get(queue, keyed).view()
}

// chooseFair is headMerger.choose with fairness keys: in each partition's
// entries read, the first of each key not returned yet is a candidate
// (the partition serves its keys in turn, but which key goes next is
// this node's choice), and the best of all by fv.less wins; the
// partition of the last head returned keeps the turn while its best
// starts no later. O(partitions x entries read).
func (m *headMerger) chooseFair() (c *headCursor, at, j int) {
	var best storage.ReadyEntry
	c, at, j = nil, -1, -1
	stickyJ := -1
	for i, x := range m.h {
		k := x.bestFair(m.fair)
		if x == m.sticky {
			stickyJ = k
		}
		if c == nil || m.fair.less(x.entries[k], best) {
			c, at, j, best = x, i, k, x.entries[k]
		}
	}
	if s := m.sticky; s != nil && s != c && stickyJ >= 0 {
		if sh := s.entries[stickyJ]; sh.Priority == best.Priority && (sh.Key == best.Key || m.fair.start(sh.Key) <= m.fair.start(best.Key)) {
			return s, slices.Index(m.h, s), stickyJ
		}
	}
	return c, at, j
}

// bestFair returns the index of c's best entry not returned: the first of
// each key is weighed.
func (c *headCursor) bestFair(fv *fairView) int { return fv.best(c.entries, c.i, c.used) }

// best returns the index of the best of entries[from:] not used (used
// nil: none is), weighing the first entry of each key (a line's FIFO
// order within a key is kept) by less, within the first priority found;
// -1 when every entry is used.
func (fv *fairView) best(entries []storage.ReadyEntry, from int, used []bool) int {
	best := -1
	var seen []string
	for j := from; j < len(entries); j++ {
		e := entries[j]
		if (used != nil && used[j]) || slices.Contains(seen, e.Key) {
			continue
		}
		if best >= 0 && e.Priority != entries[best].Priority {
			break // a lower priority: never before
		}
		seen = append(seen, e.Key)
		if best < 0 || fv.less(e, entries[best]) {
			best = j
		}
	}
	return best
}

// takeFair marks c's entry j returned; when it was the last of its key in
// the entries read and the partition may hold more, it reads further (the
// key may have more ready tasks than were read). false: the read failed.
func (m *headMerger) takeFair(c *headCursor, j int) bool {
	e := c.entries[j]
	m.fair.pick(e)
	if c.used == nil {
		c.used = make([]bool, len(c.entries))
	}
	c.used[j] = true
	for c.i < len(c.entries) && c.used[c.i] {
		c.i++
	}
	if !c.full {
		return true
	}
	c.returned = append(c.returned, e.ID)
	for k := c.i; k < len(c.entries); k++ {
		if !c.used[k] && c.entries[k].Key == e.Key {
			return true // more of the key read
		}
	}
	return m.readFurther(c)
}

// idsMerger is the merger of a proxied claim of the tasks ids (those of
// the partitions this node leads), in id order: ClaimRequest.IDs.
func (d *Dispatcher) idsMerger(ids []uint64) *headMerger {
	m := &headMerger{store: d.store}
	for _, id := range ids {
		if g := d.host.Group(d.host.Partition(id)); g != nil && g.IsLeader() {
			m.h = append(m.h, &headCursor{p: d.host.Partition(id), entries: []storage.ReadyEntry{{ID: id}}})
		}
	}
	heap.Init(&m.h)
	return m
}

// rivalsKeyed reports whether another leader reported a head with a
// fairness key.
func rivalsKeyed(rs []*rival) bool {
	for _, r := range rs {
		for _, h := range r.heads {
			if h.Key != "" {
				return true
			}
		}
	}
	return false
}

// servedEntries are the ready entries of tasks claimed.
func servedEntries(tasks []*nornv1.ClaimedTask) []storage.ReadyEntry {
	out := make([]storage.ReadyEntry, 0, len(tasks))
	for _, t := range tasks {
		s := t.GetTask().GetSpec()
		out = append(out, storage.ReadyEntry{ID: t.GetTask().GetId(), Priority: s.GetPriority(), Key: s.GetFairnessKey(), Weight: s.GetFairnessWeight()})
	}
	return out
}

// fairServed records on queue's clock the tasks claimed here, when it
// has one.
func (d *Dispatcher) fairServed(queue string, tasks []*nornv1.ClaimedTask) {
	if c := d.fair.get(queue, false); c != nil && len(tasks) > 0 {
		c.served(servedEntries(tasks))
	}
}
