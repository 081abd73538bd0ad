package storage

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// A segIndex lists exactly what a plain map of its changes holds, in
// (segment, id) order, through random sets and removes across many
// merges of its change map into its array.
func TestSegIndexMatchesAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 1))
	want := map[uint64]uint64{}
	var items []segItem
	for range 3000 {
		id := rng.Uint64N(20000)
		if _, ok := want[id]; ok {
			continue
		}
		want[id] = rng.Uint64()
		items = append(items, segItem{Segment(id), id, want[id]})
	}
	x := newSegIndex(items)
	randomRanges := func() []SegmentRange {
		var rs []SegmentRange
		lo := uint32(0)
		for lo < 1<<16 {
			lo += uint32(rng.IntN(20000))
			hi := min(lo+uint32(rng.IntN(20000)), 1<<16)
			if lo < hi {
				rs = append(rs, SegmentRange{lo, hi})
			}
			lo = hi + 1
		}
		return rs
	}
	merges := 0
	for step := range 60000 {
		id := rng.Uint64N(20000)
		if rng.IntN(3) == 0 {
			delete(want, id)
			x.remove(id)
		} else {
			want[id] = rng.Uint64()
			x.set(id, want[id])
		}
		if len(x.delta) == 0 {
			merges++
		}
		if step%5000 != 4999 {
			continue
		}
		if n := x.len(); n != len(want) {
			t.Fatalf("step %d: len %d, want %d", step, n, len(want))
		}
		for _, rs := range [][]SegmentRange{{{0, 1 << 16}}, randomRanges(), randomRanges()} {
			var wantList []segItem
			for id, d := range want {
				if seg := Segment(id); inRanges(rs, seg) {
					wantList = append(wantList, segItem{seg, id, d})
				}
			}
			slices.SortFunc(wantList, compareSegItems)
			if got := x.list(rs); !slices.Equal(got, wantList) {
				t.Fatalf("step %d, ranges %v: listed %d entries, want %d", step, rs, len(got), len(wantList))
			}
		}
	}
	if merges < 10 {
		t.Fatalf("only %d merges of the change map: the test does not reach them", merges)
	}
}

// len returns the number of stored tasks (for the test).
func (x *segIndex) len() int {
	x.merge()
	return len(x.base)
}
