package storage

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestReadyListMatchesModel drives a readyList through the patterns a
// queue sees (ids appended in order, interleaved lanes a little out of
// order, heads taken, claims released back near the head, cancels
// anywhere, several priorities) and checks it against a sorted model
// after every step, and its chunk invariants.
func TestReadyListMatchesModel(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 7))
	defer func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	}()
	var l readyList
	model := map[ReadyEntry]bool{}
	sorted := func() []ReadyEntry {
		out := make([]ReadyEntry, 0, len(model))
		for e := range model {
			out = append(out, e)
		}
		slices.SortFunc(out, func(a, b ReadyEntry) int {
			return cmp.Or(cmp.Compare(b.Priority, a.Priority), cmp.Compare(a.ID, b.ID))
		})
		return out
	}
	var taken []ReadyEntry
	next := uint64(1000)
	for step := range 20000 {
		var e ReadyEntry
		insert := true
		switch op := r.IntN(20); {
		case op < 9: // a new id, a little behind the newest now and then
			next += 1 + r.Uint64N(3)
			e = ReadyEntry{ID: next - r.Uint64N(4), Priority: int32(r.IntN(3))}
		case op < 14: // claim the head
			h := l.head(1, nil)
			if len(h) == 0 {
				continue
			}
			e, insert = h[0], false
			taken = append(taken, e)
		case op < 16: // a claim released back to its place
			if len(taken) == 0 {
				continue
			}
			i := r.IntN(len(taken))
			e = taken[i]
			taken = slices.Delete(taken, i, i+1)
		case op < 18: // cancel one anywhere
			all := sorted()
			if len(all) == 0 {
				continue
			}
			e, insert = all[r.IntN(len(all))], false
		default: // an entry that is or is not there
			e = ReadyEntry{ID: r.Uint64N(next + 10), Priority: int32(r.IntN(3))}
			insert = r.IntN(2) == 0
		}
		var changed bool
		if insert {
			changed = l.insert(e)
			if changed == model[e] {
				t.Fatalf("step %d: insert %v returned %v, model has it: %v", step, e, changed, model[e])
			}
			model[e] = true
		} else {
			changed = l.remove(e)
			if changed != model[e] {
				t.Fatalf("step %d: remove %v returned %v, model has it: %v", step, e, changed, model[e])
			}
			delete(model, e)
		}
		if l.len() != len(model) {
			t.Fatalf("step %d: len %d, model %d", step, l.len(), len(model))
		}
		if step%97 == 0 || step > 19900 {
			want := sorted()
			if got := l.head(len(want)+1, nil); !slices.Equal(got, want) {
				t.Fatalf("step %d: list %v\nmodel %v", step, got, want)
			}
			var oldest uint64
			for i, e := range want {
				if i == 0 || e.ID < oldest {
					oldest = e.ID
				}
			}
			if got, ok := l.oldest(); got != oldest || ok != (len(want) > 0) {
				t.Fatalf("step %d: oldest %d %v, model %d", step, got, ok, oldest)
			}
			checkReadyList(t, &l)
		}
	}
}

// TestReadyListPacksAppends: ids appended in order fill whole chunks.
func TestReadyListPacksAppends(t *testing.T) {
	var l readyList
	for id := range uint64(10 * readyChunk) {
		l.insert(ReadyEntry{ID: id + 1})
	}
	checkReadyList(t, &l)
	if n := len(l.levels[0].chunks); n != 10 {
		t.Fatalf("%d chunks for %d ids appended in order, want 10", n, 10*readyChunk)
	}
	// Taking every head empties the list and drops its chunks.
	for l.len() > 0 {
		if !l.remove(l.head(1, nil)[0]) {
			t.Fatal("head not removed")
		}
	}
	if len(l.levels) != 0 {
		t.Fatalf("%d levels left in an empty list", len(l.levels))
	}
}

func checkReadyList(t *testing.T, l *readyList) {
	t.Helper()
	n := 0
	for i, lv := range l.levels {
		if i > 0 && l.levels[i-1].prio <= lv.prio {
			t.Fatalf("levels out of order: %d then %d", l.levels[i-1].prio, lv.prio)
		}
		if len(lv.chunks) == 0 {
			t.Fatalf("level %d is empty", lv.prio)
		}
		for j, c := range lv.chunks {
			if len(c) == 0 || len(c) > readyChunk {
				t.Fatalf("level %d chunk %d holds %d ids", lv.prio, j, len(c))
			}
			if !slices.IsSorted(c) || (j > 0 && lv.chunks[j-1][len(lv.chunks[j-1])-1] >= c[0]) {
				t.Fatalf("level %d chunk %d out of order", lv.prio, j)
			}
			n += len(c)
		}
	}
	if n != l.len() {
		t.Fatalf("chunks hold %d ids, len says %d", n, l.len())
	}
}

// TestReadyListMergesThinChunks: chunks thinned by removals in their
// middle are merged into their successor, keeping every id in order.
func TestReadyListMergesThinChunks(t *testing.T) {
	var l readyList
	for id := range uint64(3 * readyChunk) {
		l.insert(ReadyEntry{ID: id + 1})
	}
	// Keep the first and last few ids of the first two chunks.
	for id := uint64(5); id <= 2*readyChunk-5; id++ {
		l.remove(ReadyEntry{ID: id})
	}
	checkReadyList(t, &l)
	if n := len(l.levels[0].chunks); n != 2 {
		t.Fatalf("%d chunks after thinning the first two, want them merged into 2", n)
	}
	if got := l.head(8, nil); got[3].ID != 4 || got[4].ID != 2*readyChunk-4 {
		t.Fatalf("head after merging %v", got)
	}
}
