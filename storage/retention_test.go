package storage

import (
	"bytes"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/crdt"
)

// completedAt is a terminal event of task id at ms (a complete, or a
// cancel when the task has no spec).
func completedAt(id uint64, queue string, ms int64) *crdt.Task {
	t := &crdt.Task{ID: id, Terminals: []crdt.Terminal{{Kind: crdt.Completed, At: crdt.Timestamp{WallMs: ms, Node: 1}, Claim: 1}}}
	if queue != "" {
		t.Spec = newTask(id, queue, 0).Spec
	} else {
		t.Terminals[0].Kind, t.Terminals[0].Claim = crdt.Cancelled, 0
	}
	return t
}

func storedIDs(t *testing.T, s *Store, p uint16) []uint64 {
	t.Helper()
	var ids []uint64
	eachStored(t, s, p, func(st *StoredTask) { ids = append(ids, st.Task.ID) })
	return ids
}

// Each queue's terminal tasks are deleted at its own horizon; a task
// without a spec is of the queue "", at the default; the delete horizons
// then keep a stale copy of a deleted task out, queue by queue.
func TestRetentionPerQueue(t *testing.T) {
	s, _ := memStore(t)
	// short: 1-3 ended at t0+10, t0+20, t0+30; long: 11-13 likewise;
	// other (default): 21-23; 31: no spec, ended at t0+10; 40: short,
	// not terminal.
	for i, q := range []string{"short", "long", "other"} {
		for j := range 3 {
			id := uint64(10*i + j + 1)
			mustMerge(t, s, 0, completedAt(id, q, t0+10*int64(j+1)))
		}
	}
	mustMerge(t, s, 0, completedAt(31, "", t0+10), newTask(40, "short", 0))
	h := Horizons{Default: t0 + 15, Queues: map[string]int64{"short": t0 + 25, "long": t0}}
	n, err := s.DeleteExpired(0, h, 1, nil) // batches of one: each queue's loop
	if err != nil || n != 4 {
		t.Fatalf("deleted %d, %v; want 4 (short 1, 2; other 21; 31)", n, err)
	}
	if got, want := storedIDs(t, s, 0), []uint64{3, 11, 12, 13, 22, 23, 40}; !slices.Equal(got, want) {
		t.Fatalf("kept %v, want %v", got, want)
	}
	checkIndexes(t, s, 0)
	if got := s.DeleteHorizons(); got.Default != t0+15 || got.Of("short") != t0+25 || got.Of("long") != t0 {
		t.Fatalf("delete horizons %+v: want default t0+15, short t0+25, long t0", got)
	}
	// Stale copies: of deleted tasks, kept out; of a queue whose horizon
	// is earlier, stored.
	mustMerge(t, s, 0, completedAt(2, "short", t0+20), completedAt(21, "other", t0+10), completedAt(14, "long", t0+14), completedAt(24, "other", t0+16))
	if got, want := storedIDs(t, s, 0), []uint64{3, 11, 12, 13, 14, 22, 23, 24, 40}; !slices.Equal(got, want) {
		t.Fatalf("after stale copies: %v, want %v (2 and 21 deleted, 14 after long's horizon t0)", got, want)
	}
	// Nothing left to delete: the bounds let the pass skip every queue.
	if n, err := s.DeleteExpired(0, h, 10, nil); err != nil || n != 0 {
		t.Fatalf("second pass deleted %d, %v", n, err)
	}
	if q, known, _ := s.terminal.due(0, h); !known || len(q) != 0 {
		t.Fatalf("queues due after the pass %v (known %v), want none", q, known)
	}
	checkIndexes(t, s, 0)
}

// RaiseDeleteHorizons never lowers a horizon: a queue that gets one of
// its own starts from the default it had (its tasks were deleted at
// it), and a queue dropped from h is raised with the default.
func TestRaiseDeleteHorizons(t *testing.T) {
	s, _ := memStore(t)
	s.RaiseDeleteHorizons(Horizons{Default: 100, Queues: map[string]int64{"a": 50, "b": 150}})
	if h := s.DeleteHorizons(); h.Default != 100 || h.Of("a") != 50 || h.Of("b") != 150 || h.Of("c") != 100 {
		t.Fatalf("%+v", h)
	}
	s.RaiseDeleteHorizons(Horizons{Default: 120, Queues: map[string]int64{"a": 110, "c": 10}})
	if h := s.DeleteHorizons(); h.Default != 120 || h.Of("a") != 110 || h.Of("b") != 150 || h.Of("c") != 100 {
		t.Fatalf("%+v: want default 120, a 110, b kept at 150, c from the default it had (100)", h)
	}
	s.RaiseDeleteHorizon(200)
	if h := s.DeleteHorizons(); h.Of("a") != 200 || h.Of("b") != 200 || s.DeleteHorizon() != 200 {
		t.Fatalf("%+v: want 200 everywhere", h)
	}
}

