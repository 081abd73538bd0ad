package storage

import (
	"slices"
	"sort"
)

// readyChunk is the most ids a chunk of a readyList holds.
const readyChunk = 512

// readyList is one queue's ready tasks in one partition, in claim order:
// priority descending, then id ascending. Per priority it keeps the ids in
// sorted chunks of up to readyChunk ids (a two-level B-tree, without
// pointers among the ids).
//
// The shape follows how a queue is used: new ids (sonyflake, growing with
// time) are appended at the end of their priority, and claims take the
// head. An append to a full last chunk starts a new chunk instead of
// splitting it, so a queue filled in id order packs 8 bytes per task; a
// B-tree that splits its nodes in halves (google/btree, tidwall/btree)
// leaves them half full under that pattern, and with 16-byte entries cost
// about 74 bytes of RSS per ready task at 10 million (docs/SCALING.md).
// Inserts elsewhere (a claim released back to its place) split a full
// chunk in halves; chunks emptied by removals are dropped, and small
// neighbours are merged.
type readyList struct {
	levels []readyLevel // by priority descending, none empty
	n      int
}

type readyLevel struct {
	prio   int32
	chunks [][]uint64 // each sorted ascending and non-empty; in order
}

// len returns how many tasks the list holds.
func (l *readyList) len() int { return l.n }

// oldest returns the smallest id the list holds (the oldest task, ids
// growing with time), across priorities: O(priorities).
func (l *readyList) oldest() (uint64, bool) {
	var id uint64
	for i, lv := range l.levels {
		if first := lv.chunks[0][0]; i == 0 || first < id {
			id = first
		}
	}
	return id, len(l.levels) > 0
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
		l.levels = slices.Insert(l.levels, i, readyLevel{prio: e.Priority})
	}
	if !l.levels[i].insert(e.ID) {
		return false
	}
	l.n++
	return true
}

// remove takes e out; false if it was not there.
func (l *readyList) remove(e ReadyEntry) bool {
	i, ok := l.level(e.Priority)
	if !ok || !l.levels[i].remove(e.ID) {
		return false
	}
	if len(l.levels[i].chunks) == 0 {
		l.levels = slices.Delete(l.levels, i, i+1)
	}
	l.n--
	return true
}

// head appends up to limit entries from the front of the list to out.
func (l *readyList) head(limit int, out []ReadyEntry) []ReadyEntry {
	for _, lv := range l.levels {
		for _, c := range lv.chunks {
			for _, id := range c {
				if len(out) >= limit {
					return out
				}
				out = append(out, ReadyEntry{ID: id, Priority: lv.prio})
			}
		}
	}
	return out
}

// chunkOf returns the index of the first chunk whose last id is >= id
// (len(lv.chunks) when id is above them all).
func (lv *readyLevel) chunkOf(id uint64) int {
	return sort.Search(len(lv.chunks), func(i int) bool {
		c := lv.chunks[i]
		return c[len(c)-1] >= id
	})
}

func (lv *readyLevel) insert(id uint64) bool {
	i := lv.chunkOf(id)
	if i == len(lv.chunks) {
		// Above every id: onto the last chunk, or a new one when it is full.
		if i > 0 && len(lv.chunks[i-1]) < readyChunk {
			lv.chunks[i-1] = append(lv.chunks[i-1], id)
		} else {
			lv.chunks = append(lv.chunks, append(make([]uint64, 0, 8), id))
		}
		return true
	}
	c := lv.chunks[i]
	j, found := slices.BinarySearch(c, id)
	if found {
		return false
	}
	if len(c) < readyChunk {
		lv.chunks[i] = slices.Insert(c, j, id)
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
	lv.chunks[i] = left
	lv.chunks = slices.Insert(lv.chunks, i+1, right)
	return true
}

func (lv *readyLevel) remove(id uint64) bool {
	i := lv.chunkOf(id)
	if i == len(lv.chunks) {
		return false
	}
	c := lv.chunks[i]
	j, found := slices.BinarySearch(c, id)
	if !found {
		return false
	}
	switch {
	case len(c) == 1:
		lv.chunks = slices.Delete(lv.chunks, i, i+1)
		return true
	case j == 0:
		c = c[1:] // a claim takes the head: no copy
	default:
		c = slices.Delete(c, j, j+1)
	}
	lv.chunks[i] = c
	// Merge a chunk thinned by removals with a neighbour when both fit in
	// half a chunk.
	if len(c) < readyChunk/8 {
		switch {
		case i > 0 && len(lv.chunks[i-1])+len(c) <= readyChunk/2:
			i--
		case i+1 < len(lv.chunks) && len(c)+len(lv.chunks[i+1]) <= readyChunk/2:
		default:
			return true
		}
		lv.chunks[i] = append(slices.Clip(lv.chunks[i]), lv.chunks[i+1]...)
		lv.chunks = slices.Delete(lv.chunks, i+1, i+2)
	}
	return true
}
