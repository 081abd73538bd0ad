package ring

import (
	"cmp"
	"fmt"
	"slices"
)

// Plan returns a placement of p partitions, each on a cohort of n distinct
// nodes, over the given nodes, moving as few replicas of current as it can.
//
// current may be empty (a new cluster); otherwise it must have p partitions.
// Its cohorts may have any size: a cohort larger than n is trimmed and a
// smaller one filled, which is how the replication factor is changed.
// Members of current that are not among nodes are gone: their replicas are
// reassigned. Unknown, empty or repeated members in current are ignored.
// The order of nodes does not matter and current is not modified.
//
// The result meets, in order of precedence:
//
//  1. Cohorts: every partition has exactly n distinct nodes.
//  2. Zones: with Z distinct zones among nodes (a node with Zone "" counts
//     as a zone of its own), a cohort holds at most c nodes of one zone,
//     c the smallest count such that the zones can fill a cohort:
//     sum over zones of min(c, nodes in zone) >= n. When Z >= n, c is 1:
//     every cohort spans n distinct zones.
//  3. Balance: every node's load (replica count) is the floor or the
//     ceiling of its ideal load: its weight's share of p*n, capped at p
//     (one replica per partition) and, per zone, at c*p, the excess shared
//     among the uncapped nodes by weight. The zone cap is where zones win
//     over balance: a lone node in one of n zones holds a replica of every
//     partition whatever its weight, and the ideal it is balanced against
//     says so. Without zones the ideal is the plain weighted share.
//  4. Movement: replicas stay on the nodes of current unless 1-3 require
//     otherwise. Adding a node to a balanced cluster (equal weights, no
//     zones) moves its ideal load (rounded) to it and nothing else;
//     removing a node moves that node's replicas and, whenever a placement
//     meeting 1-3 allows it, nothing else; lowering n only drops replicas
//     and raising it only adds some, when 1-3 allow it; planning again with
//     the same nodes moves nothing. When 1-3 cannot hold otherwise (a node
//     must reach partitions where no replica is free to take), other
//     replicas move too: balance wins over movement.
//
// Plan is deterministic: equal inputs give equal placements.
//
// Errors, wrapped with context: ErrBadPartitionCount, ErrBadReplication
// (n < 1), ErrBadNode (empty id, negative weight), ErrDuplicateNode,
// ErrTooFewNodes (n > len(nodes)) and ErrPartitionMismatch (current has
// partitions, but not p of them).
func Plan(current Placement, nodes []Node, p, n int) (Placement, error) {
	if err := ValidatePartitions(p); err != nil {
		return Placement{}, err
	}
	if n < 1 {
		return Placement{}, fmt.Errorf("ring: replication factor %d is less than 1: %w", n, ErrBadReplication)
	}
	seen := make(map[NodeID]bool, len(nodes))
	for i, nd := range nodes {
		switch {
		case nd.ID == "":
			return Placement{}, fmt.Errorf("ring: node %d has an empty id: %w", i, ErrBadNode)
		case nd.Weight < 0:
			return Placement{}, fmt.Errorf("ring: node %q has negative weight %d: %w", nd.ID, nd.Weight, ErrBadNode)
		case seen[nd.ID]:
			return Placement{}, fmt.Errorf("ring: node %q appears twice: %w", nd.ID, ErrDuplicateNode)
		}
		seen[nd.ID] = true
	}
	if n > len(nodes) {
		return Placement{}, fmt.Errorf("ring: replication factor %d needs at least %d nodes, have %d: %w",
			n, n, len(nodes), ErrTooFewNodes)
	}
	if cp := current.P(); cp != 0 && cp != p {
		return Placement{}, fmt.Errorf("ring: current placement has %d partitions, want %d: %w",
			cp, p, ErrPartitionMismatch)
	}
	pl := newPlanner(nodes, p, n)
	pl.plan(current)
	return pl.result(), nil
}

