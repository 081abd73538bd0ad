package ring

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// TestPlanGrowShrink follows what a cluster operator does: start with three
// nodes, grow to four and five, then shrink back to three, planning each
// step from the placement of the step before, as the cluster applies them.
// Every step is checked for rules 1-3, for Diff describing exactly what
// changed (and applying it move by move, as the cluster does), for the
// movement Plan promises (rule 4) and for stability (planning again with
// the same nodes moves nothing).
//
// Unlike the other property tests it runs from fixed seeds, so it checks
// the same cases on every run; -ring.seed=SEED still runs a single seed.
func TestPlanGrowShrink(t *testing.T) {
	for _, weightedNodes := range []bool{false, true} {
		name := "equal"
		if weightedNodes {
			name = "weighted"
		}
		t.Run(name, func(t *testing.T) {
			var st growStats
			for _, p := range []int{8, 16, 64, 256} {
				for _, n := range []int{1, 2, 3} {
					t.Run(fmt.Sprintf("P=%d/N=%d", p, n), func(t *testing.T) {
						salt := uint64(p)<<8 | uint64(n)<<1 | uint64(boolInt(weightedNodes))
						forFixedSeeds(t, 32, salt, func(t *testing.T, rng *rand.Rand) {
							growShrink(t, rng, p, n, weightedNodes, &st)
						})
					})
				}
			}
			t.Logf("%d steps; %d removals had to move other replicas too (rules 1-3 required it); "+
				"%d replicas moved on growth besides those to the new node; "+
				"%d of %d shrinks back to the original nodes gave the original placement",
				st.steps, st.forcedRemovals, st.extraGrowMoves, st.sameAsOriginal, st.backToOriginal)
		})
	}
}

// forFixedSeeds runs f once per seed, each from its own generator, the seeds
// fixed by salt and the iteration (unlike forSeeds, which starts from the
// clock).
func forFixedSeeds(t *testing.T, full int, salt uint64, f func(t *testing.T, rng *rand.Rand)) {
	t.Helper()
	for k := range iterations(full) {
		seed := (salt+1)*0xbf58476d1ce4e5b9 + uint64(k+1)*0x9e3779b97f4a7c15
		if *seedFlag != 0 {
			seed = *seedFlag
		}
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			f(t, rand.New(rand.NewPCG(seed, seed^0x5eed)))
		})
		if !ok {
			t.Fatalf("failed with seed %d; rerun with -run '%s' -ring.seed=%d", seed, t.Name(), seed)
		}
	}
}

// growNode returns a node with a random id, unique by its last letter, so
// that the order of ids (which Plan works in) is random too.
func growNode(rng *rand.Rand, i int, weighted bool) Node {
	nd := Node{ID: NodeID(fmt.Sprintf("%04x%c", rng.IntN(1<<16), 'a'+i))}
	if weighted {
		nd.Weight = rng.IntN(5) // 0 means 1
	}
	return nd
}

// growStats counts what TestPlanGrowShrink logs.
type growStats struct {
	steps          int // plans checked
	forcedRemovals int // removals where rules 1-3 forced other replicas to move
	extraGrowMoves int // replicas moved on growth other than to the new node
	backToOriginal int // shrinks back to the three original nodes
	sameAsOriginal int // of which gave the starting placement again
}

