package dispatch

import (
	"container/list"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
)

// Dependencies (DESIGN §4): a task's partition leader treats it as
// DELAYED until every task it depends on is COMPLETED, and aborts it when
// one ends ABORTED or CANCELLED. A dependency may live in a partition this
// node does not replicate (more nodes than N), or this node's replica of
// it may be behind (W < N), so what the node knows of a dependency comes
// from, first hit wins:
//
//  1. the depCache: dependencies this node found terminal, kept for good
//     (a terminal event is permanent), up to DepCacheSize ids;
//  2. this node's replica of the dependency's partition, when it has one
//     (a terminal state found there goes into the cache);
//  3. a majority read of the dependency's replicas (readStates), done in
//     the background by the node's depChecker, never on a request path.
//
// The claim path (candidate, through depsState) looks at 1 and 2 and
// hands every dependency still undecided to the checker, which reads it
// at once when its partition is elsewhere (after depRecheckHosted when
// this node has a replica, which normally gets the completion itself),
// then with backoff from depRecheckMin to depRecheckMax, until it is
// terminal or no claim has asked for it for depForget. When a read finds
// a dependency terminal, the checker caches it and wakes the node's
// waiting claims, which look at their queues again (and abort the
// dependants of a failed dependency). A completion merged into this
// node's replica wakes them at once (coord's MergeLocal, through Ended). Views (GetTask,
// ListTasks, CountTasks, through DepsDone) look at 1 and 2 only and ask
// for nothing: a dependant may show DELAYED there until a claim has had
// its dependencies resolved.

// Dependency checking bounds and intervals.
const (
	// DepCacheSize bounds the depCache: about 100 bytes an id (map entry,
	// list element), so about 6.5 MiB when full. An evicted dependency is
	// read again when a claim needs it.
	DepCacheSize = 1 << 16
	// depWatchMax bounds the dependencies the checker reads at once; one
	// a claim hands over while it is full is handed over again by a later
	// claim.
	depWatchMax = 10_000
	// depRecheckMin and depRecheckMax bound the backoff between two reads
	// of a dependency found undecided (doubling).
	depRecheckMin = 250 * time.Millisecond
	depRecheckMax = 5 * time.Second
	// depRecheckHosted is when a dependency whose partition this node
	// replicates is first read from the others: its own replica normally
	// gets the completion itself, within the write's fan-out.
	depRecheckHosted = time.Second
	// depForget drops a dependency no claim has asked about for this long
	// (its dependants were cancelled, or nobody claims their queue). It
	// is five times the default MaxWait, the longest a waiting claim may
	// go without asking again.
	depForget = 5 * time.Minute
	// depReadParallel bounds the partitions the checker reads at once.
	depReadParallel = 8
)

// DepOutcome is what a node knows of a dependency.
type DepOutcome uint8

const (
	DepUndecided DepOutcome = iota // not terminal, or not known here
	DepCompleted                   // COMPLETED
	DepFailed                      // ABORTED or CANCELLED: it never completes
)

// outcomeOf is the outcome a task state shows.
func outcomeOf(t *crdt.Task) DepOutcome {
	ev, ok := t.Terminal()
	switch {
	case !ok:
		return DepUndecided
	case ev.Kind == crdt.Completed:
		return DepCompleted
	default:
		return DepFailed
	}
}

// DepsDone reports whether every id is a COMPLETED task as far as this
// node knows without asking another (the cache and its own replicas).
// For views; it hands nothing to the checker.
func (d *Dispatcher) DepsDone(ids []uint64) bool {
	done, _ := d.depsKnown(ids, false)
	return done
}

// depsState reports whether every id is a COMPLETED task, and the first
// that ended otherwise (ABORTED or CANCELLED: it never will), or 0. For
// the claim path: it reads no other node, and hands the ids it cannot
// decide to the checker, which wakes the node's claims when it has.
func (d *Dispatcher) depsState(ids []uint64) (done bool, failed uint64) {
	return d.depsKnown(ids, true)
}