// planner holds one run of Plan. Nodes are referred to by their index in
// ids, which is sorted, so nothing depends on the caller's order. Each
// node's ideal load is computed first (idealLoads) and gives its bounds
// lo and hi (floor and ceiling). Then, in order:
//
//	adopt     take current's live members as the starting cohorts
//	trim      drop members from cohorts too large or with too many nodes
//	          of one zone
//	shed      drop replicas of nodes above hi
//	makeRoom  drop replicas of nodes above lo, when the nodes below lo
//	          need more than the holes there are (a node joined)
//	fillAll   fill every hole with a node below hi: a dropped member coming
//	          back if one can, else those below lo first; by a chain of
//	          moves (augment) when no node can take a hole directly
//	plan      while a node is below lo, move a replica to it from a node
//	          above lo: by a chain of moves that costs nothing, else by
//	          makeRoom and fillAll, else by any chain
//	check     panic unless rules 1-3 of Plan hold
//
// Every step keeps a replica where it is unless the rules require moving
// it, and the augmenting chains make the result exact: if a placement
// meeting rules 1-3 exists (it always does), Plan finds one.
type planner struct {
	p, n      int
	ids       []NodeID
	idHash    []uint64
	weight    []int64
	zone      []int   // zone index of each node
	zones     int     // number of zones
	zoneNodes [][]int // zone -> its nodes
	perZone   int     // c: most members of one zone in a cohort
	lo, hi    []int   // floor and ceiling of each node's ideal load
	ideal     []int64 // each node's ideal load in fixed point (fixedScale)
	cohorts   [][]int // partition -> member node indexes
	orig      [][]int // partition -> live members in current (what staying means)
	evicted   [][]int // partition -> members makeRoom dropped to make room for others
	load      []int   // node -> replicas held now
	parts     [][]int // node -> partitions it was ever added to (stale entries allowed)
	zoneCnt   []int   // scratch, all zero between uses
	bfs       *bfsGraph
}

