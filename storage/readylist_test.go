package storage

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"strings"
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
	if n := len(l.levels[0].lines[""].chunks); n != 10 {
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
		if len(lv.lines) == 0 || lv.cur == nil {
			t.Fatalf("level %d is empty", lv.prio)
		}
		if lv.quota < 1 || lv.quota > lv.cur.weight {
			t.Fatalf("level %d: quota %d of key %q's weight %d", lv.prio, lv.quota, lv.cur.key, lv.cur.weight)
		}
		// The ring holds every line once.
		seen := map[*readyLine]bool{}
		for ln := lv.cur; !seen[ln]; ln = ln.next {
			if ln.next.prev != ln || lv.lines[ln.key] != ln {
				t.Fatalf("level %d: key %q's ring links or map entry broken", lv.prio, ln.key)
			}
			seen[ln] = true
		}
		if len(seen) != len(lv.lines) {
			t.Fatalf("level %d: %d lines in the ring, %d in the map", lv.prio, len(seen), len(lv.lines))
		}
		for key, ln := range lv.lines {
			if len(ln.chunks) == 0 {
				t.Fatalf("level %d key %q is empty", lv.prio, key)
			}
			for j, c := range ln.chunks {
				if len(c) == 0 || len(c) > readyChunk {
					t.Fatalf("level %d key %q chunk %d holds %d ids", lv.prio, key, j, len(c))
				}
				if !slices.IsSorted(c) || (j > 0 && ln.chunks[j-1][len(ln.chunks[j-1])-1] >= c[0]) {
					t.Fatalf("level %d key %q chunk %d out of order", lv.prio, key, j)
				}
				n += len(c)
			}
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
	if n := len(l.levels[0].lines[""].chunks); n != 2 {
		t.Fatalf("%d chunks after thinning the first two, want them merged into 2", n)
	}
	if got := l.head(8, nil); got[3].ID != 4 || got[4].ID != 2*readyChunk-4 {
		t.Fatalf("head after merging %v", got)
	}
}

// turnModel is the reference of a level's turns: a ring of keys in a
// slice, each with its sorted ids and weight.
type turnModel struct {
	keys   []string // the ring, in turn order
	ids    map[string][]uint64
	weight map[string]int
	cur    int // index in keys of the key whose turn it is
	quota  int
}

func (m *turnModel) insert(key string, w int, id uint64) {
	if len(m.ids[key]) == 0 {
		if len(m.keys) == 0 {
			m.keys, m.cur, m.quota = []string{key}, 0, w
		} else {
			m.keys = slices.Insert(m.keys, m.cur, key) // just before cur
			m.cur++
		}
	}
	m.ids[key] = append(m.ids[key], id)
	slices.Sort(m.ids[key])
	m.weight[key] = w
}

func (m *turnModel) remove(key string, id uint64) {
	i := slices.Index(m.ids[key], id)
	wasHead := i == 0
	m.ids[key] = slices.Delete(m.ids[key], i, i+1)
	k := slices.Index(m.keys, key)
	if len(m.ids[key]) == 0 {
		m.keys = slices.Delete(m.keys, k, k+1)
		switch {
		case len(m.keys) == 0:
			m.cur, m.quota = 0, 0
		case k == m.cur:
			m.cur %= len(m.keys)
			m.quota = m.weight[m.keys[m.cur]]
		case k < m.cur:
			m.cur--
		}
		return
	}
	if k == m.cur && wasHead {
		if m.quota--; m.quota <= 0 {
			m.cur = (m.cur + 1) % len(m.keys)
			m.quota = m.weight[m.keys[m.cur]]
		}
	}
}

// order is the claim order the model gives: the turns played out.
func (m *turnModel) order() []ReadyEntry {
	pos := map[string]int{}
	var out []ReadyEntry
	left := 0
	for _, ids := range m.ids {
		left += len(ids)
	}
	cur, quota := m.cur, m.quota
	for left > 0 {
		k := m.keys[cur]
		w := uint32(m.weight[k])
		if k == "" {
			w = 0
		}
		for ; quota > 0 && pos[k] < len(m.ids[k]); quota-- {
			out = append(out, ReadyEntry{ID: m.ids[k][pos[k]], Key: k, Weight: w})
			pos[k]++
			left--
		}
		cur = (cur + 1) % len(m.keys)
		quota = m.weight[m.keys[cur]]
	}
	return out
}

// TestReadyListTurns drives one priority of a readyList with several
// keys of several weights (ids appended, heads taken in claim order,
// another key's head taken, tasks cancelled anywhere) and checks its
// claim order against turnModel after every step.
func TestReadyListTurns(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 11))
	defer func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	}()
	var l readyList
	m := &turnModel{ids: map[string][]uint64{}, weight: map[string]int{}}
	keys := []string{"", "a", "b", "c", "d"}
	weights := map[string]int{"": 1, "a": 1, "b": 3, "c": 2, "d": 1}
	next := uint64(1)
	for step := range 5000 {
		switch op := r.IntN(10); {
		case op < 5:
			k := keys[r.IntN(len(keys))]
			if k == "a" && r.IntN(4) > 0 {
				k = "b" // a heavy key
			}
			next++
			w := uint32(weights[k])
			if k == "" {
				w = 0
			}
			l.insert(ReadyEntry{ID: next, Key: k, Weight: w})
			m.insert(k, weights[k], next)
		case op < 8: // a claim takes the head
			h := l.head(1, nil)
			if len(h) == 0 {
				continue
			}
			l.remove(h[0])
			m.remove(h[0].Key, h[0].ID)
		case op < 9: // a claim takes another key's head
			all := l.head(l.len(), nil)
			if len(all) == 0 {
				continue
			}
			e := all[r.IntN(len(all))]
			e.ID = m.ids[e.Key][0]
			l.remove(e)
			m.remove(e.Key, e.ID)
		default: // a cancel anywhere
			all := l.head(l.len(), nil)
			if len(all) == 0 {
				continue
			}
			e := all[r.IntN(len(all))]
			l.remove(e)
			m.remove(e.Key, e.ID)
		}
		want := m.order()
		if got := l.head(l.len()+1, nil); !slices.Equal(got, want) {
			t.Fatalf("step %d: order %v\nmodel %v", step, got, want)
		}
		if n := 1 + r.IntN(8); len(want) >= n && !slices.Equal(l.head(n, nil), want[:n]) {
			t.Fatalf("step %d: head(%d) %v, model %v", step, n, l.head(n, nil), want[:n])
		}
		if l.len() > 0 {
			checkReadyList(t, &l)
		}
	}
}

// TestReadyListFairShares: a key with a thousand ready tasks does not
// starve one with ten: taking heads alternates them by weight.
func TestReadyListFairShares(t *testing.T) {
	var l readyList
	for id := range uint64(1000) {
		l.insert(ReadyEntry{ID: id + 1, Key: "heavy", Weight: 3})
	}
	for id := range uint64(10) {
		l.insert(ReadyEntry{ID: 5000 + id, Key: "light", Weight: 1})
	}
	var got []string
	for range 16 {
		h := l.head(1, nil)[0]
		got = append(got, h.Key[:1])
		l.remove(h)
	}
	if s := strings.Join(got, ""); s != "hhhlhhhlhhhlhhhl" {
		t.Fatalf("claim order by key %s, want hhhl repeated (weights 3 and 1)", s)
	}
}
