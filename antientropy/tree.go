package antientropy

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/norn-dev/norn/storage"
)

// Tree sizes. A tree has 2^LeafBits leaves; each groups 2^(16-LeafBits)
// consecutive segments of the storage segment index (storage.SegmentBits
// = 16).
const (
	// DefaultLeafBits gives 16,384 leaves: 137 KiB per tree (leaves and
	// branches, 8 bytes each), about 61 tasks per leaf at 1M tasks.
	DefaultLeafBits = 14
	// MinLeafBits and MaxLeafBits bound ReplicaConfig.LeafBits. 16 is one leaf
	// per segment: 546 KiB per tree.
	MinLeafBits = 4
	MaxLeafBits = storage.SegmentBits
	// fanoutBits: each branch has 16 children (the top level may have
	// fewer), so a leaf is LeafBits/4 levels below the root.
	fanoutBits = 4
)

// Tree is one partition replica's XOR segment tree (Tictac style): a leaf
// is the XOR of Hash(id, digest) over the tasks of its segments, and every
// branch is the XOR of its children, so a change of one task's digest
// XORs the same delta into one node per level and nothing is rescanned.
// Two replicas with equal task sets have equal trees; the root is their
// summary. A Tree is safe for concurrent use; it implements
// storage.DigestSink.
type Tree struct {
	leafBits uint
	shift    []uint // per level, top (root) first: leaf index >> shift = node index

	mu     sync.Mutex
	levels [][]uint64 // levels[0] is the root level (one node), the last the leaves
	// dirty marks the nodes of the level above the leaves (bit i: node i)
	// whose value, and so their ancestors', lags their leaves: a change
	// XORs its leaf only, and settle brings the branches up to date
	// before they are read. Every change XORed one node per level before;
	// on the enqueue benchmark that was 4% of a node's CPU, the levels'
	// cache misses, for branches read a few times a minute.
	dirty    []uint64
	anyDirty bool
}

// NewTree returns an empty tree with 2^leafBits leaves.
func NewTree(leafBits int) (*Tree, error) {
	if leafBits < MinLeafBits || leafBits > MaxLeafBits {
		return nil, fmt.Errorf("antientropy: leaf bits %d: want %d to %d", leafBits, MinLeafBits, MaxLeafBits)
	}
	t := &Tree{leafBits: uint(leafBits)}
	// Shifts from the leaves up: 0, 4, 8, ... and finally leafBits (the
	// root), then reversed so that the root comes first.
	var shifts []uint
	for s := uint(0); s < t.leafBits; s += fanoutBits {
		shifts = append(shifts, s)
	}
	shifts = append(shifts, t.leafBits)
	for i, j := 0, len(shifts)-1; i < j; i, j = i+1, j-1 {
		shifts[i], shifts[j] = shifts[j], shifts[i]
	}
	t.shift = shifts
	for _, s := range shifts {
		t.levels = append(t.levels, make([]uint64, 1<<(t.leafBits-s)))
	}
	t.dirty = make([]uint64, (len(t.levels[len(t.levels)-2])+63)/64)
	return t, nil
}

// Hash is a task's contribution to its leaf: a 64-bit hash of its id and
// state digest, the same on every node.
func Hash(id, digest uint64) uint64 {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], id)
	binary.BigEndian.PutUint64(b[8:], digest)
	return xxhash.Sum64(b[:])
}

// LeafBits returns the tree's size parameter.
func (t *Tree) LeafBits() int { return int(t.leafBits) }

// Levels returns the number of levels, root included.
func (t *Tree) Levels() int { return len(t.levels) }

// Width returns the number of nodes at level l (0 is the root).
func (t *Tree) Width(l int) int { return len(t.levels[l]) }

// Leaf returns the leaf that holds segment seg.
func (t *Tree) Leaf(seg uint16) uint32 { return uint32(seg) >> (storage.SegmentBits - t.leafBits) }

// Segments returns the segments [lo, hi) of leaf.
func (t *Tree) Segments(leaf uint32) (lo, hi uint32) {
	w := storage.SegmentBits - t.leafBits
	return leaf << w, (leaf + 1) << w
}

// Children returns the range [lo, hi) of level l+1 nodes under node i of
// level l.
func (t *Tree) Children(l int, i uint32) (lo, hi uint32) {
	d := t.shift[l] - t.shift[l+1]
	return i << d, (i + 1) << d
}

// DigestChanged applies one task's change (storage.DigestSink).
func (t *Tree) DigestChanged(seg uint16, id uint64, old uint64, had bool, new uint64, has bool) {
	var delta uint64
	if had {
		delta ^= Hash(id, old)
	}
	if has {
		delta ^= Hash(id, new)
	}
	if delta == 0 {
		return
	}
	leaf := t.Leaf(seg)
	parent := leaf >> t.shift[len(t.shift)-2]
	t.mu.Lock()
	t.levels[len(t.levels)-1][leaf] ^= delta
	t.dirty[parent/64] |= 1 << (parent % 64)
	t.anyDirty = true
	t.mu.Unlock()
}

// settle recomputes the branches that lag their leaves (see Tree.dirty):
// each marked node of the level above the leaves, then every level above
// it in full (a sixteenth of the nodes, and less, per level up). The
// caller holds t.mu.
func (t *Tree) settle() {
	if !t.anyDirty {
		return
	}
	xorChildren := func(l int, i uint32) {
		lo, hi := t.Children(l, i)
		var x uint64
		for _, c := range t.levels[l+1][lo:hi] {
			x ^= c
		}
		t.levels[l][i] = x
	}
	above := len(t.levels) - 2
	for w, word := range t.dirty {
		for ; word != 0; word &= word - 1 {
			xorChildren(above, uint32(w*64+bits.TrailingZeros64(word)))
		}
		t.dirty[w] = 0
	}
	for l := above - 1; l >= 0; l-- {
		for i := range t.levels[l] {
			xorChildren(l, uint32(i))
		}
	}
	t.anyDirty = false
}

// Root returns the root hash: 0 for an empty tree.
func (t *Tree) Root() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.settle()
	return t.levels[0][0]
}

// Nodes returns the hashes of the given nodes of level l. An index out of
// range is an error.
func (t *Tree) Nodes(l int, idx []uint32) ([]uint64, error) {
	if l < 0 || l >= len(t.levels) {
		return nil, fmt.Errorf("antientropy: level %d of a tree of %d levels", l, len(t.levels))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.settle()
	lv := t.levels[l]
	out := make([]uint64, len(idx))
	for i, x := range idx {
		if int(x) >= len(lv) {
			return nil, fmt.Errorf("antientropy: node %d of level %d (width %d)", x, l, len(lv))
		}
		out[i] = lv[x]
	}
	return out, nil
}

// Bytes is the memory the tree's nodes take.
func (t *Tree) Bytes() int {
	n := 0
	for _, lv := range t.levels {
		n += 8 * len(lv)
	}
	return n
}
