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
