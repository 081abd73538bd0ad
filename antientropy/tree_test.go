package antientropy

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// levels returns a copy of every level of t, root first.
func levels(tb testing.TB, t *Tree) [][]uint64 {
	tb.Helper()
	out := make([][]uint64, t.Levels())
	for l := range out {
		idx := make([]uint32, t.Width(l))
		for i := range idx {
			idx[i] = uint32(i)
		}
		hs, err := t.Nodes(l, idx)
		if err != nil {
			tb.Fatal(err)
		}
		out[l] = hs
	}
	return out
}

func mustTree(tb testing.TB, leafBits int) *Tree {
	tb.Helper()
	t, err := NewTree(leafBits)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// equalTrees fails unless a and b have the same nodes at every level.
func equalTrees(tb testing.TB, what string, a, b *Tree) {
	tb.Helper()
	la, lb := levels(tb, a), levels(tb, b)
	if len(la) != len(lb) {
		tb.Fatalf("%s: %d levels and %d", what, len(la), len(lb))
	}
	for l := range la {
		if !slices.Equal(la[l], lb[l]) {
			tb.Fatalf("%s: level %d differs", what, l)
		}
	}
}

// change is one DigestChanged call.
type change struct {
	seg      uint16
	id       uint64
	old, new uint64
	had, has bool
}

func (c change) apply(t *Tree) { t.DigestChanged(c.seg, c.id, c.old, c.had, c.new, c.has) }

// history returns random per-id change histories (add, change digest,
// delete, add again...) of n ids, all events in one list (per-id order
// kept), and each id's final digest (absent: deleted).
func history(rng *rand.Rand, n int) (events []change, final map[uint64]uint64) {
	final = map[uint64]uint64{}
	for range n {
		id := rng.Uint64()
		seg := storage.Segment(id)
		var cur uint64
		has := false
		for range 1 + rng.IntN(4) {
			c := change{seg: seg, id: id, old: cur, had: has}
			if has && rng.IntN(4) == 0 {
				c.has = false // delete
			} else {
				c.new, c.has = rng.Uint64(), true
			}
			events = append(events, c)
			cur, has = c.new, c.has
		}
		if has {
			final[id] = cur
		}
	}
	return events, final
}

func TestTreeShape(t *testing.T) {
	tests := []struct {
		leafBits int
		widths   []int // per level, root first
	}{
		{4, []int{1, 16}},
		{5, []int{1, 2, 32}},
		{8, []int{1, 16, 256}},
		{14, []int{1, 4, 64, 1024, 16384}},
		{16, []int{1, 16, 256, 4096, 65536}},
	}
	for _, tc := range tests {
		tr := mustTree(t, tc.leafBits)
		if tr.LeafBits() != tc.leafBits || tr.Levels() != len(tc.widths) {
			t.Fatalf("leaf bits %d: LeafBits %d, Levels %d, want %d levels", tc.leafBits, tr.LeafBits(), tr.Levels(), len(tc.widths))
		}
		bytes := 0
		for l, w := range tc.widths {
			if tr.Width(l) != w {
				t.Fatalf("leaf bits %d: Width(%d) = %d, want %d", tc.leafBits, l, tr.Width(l), w)
			}
			bytes += 8 * w
		}
		if tr.Bytes() != bytes {
			t.Fatalf("leaf bits %d: Bytes %d, want %d", tc.leafBits, tr.Bytes(), bytes)
		}
		// The children of each level's nodes tile the level below, in
		// order, at most 16 to a node.
		for l := 0; l < tr.Levels()-1; l++ {
			next := uint32(0)
			for i := range uint32(tr.Width(l)) {
				lo, hi := tr.Children(l, i)
				if lo != next || hi <= lo || hi-lo > 16 {
					t.Fatalf("leaf bits %d: Children(%d, %d) = [%d, %d), want to start at %d with 1 to 16", tc.leafBits, l, i, lo, hi, next)
				}
				next = hi
			}
			if int(next) != tr.Width(l+1) {
				t.Fatalf("leaf bits %d: children of level %d end at %d, level %d has %d", tc.leafBits, l, next, l+1, tr.Width(l+1))
			}
		}
		// The leaves' segments tile the 2^16 segments, each leaf an equal
		// share, and every segment is in its leaf.
		per := uint32(1) << (storage.SegmentBits - tc.leafBits)
		next := uint32(0)
		for leaf := range uint32(tr.Width(tr.Levels() - 1)) {
			lo, hi := tr.Segments(leaf)
			if lo != next || hi-lo != per {
				t.Fatalf("leaf bits %d: Segments(%d) = [%d, %d), want [%d, %d)", tc.leafBits, leaf, lo, hi, next, next+per)
			}
			next = hi
		}
		if next != 1<<storage.SegmentBits {
			t.Fatalf("leaf bits %d: segments end at %d", tc.leafBits, next)
		}
		for seg := range uint32(1 << storage.SegmentBits) {
			lo, hi := tr.Segments(tr.Leaf(uint16(seg)))
			if seg < lo || seg >= hi {
				t.Fatalf("leaf bits %d: segment %d in leaf %d = [%d, %d)", tc.leafBits, seg, tr.Leaf(uint16(seg)), lo, hi)
			}
		}
	}
}

// TestTreeArithmetic pins a few values worked out by hand.
func TestTreeArithmetic(t *testing.T) {
	type rng struct{ lo, hi uint32 }
	tests := []struct {
		leafBits int
		seg      uint16
		leaf     uint32
		segs     rng // Segments(leaf)
		level    int
		node     uint32
		children rng // Children(level, node)
	}{
		{4, 0x1000, 1, rng{0x1000, 0x2000}, 0, 0, rng{0, 16}},
		{4, 0xffff, 15, rng{0xf000, 0x10000}, 0, 0, rng{0, 16}},
		{5, 0x0800, 1, rng{0x0800, 0x1000}, 0, 0, rng{0, 2}},
		{5, 0xffff, 31, rng{0xf800, 0x10000}, 1, 1, rng{16, 32}},
		{14, 0x000f, 3, rng{12, 16}, 0, 0, rng{0, 4}},
		{14, 0xffff, 16383, rng{0xfffc, 0x10000}, 3, 1023, rng{16368, 16384}},
		{14, 0x1234, 0x48d, rng{0x1234, 0x1238}, 1, 3, rng{48, 64}},
		{16, 7, 7, rng{7, 8}, 0, 0, rng{0, 16}},
		{16, 0xffff, 0xffff, rng{0xffff, 0x10000}, 3, 4095, rng{65520, 65536}},
	}
	for _, tc := range tests {
		tr := mustTree(t, tc.leafBits)
		if got := tr.Leaf(tc.seg); got != tc.leaf {
			t.Errorf("leaf bits %d: Leaf(%#x) = %d, want %d", tc.leafBits, tc.seg, got, tc.leaf)
		}
		if lo, hi := tr.Segments(tc.leaf); (rng{lo, hi}) != tc.segs {
			t.Errorf("leaf bits %d: Segments(%d) = [%d, %d), want %v", tc.leafBits, tc.leaf, lo, hi, tc.segs)
		}
		if lo, hi := tr.Children(tc.level, tc.node); (rng{lo, hi}) != tc.children {
			t.Errorf("leaf bits %d: Children(%d, %d) = [%d, %d), want %v", tc.leafBits, tc.level, tc.node, lo, hi, tc.children)
		}
	}
}

func TestNewTreeLeafBits(t *testing.T) {
	for _, lb := range []int{-1, 0, 3, 17, 64} {
		if _, err := NewTree(lb); err == nil {
			t.Errorf("NewTree(%d): no error", lb)
		}
	}
	for lb := MinLeafBits; lb <= MaxLeafBits; lb++ {
		if _, err := NewTree(lb); err != nil {
			t.Errorf("NewTree(%d): %v", lb, err)
		}
	}
}

// TestTreeBranchesXORChildren: after random changes every branch is the
// XOR of its children, and the root the XOR of all leaves.
func TestTreeBranchesXORChildren(t *testing.T) {
	for _, lb := range []int{4, 5, 14, 16} {
		rng := rand.New(rand.NewPCG(uint64(lb), 1))
		tr := mustTree(t, lb)
		events, _ := history(rng, 2000)
		for _, c := range events {
			c.apply(tr)
		}
		ls := levels(t, tr)
		for l := 0; l < len(ls)-1; l++ {
			for i, h := range ls[l] {
				lo, hi := tr.Children(l, uint32(i))
				var x uint64
				for _, c := range ls[l+1][lo:hi] {
					x ^= c
				}
				if x != h {
					t.Fatalf("leaf bits %d: level %d node %d is %x, its children XOR to %x", lb, l, i, h, x)
				}
			}
		}
		var all uint64
		for _, h := range ls[len(ls)-1] {
			all ^= h
		}
		if all != tr.Root() || tr.Root() == 0 {
			t.Fatalf("leaf bits %d: root %x, leaves XOR to %x", lb, tr.Root(), all)
		}
	}
}

// TestTreeChangeTouchesOnePathOnly: one task's change changes exactly one
// node per level: its leaf and that leaf's ancestors.
func TestTreeChangeTouchesOnePathOnly(t *testing.T) {
	for _, lb := range []int{4, 5, 14, 16} {
		rng := rand.New(rand.NewPCG(uint64(lb), 2))
		tr := mustTree(t, lb)
		events, _ := history(rng, 300)
		for _, c := range events {
			c.apply(tr)
		}
		for range 20 {
			before := levels(t, tr)
			id := rng.Uint64()
			seg := storage.Segment(id)
			tr.DigestChanged(seg, id, 0, false, rng.Uint64(), true)
			after := levels(t, tr)
			child := tr.Leaf(seg) // the node that must change at level l+1
			for l := len(after) - 1; l >= 0; l-- {
				var changed []uint32
				for i := range after[l] {
					if after[l][i] != before[l][i] {
						changed = append(changed, uint32(i))
					}
				}
				if len(changed) != 1 {
					t.Fatalf("leaf bits %d: level %d: nodes %v changed, want one", lb, l, changed)
				}
				if l == len(after)-1 {
					if changed[0] != child {
						t.Fatalf("leaf bits %d: leaf %d changed, the segment %d is in leaf %d", lb, changed[0], seg, child)
					}
				} else if lo, hi := tr.Children(l, changed[0]); child < lo || child >= hi {
					t.Fatalf("leaf bits %d: level %d node %d changed, it is not the parent of %d", lb, l, changed[0], child)
				}
				child = changed[0]
			}
		}
	}
}

// TestTreeOrderIndependent: the tree depends only on the final (id,
// digest) set: the same changes applied in any order, or just the final
// set added, give the same nodes.
func TestTreeOrderIndependent(t *testing.T) {
	for _, lb := range []int{4, 5, 14, 16} {
		for seed := range uint64(5) {
			rng := rand.New(rand.NewPCG(seed, uint64(lb)))
			events, final := history(rng, 500)

			inOrder := mustTree(t, lb)
			for _, c := range events {
				c.apply(inOrder)
			}
			// Any permutation, even one that breaks the per-id order the
			// store guarantees: XOR deltas commute.
			shuffled := mustTree(t, lb)
			perm := slices.Clone(events)
			rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
			for _, c := range perm {
				c.apply(shuffled)
			}
			direct := mustTree(t, lb)
			ids := sortedIDs(final)
			rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
			var root uint64
			for _, id := range ids {
				direct.DigestChanged(storage.Segment(id), id, 0, false, final[id], true)
				root ^= Hash(id, final[id])
			}
			equalTrees(t, "in order vs shuffled", inOrder, shuffled)
			equalTrees(t, "in order vs final set", inOrder, direct)
			if direct.Root() != root {
				t.Fatalf("root %x, want %x", direct.Root(), root)
			}
		}
	}
}

// TestTreeUndo: adding then removing a task, or changing a digest and
// changing it back, restores every node; no-op changes change nothing.
func TestTreeUndo(t *testing.T) {
	for _, lb := range []int{4, 14, 16} {
		rng := rand.New(rand.NewPCG(uint64(lb), 3))
		tr := mustTree(t, lb)
		events, final := history(rng, 200)
		for _, c := range events {
			c.apply(tr)
		}
		empty := mustTree(t, lb)
		base := mustTree(t, lb)
		for id, d := range final {
			base.DigestChanged(storage.Segment(id), id, 0, false, d, true)
		}
		equalTrees(t, "base", tr, base)

		id, d := rng.Uint64(), rng.Uint64()
		seg := storage.Segment(id)
		tr.DigestChanged(seg, id, 0, false, d, true)
		if tr.Root() == base.Root() {
			t.Fatal("adding a task left the root unchanged")
		}
		tr.DigestChanged(seg, id, d, true, 0, false)
		equalTrees(t, "add then remove", tr, base)

		for _, id := range sortedIDs(final)[:20] {
			seg, d := storage.Segment(id), final[id]
			tr.DigestChanged(seg, id, d, true, d^1, true)
			if tr.Root() == base.Root() {
				t.Fatal("changing a digest left the root unchanged")
			}
			tr.DigestChanged(seg, id, d^1, true, d, true)
		}
		equalTrees(t, "change then change back", tr, base)

		// No-ops: same digest, and a delete of what was not there.
		tr.DigestChanged(seg, id, d, true, d, true)
		tr.DigestChanged(seg, id, 0, false, 0, false)
		equalTrees(t, "no-op changes", tr, base)

		for id, d := range final {
			tr.DigestChanged(storage.Segment(id), id, d, true, 0, false)
		}
		equalTrees(t, "all removed", tr, empty)
		if tr.Root() != 0 {
			t.Fatalf("empty tree's root %x", tr.Root())
		}
	}
}

func TestTreeNodesBounds(t *testing.T) {
	for _, lb := range []int{4, 5, 14, 16} {
		tr := mustTree(t, lb)
		last := tr.Levels() - 1
		bad := []struct {
			level int
			idx   []uint32
		}{
			{-1, []uint32{0}},
			{tr.Levels(), []uint32{0}},
			{1 << 20, nil},
			{0, []uint32{1}},
			{last, []uint32{0, uint32(tr.Width(last))}},
			{last, []uint32{1<<32 - 1}},
			{1, []uint32{uint32(tr.Width(1))}},
		}
		for _, b := range bad {
			if hs, err := tr.Nodes(b.level, b.idx); err == nil {
				t.Errorf("leaf bits %d: Nodes(%d, %v) = %v, want an error", lb, b.level, b.idx, hs)
			}
		}
		for l := range tr.Levels() {
			hs, err := tr.Nodes(l, []uint32{0, uint32(tr.Width(l) - 1)})
			if err != nil || len(hs) != 2 {
				t.Errorf("leaf bits %d: Nodes(%d, first and last) = %v, %v", lb, l, hs, err)
			}
		}
		if hs, err := tr.Nodes(0, nil); err != nil || len(hs) != 0 {
			t.Errorf("leaf bits %d: Nodes(0, none) = %v, %v", lb, hs, err)
		}
	}
}

// TestTreeBytes: a tree's memory is fixed by LeafBits, whatever the task
// count, and the default stays under 1 MiB (the bound per partition
// replica); so does the largest allowed tree.
func TestTreeBytes(t *testing.T) {
	const mib = 1 << 20
	for lb := MinLeafBits; lb <= MaxLeafBits; lb++ {
		tr := mustTree(t, lb)
		if tr.Bytes() >= mib {
			t.Errorf("leaf bits %d: %d bytes", lb, tr.Bytes())
		}
		t.Logf("leaf bits %2d: %5d leaves, %7d bytes", lb, tr.Width(tr.Levels()-1), tr.Bytes())
	}
	if got, want := mustTree(t, DefaultLeafBits).Bytes(), 8*(1+4+64+1024+16384); got != want {
		t.Errorf("default tree: %d bytes, want %d", got, want)
	}

	// What the heap really gives a default tree, and that tasks add
	// nothing to it.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	tr := mustTree(t, DefaultLeafBits)
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc >= mib || alloc < uint64(tr.Bytes()) {
		t.Errorf("NewTree(%d) allocated %d bytes; Bytes says %d", DefaultLeafBits, alloc, tr.Bytes())
	}
	rng := rand.New(rand.NewPCG(4, 4))
	runtime.ReadMemStats(&before)
	for range 100_000 {
		id := rng.Uint64()
		tr.DigestChanged(storage.Segment(id), id, 0, false, rng.Uint64(), true)
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4096 {
		t.Errorf("100,000 changes allocated %d bytes", alloc)
	}
}

// TestTrackDigestsMatchesIncremental: the tree a replica keeps up to date
// through every write and delete equals one built from the store's
// segment index (TrackDigests, as Add does) and the brute-force root of
// the stored states; other partitions do not leak in.
func TestTrackDigestsMatchesIncremental(t *testing.T) {
	for _, lb := range []int{4, 14} {
		s := newSide(t, sideConfig{leafBits: lb}, 0)
		rng := rand.New(rand.NewPCG(uint64(lb), 5))
		var ids []uint64
		var tasks []*crdt.Task
		for range 600 {
			id := rng.Uint64()
			ids = append(ids, id)
			tasks = append(tasks, newTask(id))
		}
		mergeAll(t, s.store, 0, tasks...)
		// Other partitions' writes, tracked by no tree or by their own.
		mergeAll(t, s.store, 1, newTask(1), newTask(ids[0]))
		if err := s.r.Add(2); err != nil {
			t.Fatal(err)
		}
		mergeAll(t, s.store, 2, newTask(2), newTask(ids[1]))
		// Changes: updates, terminal events, deletes, re-adds.
		var more []*crdt.Task
		for i, id := range ids[:300] {
			switch i % 3 {
			case 0:
				more = append(more, updateOf(id, 7, uint64(i)))
			case 1:
				more = append(more, terminalOf(id, t0+int64(i), crdt.Completed, 7))
			}
		}
		mergeAll(t, s.store, 0, more...)
		if err := s.store.DeleteTasks(0, ids[250:350]); err != nil {
			t.Fatal(err)
		}
		mergeAll(t, s.store, 0, newTask(ids[260]), newTask(ids[261]))

		incremental := s.r.Tree(0)
		if want := bruteRoot(stored(t, s.store, 0)); incremental.Root() != want {
			t.Fatalf("leaf bits %d: incremental root %x, brute force %x", lb, incremental.Root(), want)
		}
		scanned := mustTree(t, lb)
		if err := s.store.TrackDigests(0, scanned); err != nil {
			t.Fatal(err)
		}
		equalTrees(t, "incremental vs scanned", incremental, scanned)
		// Add again rebuilds from the index: the same tree.
		if err := s.r.Add(0); err != nil {
			t.Fatal(err)
		}
		equalTrees(t, "incremental vs rebuilt", incremental, s.r.Tree(0))
		if want := bruteRoot(stored(t, s.store, 2)); s.r.Tree(2).Root() != want {
			t.Fatalf("partition 2's root %x, want %x", s.r.Tree(2).Root(), want)
		}
	}
}

// TestTreeFollowsConcurrentWrites: writes racing with Add (which builds the
// tree from the index while writes wait) are neither lost nor counted
// twice. Run it with -race.
func TestTreeFollowsConcurrentWrites(t *testing.T) {
	s := newSide(t, sideConfig{leafBits: 8})
	rng := rand.New(rand.NewPCG(6, 6))
	var base []*crdt.Task
	for range 3000 { // enough entries for each Add's scan to take a while
		base = append(base, newTask(rng.Uint64()))
	}
	mergeAll(t, s.store, 0, base...)

	var written atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 6))
			for {
				select {
				case <-stop:
					return
				default:
				}
				var items []storage.MergeItem
				for range 5 {
					id := rng.Uint64()
					items = append(items, storage.MergeItem{Task: newTask(id)},
						storage.MergeItem{Task: terminalOf(id, t0, crdt.Cancelled, 0)})
				}
				// An earlier task changes too.
				items = append(items, storage.MergeItem{Task: updateOf(base[rng.IntN(len(base))].ID, 1, rng.Uint64N(1000))})
				if _, err := s.store.MergeTasks(items); err != nil {
					t.Error(err)
					return
				}
				written.Add(1)
			}
		})
	}
	for range 10 {
		// Let some writes through, then rebuild while they continue.
		for n := written.Load(); written.Load() < n+3; {
			runtime.Gosched()
		}
		if err := s.r.Add(0); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if want := bruteRoot(stored(t, s.store, 0)); s.r.Tree(0).Root() != want {
		t.Fatalf("root %x after concurrent writes, brute force %x", s.r.Tree(0).Root(), want)
	}
	rebuilt := mustTree(t, 8)
	if err := s.store.TrackDigests(0, rebuilt); err != nil {
		t.Fatal(err)
	}
	equalTrees(t, "followed vs rebuilt", s.r.Tree(0), rebuilt)
}