// depsKnown is depsState; watch hands the undecided ids to the checker.
func (d *Dispatcher) depsKnown(ids []uint64, watch bool) (done bool, failed uint64) {
	done = true
	for _, id := range ids {
		switch d.depOutcome(id, watch) {
		case DepCompleted:
		case DepFailed:
			return false, id
		default:
			done = false
		}
	}
	return done, 0
}

// depOutcome is what the cache or this node's replica says of dependency
// id; watch hands it to the checker when neither decides it.
func (d *Dispatcher) depOutcome(id uint64, watch bool) DepOutcome {
	if o, ok := d.deps.cache.get(id); ok {
		return o
	}
	p := d.host.Partition(id)
	hosted := d.host.Group(p) != nil
	if hosted {
		if t, err := d.store.TaskState(p, id); err == nil {
			if o := outcomeOf(t); o != DepUndecided {
				d.deps.cache.put(id, o)
				return o
			}
		}
		if r := d.host.Ring(); r != nil && r.Replication == 1 {
			return DepUndecided // this replica is the only one
		}
	}
	if watch {
		d.deps.want(id, hosted)
	}
	return DepUndecided
}

// depCache maps dependencies found terminal to their outcome, for good,
// holding at most size ids: putting one more evicts the least recently
// used. Safe for concurrent use.
type depCache struct {
	mu    sync.Mutex
	size  int
	lru   list.List // of depCacheEntry, most recently used first
	items map[uint64]*list.Element
}

type depCacheEntry struct {
	id      uint64
	outcome DepOutcome
}

// newDepCache returns an empty cache of at most size ids (size > 0).
func newDepCache(size int) *depCache {
	if size <= 0 {
		panic("node: depCache size must be positive")
	}
	return &depCache{size: size, items: map[uint64]*list.Element{}}
}

// get returns id's outcome and true when the cache has it.
func (c *depCache) get(id uint64) (DepOutcome, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[id]
	if !ok {
		return DepUndecided, false
	}
	c.lru.MoveToFront(e)
	return e.Value.(depCacheEntry).outcome, true
}

