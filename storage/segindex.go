package storage

import (
	"cmp"
	"slices"
	"sort"
)

// segIndex is one tracked partition's anti-entropy segment index in
// memory: the (id, digest) of every stored task, listed by segment range.
// It is a sorted array and a list of the changes made since the array was
// built (an LSM of two levels): a change is an append, and the list is
// sorted and merged into the array when it has grown past a sixteenth of
// it or when the index is listed, so a change costs an append and about
// sixteen array moves, amortized. (A map of the changes cost a map write
// per change, 4% of a node's CPU during the enqueue benchmark; the list
// is read only by anti-entropy, which lists a few segments at a time.)
// The array holds 16 bytes a task and no pointers (the garbage collector
// does not scan it): about 18 bytes a task in all, where a B-tree of
// (segment, id, digest) took 36 and doubled the node's heap at 10 million
// tasks (docs/BENCHMARKS.md, session 14). Not safe for concurrent use.
type segIndex struct {
	base  []segEntry  // by (Segment(id), id); no deleted ids
	delta []segChange // changes since base was built, in the order made
}

// segEntry is one stored task of a segIndex's array.
type segEntry struct{ id, digest uint64 }

// segChange is a change not yet merged into the array.
type segChange struct {
	id, digest uint64
	deleted    bool
}

// segItem is one entry with its segment, for sorting and listing.
type segItem struct {
	seg    uint16
	id     uint64
	digest uint64
}

func compareSegItems(a, b segItem) int {
	return cmp.Or(cmp.Compare(a.seg, b.seg), cmp.Compare(a.id, b.id))
}

// segMergeMin is the change list's length below which a segIndex merges
// only when listed.
const segMergeMin = 1024

// newSegIndex returns the index of the given entries, in any order.
func newSegIndex(items []segItem) *segIndex {
	slices.SortFunc(items, compareSegItems)
	base := make([]segEntry, len(items))
	for i, it := range items {
		base[i] = segEntry{it.id, it.digest}
	}
	return &segIndex{base: base}
}

// set records that id's digest is digest.
func (x *segIndex) set(id, digest uint64) {
	x.delta = append(x.delta, segChange{id: id, digest: digest})
	x.maybeMerge()
}

// remove records that id is not stored.
func (x *segIndex) remove(id uint64) {
	x.delta = append(x.delta, segChange{id: id, deleted: true})
	x.maybeMerge()
}

func (x *segIndex) maybeMerge() {
	if len(x.delta) > segMergeMin+len(x.base)/16 {
		x.merge()
	}
}

// merge folds the change list into the array: of several changes of one
// id, the last one made counts.
func (x *segIndex) merge() {
	if len(x.delta) == 0 {
		return
	}
	type change struct {
		seg uint16
		at  int // position in delta
	}
	changes := make([]change, len(x.delta))
	for i, c := range x.delta {
		changes[i] = change{Segment(c.id), i}
	}
	slices.SortFunc(changes, func(a, b change) int {
		return cmp.Or(cmp.Compare(a.seg, b.seg), cmp.Compare(x.delta[a.at].id, x.delta[b.at].id), cmp.Compare(a.at, b.at))
	})
	out := make([]segEntry, 0, len(x.base)+len(changes))
	i := 0
	for j, ch := range changes {
		c := x.delta[ch.at]
		if j+1 < len(changes) && x.delta[changes[j+1].at].id == c.id {
			continue // a later change of the same id follows
		}
		key := segItem{seg: ch.seg, id: c.id}
		for ; i < len(x.base); i++ {
			b := x.base[i]
			if compareSegItems(segItem{seg: Segment(b.id), id: b.id}, key) >= 0 {
				break
			}
			out = append(out, b)
		}
		if i < len(x.base) && x.base[i].id == c.id {
			i++ // replaced or deleted by the change
		}
		if !c.deleted {
			out = append(out, segEntry{c.id, c.digest})
		}
	}
	out = append(out, x.base[i:]...)
	x.base = slices.Clip(out)
	x.delta = x.delta[:0]
}

// list returns the entries in the ranges (ascending, disjoint), in
// (segment, id) order. It merges the change list first.
func (x *segIndex) list(ranges []SegmentRange) []segItem {
	x.merge()
	var out []segItem
	for _, r := range ranges {
		if r.Lo >= r.Hi || r.Lo >= 1<<16 {
			continue
		}
		i := sort.Search(len(x.base), func(i int) bool { return uint32(Segment(x.base[i].id)) >= r.Lo })
		for ; i < len(x.base); i++ {
			b := x.base[i]
			seg := Segment(b.id)
			if uint32(seg) >= r.Hi {
				break
			}
			out = append(out, segItem{seg, b.id, b.digest})
		}
	}
	return out
}

// inRanges reports whether seg is in one of the ranges (ascending,
// disjoint).
func inRanges(ranges []SegmentRange, seg uint16) bool {
	i := sort.Search(len(ranges), func(i int) bool { return ranges[i].Hi > uint32(seg) })
	return i < len(ranges) && ranges[i].Lo <= uint32(seg)
}