// growShrink runs one operator sequence (see TestPlanGrowShrink).
func growShrink(t *testing.T, rng *rand.Rand, p, n int, weighted bool, st *growStats) {
	var all []Node
	for i := range 5 {
		all = append(all, growNode(rng, i, weighted))
	}
	orig := cluster{nodes: slices.Clone(all[:3]), p: p, n: n}
	rng.Shuffle(len(orig.nodes), func(i, j int) { orig.nodes[i], orig.nodes[j] = orig.nodes[j], orig.nodes[i] })
	start := mustPlan(t, Placement{}, orig)
	checkValid(t, start, orig)
	checkStable(t, rng, Placement{}, start, orig)

	// Grow 3 -> 4 -> 5.
	c, cur := orig, start
	for _, added := range all[3:] {
		grown := c
		grown.nodes = append(slices.Clone(c.nodes), added)
		next := planStep(t, rng, cur, grown)
		st.steps++
		moves := Diff(cur, next)
		for _, m := range moves {
			if m.To != added.ID {
				st.extraGrowMoves++
			}
		}
		if !weighted {
			// Rule 4: adding a node to a balanced cluster of equal weights
			// moves its load to it and nothing else.
			for _, m := range moves {
				if m.From == "" || m.To != added.ID {
					t.Fatalf("adding %q to %v (P=%d N=%d) made move %+v; want moves to it only\nmoves: %v",
						added.ID, c.nodes, p, n, m, moves)
				}
			}
			if got, want := len(moves), next.Loads()[added.ID]; got != want {
				t.Fatalf("adding %q to %v (P=%d N=%d) moved %d replicas, it holds %d",
					added.ID, c.nodes, p, n, got, want)
			}
		}
		c, cur = grown, next
	}

	// Shrink 5 -> 4 -> 3 from the same five-node placement: the added nodes
	// in either order, an original node first or last.
	added, origID := []NodeID{all[3].ID, all[4].ID}, orig.nodes[rng.IntN(3)].ID
	for _, order := range [][]NodeID{
		{added[0], added[1]},
		{added[1], added[0]},
		{origID, added[rng.IntN(2)]},
		{added[rng.IntN(2)], origID},
	} {
		c, cur := c, cur
		for _, gone := range order {
			shrunk := c
			shrunk.nodes = slices.DeleteFunc(slices.Clone(c.nodes), func(nd Node) bool { return nd.ID == gone })
			// Whether a placement meeting rules 1-3 that moves only gone's
			// replicas exists: decided on cur, before planning.
			possible := onlyGoneCanMove(cur, shrunk, gone)
			next := planStep(t, rng, cur, shrunk)
			st.steps++
			moves := Diff(cur, next)
			if !possible {
				st.forcedRemovals++
				if !weighted {
					t.Fatalf("removing %q from %v (P=%d N=%d): no placement meeting rules 1-3 moves only its replicas\nplacement: %v",
						gone, c.nodes, p, n, cur.Cohorts)
				}
				c, cur = shrunk, next
				continue
			}
			// Rule 4: removing a node moves that node's replicas and nothing
			// else, as a placement meeting rules 1-3 allows it.
			for _, m := range moves {
				if m.From != gone || m.To == "" {
					t.Fatalf("removing %q from %v (P=%d N=%d) made move %+v; want only its replicas to move\nmoves: %v",
						gone, c.nodes, p, n, m, moves)
				}
			}
			if got, want := len(moves), cur.Loads()[gone]; got != want {
				t.Fatalf("removing %q from %v (P=%d N=%d) moved %d replicas, it held %d",
					gone, c.nodes, p, n, got, want)
			}
			c, cur = shrunk, next
		}
		// Back at three nodes the loads are balanced again (checkValid in
		// planStep checked rules 1-3; with equal weights, check it plainly
		// too). The placement need not be the one the cluster started
		// with: the replicas the added nodes took went back wherever
		// balance and movement allowed, not necessarily where they came
		// from.
		if !weighted {
			loads := cur.Loads()
			least, most := p*n, 0
			for _, nd := range c.nodes {
				least, most = min(least, loads[nd.ID]), max(most, loads[nd.ID])
			}
			if most-least > 1 {
				t.Fatalf("after removing %v, loads %v are not balanced", order, loads)
			}
		}
		if !slices.Contains(order, origID) {
			st.backToOriginal++
			if len(Diff(start, cur)) == 0 {
				st.sameAsOriginal++
			}
		}
	}
}

// planStep plans the step from cur (the placement before) to the nodes of
// to, and checks rules 1-3, Diff, applying the moves and stability.
func planStep(t *testing.T, rng *rand.Rand, cur Placement, to cluster) Placement {
	t.Helper()
	before := cur.Clone()
	next := mustPlan(t, cur, to)
	if !reflect.DeepEqual(cur, before) {
		t.Fatal("Plan modified the current placement")
	}
	checkValid(t, next, to)
	checkMoves(t, cur, next)
	// Determinism, and stability: planning next again with the same nodes
	// returns it unchanged, so moves nothing.
	checkStable(t, rng, cur, next, to)
	return next
}

