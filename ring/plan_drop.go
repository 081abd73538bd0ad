package ring

import (
	"cmp"
	"slices"
)

// trim removes members from cohorts that hold too many nodes of one zone
// (zones appeared or changed) or are too large (n was lowered). It works in
// rounds, one member per partition per round, so that the loads it lowers
// stay even; the member dropped is the one whose node is furthest above its
// ideal load, the latest member on ties.
func (pl *planner) trim() {
	for {
		trimmed := false
		for part, c := range pl.cohorts {
			pl.countZones(c)
			over := false
			for _, i := range c {
				over = over || pl.zoneCnt[pl.zone[i]] > pl.perZone
			}
			victim := -1
			if over || len(c) > pl.n {
				for pos, i := range c {
					if over && pl.zoneCnt[pl.zone[i]] <= pl.perZone {
						continue
					}
					if victim < 0 || pl.surplus(i) >= pl.surplus(c[victim]) {
						victim = pos
					}
				}
			}
			pl.clearZoneCnt(c)
			if victim >= 0 {
				pl.remove(part, c[victim])
				trimmed = true
			}
		}
		if !trimmed {
			return
		}
	}
}

// shed removes replicas from nodes above the ceiling of their ideal load. A
// node sheds the partitions where a hole hurts least: first those without a
// hole yet (so that one node can fill each), then those that some node with
// room could join, then by hash, which spreads the holes.
func (pl *planner) shed() {
	var room []int
	for i := range pl.ids {
		if pl.load[i] < pl.hi[i] {
			room = append(room, i)
		}
	}
	type cand struct {
		part     int
		holes    int
		fillable bool
		hash     uint64
	}
	for x := range pl.ids {
		excess := pl.load[x] - pl.hi[x]
		if excess <= 0 {
			continue
		}
		var cands []cand
		for _, part := range pl.parts[x] {
			c := pl.cohorts[part]
			if !slices.Contains(c, x) {
				continue
			}
			fillable := pl.replaceable(c, x, room, func(int) bool { return true })
			cands = append(cands, cand{part, pl.n - len(c), fillable, mix(pl.idHash[x], part)})
		}
		slices.SortFunc(cands, func(a, b cand) int {
			return cmp.Or(
				cmp.Compare(a.holes, b.holes),
				-cmp.Compare(boolInt(a.fillable), boolInt(b.fillable)),
				cmp.Compare(a.hash, b.hash),
				cmp.Compare(a.part, b.part),
			)
		})
		for _, cd := range cands[:excess] {
			pl.remove(cd.part, x)
		}
	}
}

// makeRoom drops replicas from nodes above the floor of their ideal load when
// the nodes below their floor need more replicas than there are holes (a
// node joined). The replicas are taken one at a time from the node furthest
// above its ideal; each node gives them up in partitions that a node below
// its floor could join (with backOnly, only ones it was in: a swap that
// moves nothing), preferring partitions without a hole, then by hash. It
// returns how many replicas it dropped.
func (pl *planner) makeRoom(backOnly bool) (made int) {
	var under []int
	need := 0
	for i := range pl.ids {
		if pl.load[i] < pl.lo[i] {
			under = append(under, i)
			need += pl.lo[i] - pl.load[i]
		}
	}
	for _, c := range pl.cohorts {
		need -= pl.n - len(c)
	}
	spent := make([]bool, len(pl.ids)) // donors left with nothing to give
	for need > 0 {
		quota := make([]int, len(pl.ids))
		load := slices.Clone(pl.load)
		for range need {
			x := -1
			for i := range pl.ids {
				if spent[i] || load[i] <= pl.lo[i] {
					continue
				}
				if x < 0 || cmp.Or(
					cmp.Compare(int64(load[i])*fixedScale-pl.ideal[i], int64(load[x])*fixedScale-pl.ideal[x]),
					cmp.Compare(pl.idHash[i], pl.idHash[x]),
				) > 0 {
					x = i
				}
			}
			if x < 0 {
				break
			}
			quota[x]++
			load[x]--
		}
		before := made
		for x, q := range quota {
			if q == 0 {
				continue
			}
			type cand struct {
				part  int
				holes int
				hash  uint64
			}
			var cands []cand
			for _, part := range pl.parts[x] {
				c := pl.cohorts[part]
				if !slices.Contains(c, x) {
					continue
				}
				fillable := pl.replaceable(c, x, under, func(d int) bool {
					return pl.load[d] < pl.lo[d] && (!backOnly || slices.Contains(pl.orig[part], d))
				})
				if fillable {
					cands = append(cands, cand{part, pl.n - len(c), mix(pl.idHash[x], part)})
				}
			}
			slices.SortFunc(cands, func(a, b cand) int {
				return cmp.Or(cmp.Compare(a.holes, b.holes), cmp.Compare(a.hash, b.hash), cmp.Compare(a.part, b.part))
			})
			if len(cands) < q {
				spent[x] = true
			}
			for _, cd := range cands[:min(q, len(cands))] {
				pl.remove(cd.part, x)
				if !backOnly {
					pl.evicted[cd.part] = append(pl.evicted[cd.part], x)
				}
				need--
				made++
			}
		}
		if made == before {
			break
		}
	}
	return made
}
