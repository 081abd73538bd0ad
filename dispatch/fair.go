package dispatch

import (
	"container/heap"
	"sync"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/storage"
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
	if d.cfg.FairIgnoresKeys {
		return nil
	}
	return d.fair.get(queue, keyed).view()
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