// checkMoves checks Diff(old, new) against the cohorts by brute force: the
// moves are exactly the replicas that changed, every other replica stays on
// its node, each partition has at most one move per node leaving or joining
// (so one per (From, To) pair), and applying the moves one at a time, each
// replacing From by To in its cohort as the cluster does, turns old into
// new. Old and new have the same P and N here, so every move is a handoff.
func checkMoves(t *testing.T, old, new Placement) {
	t.Helper()
	moves := Diff(old, new)
	byPart := map[int][]Move{}
	for _, m := range moves {
		if m.Partition < 0 || m.Partition >= new.P() {
			t.Fatalf("move %+v: partition out of range [0, %d)", m, new.P())
		}
		if m.From == "" || m.To == "" {
			t.Fatalf("move %+v: not a handoff, though N did not change", m)
		}
		byPart[m.Partition] = append(byPart[m.Partition], m)
	}
	for part := range new.P() {
		was, is := old.Cohorts[part], new.Cohorts[part]
		from, to := map[NodeID]bool{}, map[NodeID]bool{}
		for _, m := range byPart[part] {
			if from[m.From] || to[m.To] {
				t.Fatalf("partition %d: %q leaves or %q joins twice in %v", part, m.From, m.To, byPart[part])
			}
			from[m.From], to[m.To] = true, true
		}
		// Moves to replicas that changed.
		for id := range from {
			if !slices.Contains(was, id) || slices.Contains(is, id) {
				t.Fatalf("partition %d: move from %q, but %v -> %v", part, id, was, is)
			}
		}
		for id := range to {
			if slices.Contains(was, id) || !slices.Contains(is, id) {
				t.Fatalf("partition %d: move to %q, but %v -> %v", part, id, was, is)
			}
		}
		// Replicas that changed to moves; the others stay.
		for _, id := range was {
			if !from[id] && !slices.Contains(is, id) {
				t.Fatalf("partition %d: %q left (%v -> %v) without a move", part, id, was, is)
			}
		}
		for _, id := range is {
			if !to[id] && !slices.Contains(was, id) {
				t.Fatalf("partition %d: %q joined (%v -> %v) without a move", part, id, was, is)
			}
		}
	}
	// Apply the moves one by one, as the cluster does.
	cohorts := old.Clone().Cohorts
	for _, m := range moves {
		c := cohorts[m.Partition]
		k := slices.Index(c, m.From)
		if k < 0 || slices.Contains(c, m.To) {
			t.Fatalf("move %+v does not apply to cohort %v", m, c)
		}
		c[k] = m.To
	}
	for part, c := range cohorts {
		got, want := slices.Sorted(slices.Values(c)), slices.Sorted(slices.Values(new.Cohorts[part]))
		if !slices.Equal(got, want) {
			t.Fatalf("partition %d: applying the moves to %v gives %v, want the members of %v",
				part, old.Cohorts[part], c, new.Cohorts[part])
		}
	}
}

// TestPlanRemoveNodeForcedEqual: with equal weights, removing a node from a
// balanced placement cannot always move only its replicas, so the
// assertion in TestPlanGrowShrink rests on the placements Plan makes along
// the way, not on rules 1-3 alone. Here a and g share every partition of
// theirs: without g, a must reach 5 replicas (16/3 rounded down) but can
// only take g's place where it already is, so other replicas move too.
func TestPlanRemoveNodeForcedEqual(t *testing.T) {
	cur := Placement{Cohorts: [][]NodeID{
		{"a", "g"}, {"a", "g"}, {"a", "g"}, {"a", "g"},
		{"b", "c"}, {"b", "c"}, {"b", "c"}, {"b", "c"},
	}}
	c := cluster{nodes: nodesNamed("a", "b", "c"), p: 8, n: 2}
	checkValid(t, cur, cluster{nodes: nodesNamed("a", "b", "c", "g"), p: 8, n: 2})
	if onlyGoneCanMove(cur, c, "g") {
		t.Fatal("reference: removing g can move only its replicas; want not")
	}
	next := mustPlan(t, cur, c)
	checkValid(t, next, c)
	checkMoves(t, cur, next)
	moved := 0
	for _, m := range Diff(cur, next) {
		if m.From != "g" {
			moved++
		}
	}
	if moved == 0 {
		t.Fatalf("removing g moved only its replicas: %v", Diff(cur, next))
	}
}
