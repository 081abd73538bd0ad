package storage

import (
	"slices"
	"sort"
)

// readyChunk is the most ids a chunk of a readyLine holds.
const readyChunk = 512

// readyList is one queue's ready tasks in one partition, in claim order:
// priority descending; within a priority, the fairness keys in turn
// (deficit round robin: a key of weight w is served w tasks a turn), and
// each key's tasks by id ascending. Tasks without a key are one key of
// their own (""), so a queue that uses no keys has one line per priority
// and its order is priority, then id, as before keys existed.
//
// Each key's line keeps its ids in sorted chunks of up to readyChunk ids
// (a two-level B-tree, without pointers among the ids). The shape follows
// how a queue is used: new ids (sonyflake, growing with time) are
// appended at the end of their line, and claims take the head. An append
// to a full last chunk starts a new chunk instead of splitting it, so a
// queue filled in id order packs 8 bytes per task; a B-tree that splits
// its nodes in halves (google/btree, tidwall/btree) leaves them half full
// under that pattern, and with 16-byte entries cost about 74 bytes of RSS
// per ready task at 10 million (docs/SCALING.md). Inserts elsewhere (a
// claim released back to its place) split a full chunk in halves; chunks
// emptied by removals are dropped, and small neighbours are merged.
//
// Turns (docs/SCHEDULING.md, "Fair claims"): the keys with ready tasks of
// a priority form a ring; the key whose turn it is (cur) has quota tasks
// left to give. Taking its line's head uses one; when none is left, or
// its line empties, the turn passes to the next key of the ring with a
// quota of its weight. A key whose line was empty joins the ring just
// before cur, at the end of the round: it cannot bank turns while it had
// nothing ready. Taking another key's head (a claim that skipped cur's,
// blocked by a dependency or claimed concurrently) or a task that is not
// a head (a cancel) uses no turn. Every step is O(1) in the number of
// keys: a map from key to line and the ring's pointers.
type readyList struct {
	levels []readyLevel // by priority descending, none empty
	n      int
}

type readyLevel struct {
	prio  int32
	lines map[string]*readyLine // by key, none empty
	cur   *readyLine            // whose turn it is
	quota int                   // tasks cur may still give this turn
}

// readyLine is one key's ready tasks of one priority.
type readyLine struct {
	key        string
	weight     int        // the weight of the key's latest task inserted, at least 1
	chunks     [][]uint64 // each sorted ascending and non-empty; in order
	prev, next *readyLine // the ring of keys in turn order
}

// len returns how many tasks the list holds.
func (l *readyList) len() int { return l.n }

// oldest returns the smallest id the list holds (the oldest task, ids
// growing with time), across priorities and keys: O(priorities x keys).
func (l *readyList) oldest() (uint64, bool) {
	var id uint64
	found := false
	for _, lv := range l.levels {
		for _, ln := range lv.lines {
			if first := ln.chunks[0][0]; !found || first < id {
				id, found = first, true
			}
		}
	}
	return id, found
}

// level returns the index of prio's level, and whether it exists.
func (l *readyList) level(prio int32) (int, bool) {
	i := sort.Search(len(l.levels), func(i int) bool { return l.levels[i].prio <= prio })
	return i, i < len(l.levels) && l.levels[i].prio == prio
}

// insert adds e; false if it was there already.
func (l *readyList) insert(e ReadyEntry) bool {
	i, ok := l.level(e.Priority)
	if !ok {
		l.levels = slices.Insert(l.levels, i, readyLevel{prio: e.Priority, lines: map[string]*readyLine{}})
	}
	if !l.levels[i].insert(e) {
		return false
	}
	l.n++
	return true
}

// remove takes e out; false if it was not there.
func (l *readyList) remove(e ReadyEntry) bool {
	i, ok := l.level(e.Priority)
	if !ok || !l.levels[i].remove(e) {
		return false
	}
	if len(l.levels[i].lines) == 0 {
		l.levels = slices.Delete(l.levels, i, i+1)
	}
	l.n--
	return true
}

// head appends up to limit entries from the front of the list to out: the
// order claims take them in, turns included. It visits at most limit keys
// a priority before it has visited them all: O(limit) when every line
// holds one task at least.
func (l *readyList) head(limit int, out []ReadyEntry) []ReadyEntry {
	for i := range l.levels {
		if len(out) >= limit {
			break
		}
		out = l.levels[i].head(limit, out)
	}
	return out
}

func weightOf(w uint32) int { return max(int(w), 1) }

func (lv *readyLevel) insert(e ReadyEntry) bool {
	ln := lv.lines[e.Key]
	if ln == nil {
		ln = &readyLine{key: e.Key, weight: weightOf(e.Weight)}
		if !ln.insert(e.ID) {
			return false
		}
		lv.lines[e.Key] = ln
		if lv.cur == nil {
			ln.prev, ln.next = ln, ln
			lv.cur, lv.quota = ln, ln.weight
		} else {
			// At the end of the round: just before cur.
			ln.prev, ln.next = lv.cur.prev, lv.cur
			lv.cur.prev.next = ln
			lv.cur.prev = ln
		}
		return true
	}
	if !ln.insert(e.ID) {
		return false
	}
	ln.weight = weightOf(e.Weight)
	return true
}

