package ring

import (
	"slices"

	"github.com/cespare/xxhash/v2"
)

// augment searches, breadth first, for a chain of moves that either fills a
// hole or moves a replica from one node to another, and applies the
// shortest one it finds. A chain is: some node x joins partition q1 and
// leaves q2, some y joins q2 and leaves q3, ..., until a node for which
// done(node) holds joins the last partition. Each link respects the cohort
// and zone rules, and every node's load is unchanged but the first and the
// last one's.
//
// It starts from the vertices in starts (see partV, nodeV): partitions with
// a hole (the chain fills it; the last node's load grows by one) or nodes
// (the first link is that node leaving a partition; its load drops by one).
//
// This is an augmenting path in the flow network source -> partition
// (capacity n) -> (partition, zone) (capacity perZone) -> node (capacity 1)
// -> sink (capacity between lo and hi of the node). Loads that meet the
// bounds exist (each partition sending ideal/p to every node is such a flow
// in fractions, so there is one in integers), so while a hole remains, or a
// node is below its floor, a chain exists: plan panics if none is found.
//
// With free set, only chains that cost no move are taken: a replica placed
// by this plan may leave a partition, and a replica kept from the current
// placement may leave one only for another member of the current cohort
// coming back (the cohort keeps as many current members). Without free,
// any replica may leave. It reports whether it found a chain.
func (pl *planner) augment(starts []int, done func(node int) bool, free bool) bool {
	g := pl.graph()
	for _, v := range starts {
		g.visit(v, -1)
	}
	end := -1
	for head := 0; head < len(g.queue) && end < 0; head++ {
		v := g.queue[head]
		switch kind, q, x, back := pl.decode(v); kind {
		case partVertex: // a node joins q, into a zone with room
			c := pl.cohorts[q]
			pl.countZones(c)
			for i := range pl.ids {
				if pl.zoneCnt[pl.zone[i]] < pl.perZone && !slices.Contains(c, i) &&
					(!back || pl.canReturn(q, i)) && g.visit(pl.nodeV(i), v) && done(i) {
					end = i
					break
				}
			}
			pl.clearZoneCnt(c)
		case nodeVertex: // x leaves a partition holding it
			for _, q := range pl.parts[x] {
				c := pl.cohorts[q]
				if pos := slices.Index(c, x); pos >= 0 {
					g.visit(pl.slotV(q, pl.zoneSlot(c, pos), free && slices.Contains(pl.orig[q], x)), v)
				}
			}
		case slotVertex: // a member of q of the slot's zone left: another joins, or back to q
			c := pl.cohorts[q]
			for _, i := range pl.zoneNodes[pl.zone[c[x]]] {
				if !slices.Contains(c, i) && (!back || pl.canReturn(q, i)) &&
					g.visit(pl.nodeV(i), v) && done(i) {
					end = i
					break
				}
			}
			g.visit(pl.partV(q, back), v)
		}
	}
	if end < 0 {
		return false
	}
	// Walk back: an edge into a node from q or from (q, slot) is a join,
	// an edge from a node into (q, slot) is a leave.
	type change struct{ part, node int }
	var joins, leaves []change
	for v := pl.nodeV(end); g.parent[v] >= 0; v = int(g.parent[v]) {
		u := int(g.parent[v])
		uKind, uq, ux, _ := pl.decode(u)
		vKind, vq, vx, _ := pl.decode(v)
		switch {
		case vKind == nodeVertex && uKind != nodeVertex:
			joins = append(joins, change{uq, vx})
		case uKind == nodeVertex && vKind == slotVertex:
			leaves = append(leaves, change{vq, ux})
		}
	}
	for _, l := range leaves {
		pl.remove(l.part, l.node)
	}
	for _, j := range slices.Backward(joins) {
		pl.add(j.part, j.node)
	}
	return true
}

// zoneSlot returns the first position in cohort c of a member of the zone of
// c[pos]: all members of one zone share one (partition, zone) vertex.
func (pl *planner) zoneSlot(c []int, pos int) int {
	for s, i := range c {
		if pl.zone[i] == pl.zone[c[pos]] {
			return s
		}
	}
	return pos
}

type vertexKind int

const (
	partVertex vertexKind = iota // a partition
	nodeVertex                   // a node
	slotVertex                   // (partition, zone of the member at a slot)
)

// bfsGraph is the state of one augment search. Its arrays are allocated on
// first use and reused, reset by bumping gen.
//
// Partition and slot vertices come in two kinds: plain, and "back", reached
// by a current member leaving in a free search, from which only current
// members may join.
type bfsGraph struct {
	gen    uint32
	seen   []uint32 // gen of the search that last reached each vertex
	parent []int32
	queue  []int
}

func (pl *planner) graph() *bfsGraph {
	g := pl.bfs
	if g == nil {
		size := 2*pl.p + len(pl.ids) + 2*pl.p*pl.n
		g = &bfsGraph{seen: make([]uint32, size), parent: make([]int32, size)}
		pl.bfs = g
	}
	g.gen++
	g.queue = g.queue[:0]
	return g
}

// Vertex numbers: partitions, back partitions, nodes, then two slot
// vertices (plain, back) per cohort position.
func (pl *planner) partV(q int, back bool) int { return q + boolInt(back)*pl.p }
func (pl *planner) nodeV(i int) int            { return 2*pl.p + i }
func (pl *planner) slotV(q, slot int, back bool) int {
	return 2*pl.p + len(pl.ids) + 2*(q*pl.n+slot) + boolInt(back)
}

// decode returns a vertex's kind, its partition (partVertex, slotVertex),
// its node (nodeVertex) or slot (slotVertex), and whether it is a back
// vertex.
func (pl *planner) decode(v int) (kind vertexKind, part, x int, back bool) {
	switch {
	case v < 2*pl.p:
		return partVertex, v % pl.p, -1, v >= pl.p
	case v < 2*pl.p+len(pl.ids):
		return nodeVertex, -1, v - 2*pl.p, false
	}
	v -= 2*pl.p + len(pl.ids)
	return slotVertex, v / 2 / pl.n, v / 2 % pl.n, v%2 == 1
}

// visit records v as reached from parent and queues it, unless this search
// reached it before. It reports whether v is new.
func (g *bfsGraph) visit(v, parent int) bool {
	if g.seen[v] == g.gen {
		return false
	}
	g.seen[v] = g.gen
	g.parent[v] = int32(parent)
	g.queue = append(g.queue, v)
	return true
}

func hashString(s string) uint64 { return xxhash.Sum64String(s) }

// mix combines a node's id hash with a partition into a well-spread 64-bit
// value (splitmix64's finalizer), used to break ties without favouring any
// node or partition.
func mix(h uint64, part int) uint64 {
	x := h ^ (uint64(part)+1)*0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