func newPlanner(nodes []Node, p, n int) *planner {
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, func(a, b Node) int { return cmp.Compare(a.ID, b.ID) })
	count := len(sorted)
	pl := &planner{
		p:       p,
		n:       n,
		ids:     make([]NodeID, count),
		idHash:  make([]uint64, count),
		weight:  make([]int64, count),
		zone:    make([]int, count),
		lo:      make([]int, count),
		hi:      make([]int, count),
		ideal:   make([]int64, count),
		cohorts: make([][]int, p),
		orig:    make([][]int, p),
		evicted: make([][]int, p),
		load:    make([]int, count),
		parts:   make([][]int, count),
	}
	// Named zones get indexes in name order, then every unzoned node gets
	// a zone of its own.
	var names []string
	for _, nd := range sorted {
		if nd.Zone != "" {
			names = append(names, nd.Zone)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	pl.zones = len(names)
	for i, nd := range sorted {
		pl.ids[i] = nd.ID
		pl.idHash[i] = hashString(string(nd.ID))
		pl.weight[i] = int64(max(nd.Weight, 1))
		if nd.Zone == "" {
			pl.zone[i] = pl.zones
			pl.zones++
		} else {
			pl.zone[i], _ = slices.BinarySearch(names, nd.Zone)
		}
	}
	pl.zoneNodes = make([][]int, pl.zones)
	for i, z := range pl.zone {
		pl.zoneNodes[z] = append(pl.zoneNodes[z], i)
	}
	for pl.perZone = 1; ; pl.perZone++ {
		room := 0
		for _, zn := range pl.zoneNodes {
			room += min(len(zn), pl.perZone)
		}
		if room >= n {
			break
		}
	}
	pl.zoneCnt = make([]int, pl.zones)
	for i, x := range idealLoads(pl.weight, pl.zone, pl.zones, p, n, pl.perZone) {
		pl.lo[i], pl.hi[i] = floorCeil(x)
		pl.ideal[i] = toFixed(x)
	}
	return pl
}

func (pl *planner) plan(current Placement) {
	pl.adopt(current)
	pl.trim()
	pl.shed()
	pl.makeRoom(true)
	pl.fillAll()
	underLo := func(i int) bool { return pl.load[i] < pl.lo[i] }
	for pl.underLo() > 0 {
		// Move a replica from some node above its floor to one below: by
		// a chain of moves that costs nothing if there is one; else by
		// dropping replicas from nodes above their floor and filling the
		// holes; else by any chain.
		var sources []int
		for i := range pl.ids {
			if pl.load[i] > pl.lo[i] {
				sources = append(sources, pl.nodeV(i))
			}
		}
		if pl.augment(sources, underLo, true) {
			continue
		}
		if before := pl.underLo(); pl.makeRoom(false) > 0 {
			pl.fillAll()
			if pl.underLo() < before {
				continue
			}
		}
		if !pl.augment(sources, underLo, false) {
			panic("ring: cannot raise a node to the floor of its ideal load (bug)")
		}
	}
	pl.check()
}

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

// underLo returns the replicas that nodes below their floor lack.
func (pl *planner) underLo() int {
	sum := 0
	for i := range pl.ids {
		sum += max(pl.lo[i]-pl.load[i], 0)
	}
	return sum
}

// adopt takes the live, distinct members of current as the starting cohorts.
func (pl *planner) adopt(current Placement) {
	for part := range pl.cohorts {
		pl.cohorts[part] = make([]int, 0, pl.n)
		if part >= current.P() {
			continue
		}
		for _, id := range current.Cohorts[part] {
			i, ok := slices.BinarySearch(pl.ids, id)
			if !ok || slices.Contains(pl.cohorts[part], i) {
				continue
			}
			pl.cohorts[part] = append(pl.cohorts[part], i)
			pl.load[i]++
			pl.parts[i] = append(pl.parts[i], part)
		}
		pl.orig[part] = slices.Clone(pl.cohorts[part])
	}
}

// surplus is how far node i is above its ideal load, in fixed point.
func (pl *planner) surplus(i int) int64 {
	return int64(pl.load[i])*fixedScale - pl.ideal[i]
}

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

func (pl *planner) add(part, i int) {
	pl.cohorts[part] = append(pl.cohorts[part], i)
	pl.load[i]++
	pl.parts[i] = append(pl.parts[i], part)
}

func (pl *planner) remove(part, i int) {
	pl.cohorts[part] = slices.DeleteFunc(pl.cohorts[part], func(j int) bool { return j == i })
	pl.load[i]--
}

func (pl *planner) countZones(c []int) {
	for _, i := range c {
		pl.zoneCnt[pl.zone[i]]++
	}
}

func (pl *planner) clearZoneCnt(c []int) {
	for _, i := range c {
		pl.zoneCnt[pl.zone[i]] = 0
	}
}

// replaceable reports whether some node d of cands, with ok(d), could take
// x's place in cohort c: d is not in c and c without x has room in d's zone.
func (pl *planner) replaceable(c []int, x int, cands []int, ok func(d int) bool) bool {
	pl.countZones(c)
	pl.zoneCnt[pl.zone[x]]--
	found := slices.ContainsFunc(cands, func(d int) bool {
		return !slices.Contains(c, d) && pl.zoneCnt[pl.zone[d]] < pl.perZone && ok(d)
	})
	pl.zoneCnt[pl.zone[x]]++
	pl.clearZoneCnt(c)
	return found
}

// check panics unless the placement meets rules 1-3 of Plan. It is cheap
// next to planning, so it always runs.
func (pl *planner) check() {
	load := make([]int, len(pl.ids))
	for part, c := range pl.cohorts {
		if len(c) != pl.n {
			panic(fmt.Sprintf("ring: partition %d has %d members, want %d", part, len(c), pl.n))
		}
		for k, i := range c {
			if slices.Contains(c[:k], i) {
				panic(fmt.Sprintf("ring: partition %d holds node %q twice", part, pl.ids[i]))
			}
			load[i]++
			pl.zoneCnt[pl.zone[i]]++
			if pl.zoneCnt[pl.zone[i]] > pl.perZone {
				panic(fmt.Sprintf("ring: partition %d holds more than %d nodes of one zone", part, pl.perZone))
			}
		}
		pl.clearZoneCnt(c)
	}
	for i, l := range load {
		if l != pl.load[i] || l < pl.lo[i] || l > pl.hi[i] {
			panic(fmt.Sprintf("ring: node %q holds %d replicas, want [%d, %d]", pl.ids[i], l, pl.lo[i], pl.hi[i]))
		}
	}
}

func (pl *planner) result() Placement {
	out := Placement{Cohorts: make([][]NodeID, pl.p)}
	ids := make([]NodeID, pl.p*pl.n) // one backing array for all cohorts
	for part, c := range pl.cohorts {
		cohort := ids[part*pl.n : (part+1)*pl.n : (part+1)*pl.n]
		for k, i := range c {
			cohort[k] = pl.ids[i]
		}
		out.Cohorts[part] = cohort
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