// put records id's outcome, which must be terminal.
func (c *depCache) put(id uint64, o DepOutcome) {
	if o == DepUndecided {
		panic("node: caching an undecided dependency")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[id]; ok {
		e.Value = depCacheEntry{id, o}
		c.lru.MoveToFront(e)
		return
	}
	c.items[id] = c.lru.PushFront(depCacheEntry{id, o})
	if c.lru.Len() > c.size {
		last := c.lru.Back()
		c.lru.Remove(last)
		delete(c.items, last.Value.(depCacheEntry).id)
	}
}

// len is how many ids the cache holds.
func (c *depCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// depWatch is the checker's schedule: the dependencies claims wait for
// and nothing has decided yet, each with when to read it next. It does no
// I/O and reads no clock; now is an input.
type depWatch struct {
	max int
	ids map[uint64]*watchedDep
}

type watchedDep struct {
	due     time.Time     // next read
	backoff time.Duration // wait after that read, should it not decide
	asked   time.Time     // the last want
}

// want records that a claim waits for id at now. A new id is due at now,
// or at now + depRecheckHosted when hosted. It reports whether id is new;
// an id the watch has no room for is not added.
func (w *depWatch) want(id uint64, hosted bool, now time.Time) bool {
	if d, ok := w.ids[id]; ok {
		d.asked = now
		return false
	}
	if len(w.ids) >= w.max {
		return false
	}
	if w.ids == nil {
		w.ids = map[uint64]*watchedDep{}
	}
	d := &watchedDep{due: now, backoff: depRecheckMin, asked: now}
	if hosted {
		d.due, d.backoff = now.Add(depRecheckHosted), 2*depRecheckHosted
	}
	w.ids[id] = d
	return true
}

// take returns the ids due at now, and schedules their next read as if
// this one will not decide them (settle removes those it does). Ids no
// claim asked about since now - depForget are dropped instead.
func (w *depWatch) take(now time.Time) []uint64 {
	var due []uint64
	for id, d := range w.ids {
		switch {
		case now.Sub(d.asked) > depForget:
			delete(w.ids, id)
		case !d.due.After(now):
			due = append(due, id)
			d.due, d.backoff = now.Add(d.backoff), min(2*d.backoff, depRecheckMax)
		}
	}
	return due
}

// settle stops watching id (found terminal).
func (w *depWatch) settle(id uint64) { delete(w.ids, id) }

// next returns the earliest due time; ok is false when nothing is
// watched.
func (w *depWatch) next() (due time.Time, ok bool) {
	for _, d := range w.ids {
		if !ok || d.due.Before(due) {
			due, ok = d.due, true
		}
	}
	return due, ok
}

// depChecker is the node's dependency checker: it reads the watched
// dependencies from a majority of their replicas when due (see the top of
// this file), one batched read per partition, and wakes the node's
// waiting claims when it finds some terminal.
type depChecker struct {
	d     *Dispatcher
	cache *depCache
	kick  chan struct{} // the watch changed

	mu    sync.Mutex
	watch depWatch
}

func newDepChecker(d *Dispatcher) *depChecker {
	return &depChecker{d: d, cache: newDepCache(DepCacheSize), kick: make(chan struct{}, 1),
		watch: depWatch{max: depWatchMax}}
}

// want hands dependency id, undecided here, to the checker (see depWatch.want).
func (c *depChecker) want(id uint64, hosted bool) {
	c.mu.Lock()
	added := c.watch.want(id, hosted, time.Now())
	c.mu.Unlock()
	if added {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// watched is how many dependencies the checker watches.
func (c *depChecker) watched() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.watch.ids)
}

// run reads due dependencies until stop is closed; reads in flight are
// cancelled then.
func (c *depChecker) run(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		c.mu.Lock()
		due, ok := c.watch.next()
		c.mu.Unlock()
		if ok {
			timer.Reset(time.Until(due))
		} else {
			timer.Stop()
		}
		select {
		case <-stop:
			return
		case <-c.kick:
		case <-timer.C:
		}
		c.round(ctx)
	}
}

// round reads the dependencies due now, one readStates per partition (in
// calls of at most coord.MaxRead ids, depReadParallel partitions at once),
// caches those found terminal and wakes the node's waiting claims if
// there were any. A dependency a read fails for stays watched: it is read
// again after its backoff.
func (c *depChecker) round(ctx context.Context) {
	d := c.d
	c.mu.Lock()
	due := c.watch.take(time.Now())
	c.mu.Unlock()
	byPart := map[uint16][]uint64{}
	for _, id := range due {
		if _, ok := c.cache.get(id); ok {
			c.settle(id) // a claim found it in this node's replica meanwhile
			continue
		}
		p := d.host.Partition(id)
		byPart[p] = append(byPart[p], id)
	}
	var settled atomic.Int64
	var wg sync.WaitGroup
	slots := make(chan struct{}, depReadParallel)
	for p, ids := range byPart {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			for len(ids) > 0 {
				chunk := ids[:min(len(ids), coord.MaxRead)]
				ids = ids[len(chunk):]
				states, err := d.coord.ReadStates(ctx, p, chunk)
				if err != nil {
					d.cfg.Logger.Debug("reading dependencies failed; retrying after backoff", "partition", p, "ids", len(chunk), "err", err)
					continue
				}
				for i, t := range states {
					if t == nil {
						continue
					}
					if o := outcomeOf(t); o != DepUndecided {
						c.cache.put(chunk[i], o)
						c.settle(chunk[i])
						settled.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	if settled.Load() > 0 {
		d.waiters.NotifyAll() // their dependants may be claimable, or doomed
	}
}

func (c *depChecker) settle(id uint64) {
	c.mu.Lock()
	c.watch.settle(id)
	c.mu.Unlock()
}

// CachedDep is what the dependency cache says of id (ok: it holds id).
func (d *Dispatcher) CachedDep(id uint64) (o DepOutcome, ok bool) { return d.deps.cache.get(id) }
