package ring

import (
	"cmp"
	"fmt"
	"slices"
)

// fillAll fills every hole. First with members of the current cohort
// coming back, which moves nothing: directly, then by chains of such moves
// (augment, starting from a back vertex). Then with any node: directly,
// then by a chain of moves that costs nothing more, then by any chain.
func (pl *planner) fillAll() {
	underHi := func(i int) bool { return pl.load[i] < pl.hi[i] }
	pl.fill(true)
	for pl.canComeBack() {
		var starts []int
		for part, c := range pl.cohorts {
			if len(c) < pl.n {
				starts = append(starts, pl.partV(part, true))
			}
		}
		if len(starts) == 0 || !pl.augment(starts, underHi, true) {
			break
		}
	}
	for _, part := range pl.fill(false) {
		for len(pl.cohorts[part]) < pl.n {
			start := []int{pl.partV(part, false)}
			if !pl.augment(start, underHi, true) && !pl.augment(start, underHi, false) {
				panic(fmt.Sprintf("ring: cannot fill partition %d (bug)", part))
			}
		}
	}
}

// canComeBack reports whether some node below the ceiling of its ideal is
// out of a cohort it was in (trim or shed dropped it), so that a chain of
// members coming back could end with it.
func (pl *planner) canComeBack() bool {
	for part, c := range pl.cohorts {
		for _, i := range pl.orig[part] {
			if pl.load[i] < pl.hi[i] && !slices.Contains(c, i) && pl.canReturn(part, i) {
				return true
			}
		}
	}
	return false
}

// canReturn reports whether node i joining partition q would be a member of
// the current cohort coming back, and not one makeRoom dropped from q to
// make room for another node.
func (pl *planner) canReturn(q, i int) bool {
	return slices.Contains(pl.orig[q], i) && !slices.Contains(pl.evicted[q], i)
}

// fill fills holes partition by partition. Each goes to the best (see
// fillKey) eligible node: not in the cohort, its zone not full there, below
// the ceiling of its ideal; with backOnly, only to a node coming back. It
// returns the partitions it could not fill.
func (pl *planner) fill(backOnly bool) (stuck []int) {
	var room []int
	for i := range pl.ids {
		if pl.load[i] < pl.hi[i] {
			room = append(room, i)
		}
	}
	for part := range pl.cohorts {
		if len(pl.cohorts[part]) == pl.n {
			continue
		}
		pl.countZones(pl.cohorts[part])
		for len(pl.cohorts[part]) < pl.n {
			c := pl.cohorts[part]
			best, bestKey := -1, fillKey{}
			for _, i := range room {
				if slices.Contains(c, i) || pl.zoneCnt[pl.zone[i]] >= pl.perZone {
					continue
				}
				back := pl.canReturn(part, i)
				if backOnly && !back {
					continue
				}
				key := fillKey{
					back:    back,
					under:   pl.load[i] < pl.lo[i],
					deficit: -pl.surplus(i),
					hash:    mix(pl.idHash[i], part),
				}
				if best < 0 || key.better(bestKey) {
					best, bestKey = i, key
				}
			}
			if best < 0 {
				stuck = append(stuck, part)
				break
			}
			pl.add(part, best)
			pl.zoneCnt[pl.zone[best]]++
			if pl.load[best] == pl.hi[best] {
				room = slices.DeleteFunc(room, func(i int) bool { return i == best })
			}
		}
		pl.clearZoneCnt(pl.cohorts[part])
	}
	return stuck
}

// fillKey ranks the candidates for a hole: first a node coming back (it was
// in the current cohort and trim or shed dropped it: no move at all), then a
// node below its floor, then the one furthest below its ideal, then by hash.
type fillKey struct {
	back, under bool
	deficit     int64
	hash        uint64
}

func (a fillKey) better(b fillKey) bool {
	return cmp.Or(
		cmp.Compare(boolInt(a.back), boolInt(b.back)),
		cmp.Compare(boolInt(a.under), boolInt(b.under)),
		cmp.Compare(a.deficit, b.deficit),
		cmp.Compare(a.hash, b.hash),
	) > 0
}
