package storage

import (
	"cmp"
	"slices"
	"sort"
)

// segIndex is one tracked partition's anti-entropy segment index in
// memory: the (id, digest) of every stored task, listed by segment range.
// It is a sorted array and a small map of the changes since the array was
// built (an LSM of two levels): a change is a map write, and the map is
// merged into the array when it has grown past a sixteenth of it, so a
// change costs a map write and about sixteen array moves, amortized.
// The array holds 16 bytes a task and no pointers (the garbage collector
// does not scan it): about 18 bytes a task in all, where a B-tree of
// (segment, id, digest) took 36 and doubled the node's heap at 10 million
// tasks (docs/BENCHMARKS.md, session 14). Not safe for concurrent use.
type segIndex struct {
	base  []segEntry          // by (Segment(id), id); no deleted ids
	delta map[uint64]segDelta // changes since base was built
}

// segEntry is one stored task of a segIndex's array.
type segEntry struct{ id, digest uint64 }

// segDelta is a change not yet merged into the array.
type segDelta struct {
	digest  uint64
	deleted bool
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

// segMergeMin is the map size below which a segIndex never merges.
const segMergeMin = 1024

// newSegIndex returns the index of the given entries, in any order.
func newSegIndex(items []segItem) *segIndex {
	slices.SortFunc(items, compareSegItems)
	base := make([]segEntry, len(items))
	for i, it := range items {
		base[i] = segEntry{it.id, it.digest}
	}
	return &segIndex{base: base, delta: make(map[uint64]segDelta)}
}

// set records that id's digest is digest.
func (x *segIndex) set(id, digest uint64) {
	x.delta[id] = segDelta{digest: digest}
	x.maybeMerge()
}

// remove records that id is not stored.
func (x *segIndex) remove(id uint64) {
	x.delta[id] = segDelta{deleted: true}
	x.maybeMerge()
}

func (x *segIndex) maybeMerge() {
	if len(x.delta) > segMergeMin+len(x.base)/16 {
		x.merge()
	}
}

// merge folds the map into the array.
func (x *segIndex) merge() {
	changes := make([]segItem, 0, len(x.delta))
	for id := range x.delta {
		changes = append(changes, segItem{seg: Segment(id), id: id})
	}
	slices.SortFunc(changes, compareSegItems)
	out := make([]segEntry, 0, len(x.base)+len(changes))
	i := 0
	for _, c := range changes {
		for ; i < len(x.base); i++ {
			b := x.base[i]
			if compareSegItems(segItem{seg: Segment(b.id), id: b.id}, c) >= 0 {
				break
			}
			out = append(out, b)
		}
		if i < len(x.base) && x.base[i].id == c.id {
			i++ // replaced or deleted by the change
		}
		if d := x.delta[c.id]; !d.deleted {
			out = append(out, segEntry{c.id, d.digest})
		}
	}
	out = append(out, x.base[i:]...)
	x.base = slices.Clip(out)
	clear(x.delta)
}

// list returns the entries in the ranges (ascending, disjoint), in
// (segment, id) order.
func (x *segIndex) list(ranges []SegmentRange) []segItem {
	var fromBase []segItem
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
			if _, changed := x.delta[b.id]; !changed {
				fromBase = append(fromBase, segItem{seg, b.id, b.digest})
			}
		}
	}
	var fromDelta []segItem
	for id, d := range x.delta {
		if seg := Segment(id); !d.deleted && inRanges(ranges, seg) {
			fromDelta = append(fromDelta, segItem{seg, id, d.digest})
		}
	}
	if len(fromDelta) == 0 {
		return fromBase
	}
	slices.SortFunc(fromDelta, compareSegItems)
	out := make([]segItem, 0, len(fromBase)+len(fromDelta))
	i := 0
	for _, d := range fromDelta {
		for ; i < len(fromBase) && compareSegItems(fromBase[i], d) < 0; i++ {
			out = append(out, fromBase[i])
		}
		out = append(out, d)
	}
	return append(out, fromBase[i:]...)
}

// inRanges reports whether seg is in one of the ranges (ascending,
// disjoint).
func inRanges(ranges []SegmentRange, seg uint16) bool {
	i := sort.Search(len(ranges), func(i int) bool { return ranges[i].Hi > uint32(seg) })
	return i < len(ranges) && ranges[i].Lo <= uint32(seg)
}
