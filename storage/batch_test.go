package storage

import (
	"bytes"
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSortOpsOrdersByKeyThenWriteOrder checks sortOps against a plain
// stable sort by key on random batches whose keys share long prefixes,
// differ only past the first 16 bytes, or extend each other with zero
// bytes (the cases the integer prefix alone cannot tell apart).
func TestSortOpsOrdersByKeyThenWriteOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	stems := [][]byte{
		{},
		{0},
		{0, 0},
		{0, 1, 0x01},
		[]byte("0123456789abcdef"),
		[]byte("0123456789abcdef\x00"),
		[]byte("0123456789abcdefX"),
		[]byte("0123456789abcdeX"),
	}
	for round := range 300 {
		var b sortedBatch
		n := rng.IntN(64)
		for range n {
			k := slices.Clone(stems[rng.IntN(len(stems))])
			for range rng.IntN(4) {
				k = append(k, byte(rng.IntN(3)))
			}
			switch rng.IntN(3) {
			case 0:
				b.Set(k, []byte{byte(len(b.ops))})
			case 1:
				b.Delete(k)
			default:
				b.NoteAbsent(k)
			}
		}
		want := slices.Clone(b.ops)
		slices.SortStableFunc(want, func(x, y batchOp) int { return bytes.Compare(x.key, y.key) })
		b.sortOps()
		if len(b.ops) != len(want) {
			t.Fatalf("round %d: %d ops after sorting, want %d", round, len(b.ops), len(want))
		}
		for i := range want {
			got, w := b.ops[i], want[i]
			if !bytes.Equal(got.key, w.key) || got.seq != w.seq || got.del != w.del || got.absent != w.absent || !bytes.Equal(got.value, w.value) {
				t.Fatalf("round %d: op %d is %q seq %d, want %q seq %d", round, i, got.key, got.seq, w.key, w.seq)
			}
		}
		if !slices.IsSortedFunc(b.ops, func(x, y batchOp) int { return cmp.Or(bytes.Compare(x.key, y.key), cmp.Compare(x.seq, y.seq)) }) {
			t.Fatalf("round %d: not in (key, seq) order", round)
		}
	}
}