func (lv *readyLevel) remove(e ReadyEntry) bool {
	ln := lv.lines[e.Key]
	if ln == nil {
		return false
	}
	wasHead := ln.chunks[0][0] == e.ID
	if !ln.remove(e.ID) {
		return false
	}
	if len(ln.chunks) == 0 {
		if lv.cur == ln {
			lv.pass()
		}
		ln.prev.next, ln.next.prev = ln.next, ln.prev
		if lv.cur == ln { // it was alone
			lv.cur, lv.quota = nil, 0
		}
		delete(lv.lines, e.Key)
		return true
	}
	if lv.cur == ln && wasHead {
		if lv.quota--; lv.quota <= 0 {
			lv.pass()
		}
	}
	return true
}

// pass gives the turn to the next key of the ring.
func (lv *readyLevel) pass() {
	lv.cur = lv.cur.next
	lv.quota = lv.cur.weight
}

// head appends up to limit entries of the level to out, in turn order,
// without taking them: the turns the takes would pass, simulated.
func (lv *readyLevel) head(limit int, out []ReadyEntry) []ReadyEntry {
	if lv.cur == nil {
		return out
	}
	// The lines in turn order from cur, each with how far the
	// simulation has read it; the first round visits them (at most as
	// many as entries wanted, as each gives one at least), later rounds
	// go over the same ones again.
	type walk struct {
		ln    *readyLine
		ci, j int
	}
	var buf [8]walk
	walks := buf[:0]
	take := func(w *walk, n int) {
		weight := uint32(w.ln.weight)
		if w.ln.key == "" {
			weight = 0 // as the keyless tasks' specs say
		}
		for ; n > 0 && w.ci < len(w.ln.chunks) && len(out) < limit; n-- {
			c := w.ln.chunks[w.ci]
			out = append(out, ReadyEntry{ID: c[w.j], Priority: lv.prio, Key: w.ln.key, Weight: weight})
			if w.j++; w.j == len(c) {
				w.ci, w.j = w.ci+1, 0
			}
		}
	}
	ln, quota := lv.cur, lv.quota
	for len(out) < limit {
		walks = append(walks, walk{ln: ln})
		take(&walks[len(walks)-1], quota)
		if ln = ln.next; ln == lv.cur {
			break
		}
		quota = ln.weight
	}
	for len(out) < limit {
		before := len(out)
		for i := range walks {
			take(&walks[i], walks[i].ln.weight)
		}
		if len(out) == before {
			break // every line read to its end
		}
	}
	return out
}

// chunkOf returns the index of the first chunk whose last id is >= id
// (len(ln.chunks) when id is above them all).
func (ln *readyLine) chunkOf(id uint64) int {
	return sort.Search(len(ln.chunks), func(i int) bool {
		c := ln.chunks[i]
		return c[len(c)-1] >= id
	})
}

func (ln *readyLine) insert(id uint64) bool {
	i := ln.chunkOf(id)
	if i == len(ln.chunks) {
		// Above every id: onto the last chunk, or a new one when it is full.
		if i > 0 && len(ln.chunks[i-1]) < readyChunk {
			ln.chunks[i-1] = append(ln.chunks[i-1], id)
		} else {
			ln.chunks = append(ln.chunks, append(make([]uint64, 0, 8), id))
		}
		return true
	}
	c := ln.chunks[i]
	j, found := slices.BinarySearch(c, id)
	if found {
		return false
	}
	if len(c) < readyChunk {
		ln.chunks[i] = slices.Insert(c, j, id)
		return true
	}
	// Split the full chunk in halves, then insert into the right half.
	half := len(c) / 2
	right := slices.Clone(c[half:])
	left := c[:half:half]
	if j <= half {
		left = slices.Insert(left, j, id)
	} else {
		right = slices.Insert(right, j-half, id)
	}
	ln.chunks[i] = left
	ln.chunks = slices.Insert(ln.chunks, i+1, right)
	return true
}

func (ln *readyLine) remove(id uint64) bool {
	i := ln.chunkOf(id)
	if i == len(ln.chunks) {
		return false
	}
	c := ln.chunks[i]
	j, found := slices.BinarySearch(c, id)
	if !found {
		return false
	}
	switch {
	case len(c) == 1:
		ln.chunks = slices.Delete(ln.chunks, i, i+1)
		return true
	case j == 0:
		c = c[1:] // a claim takes the head: no copy
	default:
		c = slices.Delete(c, j, j+1)
	}
	ln.chunks[i] = c
	// Merge a chunk thinned by removals with a neighbour when both fit in
	// half a chunk.
	if len(c) < readyChunk/8 {
		switch {
		case i > 0 && len(ln.chunks[i-1])+len(c) <= readyChunk/2:
			i--
		case i+1 < len(ln.chunks) && len(c)+len(ln.chunks[i+1]) <= readyChunk/2:
		default:
			return true
		}
		ln.chunks[i] = append(slices.Clip(ln.chunks[i]), ln.chunks[i+1]...)
		ln.chunks = slices.Delete(ln.chunks, i+1, i+2)
	}
	return true
}