// The in-memory bounds never hide a queue with a task due: through
// random enqueues, completions (with and without a spec), deletions,
// passes and drops, every queue a scan finds due is one the bounds name,
// and a pass deletes exactly what a model of the index says.
func TestTerminalBoundsHideNothingDue(t *testing.T) {
	s, clk := memStore(t)
	rng := rand.New(rand.NewPCG(9, 4))
	queues := []string{"a", "b", ""}
	skipped := 0
	for step := range 3000 {
		id := uint64(rng.IntN(40) + 1)
		p := uint16(id % 2)
		var err error
		switch rng.IntN(6) {
		case 0:
			_, err = s.MergeTask(p, newTask(id, queues[rng.IntN(2)], 0))
		case 1, 2:
			_, err = s.MergeTask(p, completedAt(id, queues[rng.IntN(3)], clk.ms-int64(rng.IntN(100))))
		case 3:
			err = s.DeleteTasks(p, []uint64{id})
		case 4:
			clk.set(clk.ms + int64(rng.IntN(30)))
		case 5:
			if rng.IntN(40) == 0 {
				if err = s.DropPartition(p); err == nil {
					s.ReopenPartition(p)
				}
			}
		}
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		p = uint16(rng.IntN(2))
		h := Horizons{Default: clk.ms - int64(rng.IntN(120)), Queues: map[string]int64{"a": clk.ms - int64(rng.IntN(120))}}
		all, err := s.scanQueues(p)
		if err != nil {
			t.Fatal(err)
		}
		named, known, _ := s.terminal.due(p, h)
		for q, ms := range all {
			if ms < h.Of(q) && known && !slices.Contains(named, q) {
				t.Fatalf("step %d partition %d: queue %q has a key at %d before its horizon %d; the bounds name %v", step, p, q, ms, h.Of(q), named)
			}
		}
		if known && len(named) < len(all) {
			skipped++
		}
		if rng.IntN(10) != 0 {
			continue
		}
		// A pass (at horizons no lower than the store's: a raise never
		// lowers them, and the model deletes at h).
		h = h.Later(s.DeleteHorizons())
		var want []uint64
		eachStored(t, s, p, func(st *StoredTask) {
			if ev, ok := st.Task.Terminal(); !ok || ev.At.WallMs >= h.Of(queueOfTask(st.Task)) {
				want = append(want, st.Task.ID)
			}
		})
		if _, err := s.DeleteExpired(p, h, 1+rng.IntN(3), nil); err != nil {
			t.Fatal(err)
		}
		if got := storedIDs(t, s, p); !slices.Equal(got, want) {
			t.Fatalf("step %d partition %d: after a pass at %+v kept %v, want %v", step, p, h, got, want)
		}
		checkIndexes(t, s, p)
	}
	if skipped == 0 {
		t.Fatal("the bounds never let a pass skip a queue")
	}
}

// Opening a store of format 6 (one retention span per partition) moves
// the retention index to the per-queue one.
func TestUpgradeBuildsTerminalIndex(t *testing.T) {
	fs := vfs.NewMem()
	s, _ := openTestStore(t, fs, "db")
	for p := range uint16(2) {
		for i := range 30 {
			id := uint64(p)*100 + uint64(i) + 1
			switch i % 3 {
			case 0:
				mustMerge(t, s, p, newTask(id, "a", 0))
			case 1:
				mustMerge(t, s, p, completedAt(id, []string{"a", "b"}[i%2], t0+int64(i)))
			default:
				mustMerge(t, s, p, completedAt(id, "", t0+int64(i)))
			}
		}
	}
	want := map[uint16]map[string]int64{}
	for p := range uint16(2) {
		all, err := s.scanQueues(p)
		if err != nil {
			t.Fatal(err)
		}
		want[p] = all
		// Make it a format 6 store: the old keys, none of the new.
		var old [][]byte
		lo, hi := tagSpan(p, tagTerminalQ)
		it, _ := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		for ok := it.First(); ok; ok = it.Next() {
			_, ms, id, err := parseTerminalKey(it.Key())
			if err != nil {
				t.Fatal(err)
			}
			old = append(old, timeIDKey(p, tagTerminal, ms, id))
		}
		it.Close()
		if err := s.db.DeleteRange(lo, hi, pebble.Sync); err != nil {
			t.Fatal(err)
		}
		for _, k := range old {
			if err := s.db.Set(k, nil, pebble.Sync); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.db.Set(formatKey, []byte{0, 0, 0, 6}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.db = nil

	var logged bytes.Buffer
	s2, err := Open(Config{Dir: "db", FS: fs, Clock: &testClock{ms: t0}, CacheBytes: 8 << 20,
		Log: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if !strings.Contains(logged.String(), `msg="built the per-queue retention index (store format 7)" "terminal tasks"=40 `) {
		t.Fatalf("the upgrade logged %q", logged.String())
	}
	for p := range uint16(2) {
		checkIndexes(t, s2, p) // fails on a stray key of either form
		got, err := s2.scanQueues(p)
		if err != nil || !maps.Equal(got, want[p]) {
			t.Fatalf("partition %d: queues %v after the upgrade, want %v (%v)", p, got, want[p], err)
		}
	}
	if n, err := s2.DeleteTerminalBefore(0, t0+100, 7, nil); err != nil || n != 20 {
		t.Fatalf("retention after the upgrade deleted %d, %v; want 20", n, err)
	}
	v, err := s2.get(formatKey)
	if err != nil || len(v) != 4 || v[3] != 7 {
		t.Fatalf("format key %x, %v", v, err)
	}
}
