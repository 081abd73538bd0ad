package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/crdt"
)

// recount counts partition p's tasks by scanning them (what the counters
// must always equal), and lists the ids that must have a waiting key.
func recount(t testing.TB, s *Store, p uint16) (map[string]int64, map[uint64]bool) {
	t.Helper()
	counts := map[string]int64{}
	waiting := map[uint64]bool{}
	eachStored(t, s, p, func(st *StoredTask) {
		if q, c, ok := classOf(st.Task, meta{state: st.Index, expiryMs: st.ExpiryMs}); ok {
			counts[q+"/"+c.String()]++
			if c == ClassWaiting {
				waiting[st.Task.ID] = true
			}
		}
	})
	return counts, waiting
}

// checkCounts fails unless partition p's counters and waiting keys agree
// with its stored tasks, and a count of one queue is that queue's part.
func checkCounts(t testing.TB, s *Store, p uint16) {
	t.Helper()
	want, wantWaiting := recount(t, s, p)
	entries, err := s.Counts(p, "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, e := range entries {
		got[e.Queue+"/"+e.Class.String()] = e.N
		one, err := s.Counts(p, e.Queue)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, o := range one {
			if o.Queue != e.Queue {
				t.Fatalf("count of queue %q answered queue %q", e.Queue, o.Queue)
			}
			found = found || o == e
		}
		if !found {
			t.Fatalf("count of queue %q misses %+v: %+v", e.Queue, e, one)
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("partition %d: counters %v, stored tasks %v", p, got, want)
	}
	gotWaiting := map[uint64]bool{}
	err = s.ScanWaiting(p, func(t *crdt.Task) error {
		gotWaiting[t.ID] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(gotWaiting, wantWaiting) {
		t.Fatalf("partition %d: waiting keys %v, waiting tasks %v", p, gotWaiting, wantWaiting)
	}
}

// The counters follow every way a task's class changes: random enqueues
// (with dependencies, delayed, into two queues, with conflicting specs),
// updates, completions, aborts and cancels, claims granted and ended by
// the claim FSM (also before the task arrives), delayed tasks promoted,
// deletions and partition drops; after every step they equal a count of
// the stored tasks.
func TestCountsFollowEveryChange(t *testing.T) {
	s, clk := memStore(t)
	rng := rand.New(rand.NewPCG(3, 5))
	const ids = 40
	part := func(id uint64) uint16 { return uint16(id % 3) }
	seen := map[Class]bool{}
	terminal := func(id uint64, step int, kind crdt.TerminalKind) *crdt.Task {
		return &crdt.Task{ID: id, Terminals: []crdt.Terminal{{Kind: kind, At: crdt.Timestamp{WallMs: clk.ms + int64(step), Node: 1}, Claim: uint64(step)}}}
	}
	for step := range 4000 {
		id := uint64(rng.IntN(ids) + 1)
		p := part(id)
		var err error
		switch op := rng.IntN(14); op {
		case 0, 1:
			task := newTask(id, fmt.Sprint("q", rng.IntN(2)), int32(rng.IntN(3)))
			switch rng.IntN(4) {
			case 0:
				task.Spec.DependsOn = []uint64{id + 1000}
			case 1:
				task.Spec.NotBeforeMs = clk.ms + int64(rng.IntN(50))
			}
			_, err = s.MergeTask(p, task)
		case 2:
			_, err = s.MergeTask(p, &crdt.Task{ID: id, Updates: []crdt.Update{{At: crdt.Timestamp{WallMs: clk.ms + int64(step), Node: 1}, Claim: 1, Seq: uint64(step), Progress: 0.5}}})
		case 3:
			_, err = s.MergeTask(p, terminal(id, step, crdt.Completed))
		case 4:
			_, err = s.MergeTask(p, terminal(id, step, crdt.Aborted))
		case 5:
			_, err = s.MergeTask(p, terminal(id, step, crdt.Cancelled))
		case 6:
			err = s.MarkClaimed(p, []ClaimMark{{ID: id, ExpiryMs: clk.ms + int64(rng.IntN(1000))}})
		case 7:
			err = s.ReleaseClaims(p, []uint64{id})
		case 8:
			err = s.ApplyClaimFSM(p, ClaimFSMUpdate{AppliedIndex: uint64(step), Moves: []IndexMove{
				{ID: id, Claimed: true, ExpiryMs: clk.ms + 5}, {ID: id + 1, Claimed: rng.IntN(2) == 0, ExpiryMs: clk.ms + 9}}}, false)
		case 9:
			clk.set(clk.ms + int64(rng.IntN(20)))
			_, err = s.PromoteDelayed(p, 1+rng.IntN(4))
		case 10:
			err = s.DeleteTasks(p, []uint64{id, id + 3})
		case 11:
			if rng.IntN(30) == 0 {
				if err = s.DropPartition(p); err == nil {
					s.ReopenPartition(p)
				}
			}
		case 12:
			// Two specs of one id from different coordinators: the join
			// resolves the conflict, possibly into another queue.
			task := newTask(id, fmt.Sprint("q", rng.IntN(2)), 0)
			task.Spec.CreatedAt.Node = uint32(2 + rng.IntN(3))
			_, err = s.MergeTask(p, task)
		case 13:
			items := make([]MergeItem, 0, 6)
			for range 6 {
				x := uint64(rng.IntN(ids) + 1)
				items = append(items, MergeItem{Partition: part(x), Task: newTask(x, "q0", 1)})
			}
			_, err = s.MergeTasks(items)
		}
		if err != nil {
			t.Fatalf("step %d op on %d: %v", step, id, err)
		}
		for p := range uint16(3) {
			checkCounts(t, s, p)
		}
		entries, err := s.Counts(p, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			seen[e.Class] = true
		}
	}
	for _, c := range []Class{ClassReady, ClassWaiting, ClassDelayed, ClassClaimed, ClassCompleted, ClassAborted, ClassCancelled} {
		if !seen[c] {
			t.Errorf("no step counted a task as %v", c)
		}
	}
}

// A store written before the counters (no format key, no counters, and
// Pebble's default merger named in its OPTIONS file) opens, and its
// counters and waiting keys are built from its tasks.
func TestCountsBuiltForAnOlderStore(t *testing.T) {
	fs := vfs.NewMem()
	s, clk := openTestStore(t, fs, "db")
	for id := uint64(1); id <= 300; id++ {
		task := newTask(id, fmt.Sprint("q", id%3), 0)
		if id%7 == 0 {
			task.Spec.DependsOn = []uint64{id - 1}
		}
		if id%11 == 0 {
			task.Spec.NotBeforeMs = clk.ms + 1000
		}
		mustMerge(t, s, uint16(id%4), task)
		if id%5 == 0 {
			mustMerge(t, s, uint16(id%4), cancelOf(id, t0))
		}
		if id%13 == 0 {
			if err := s.MarkClaimed(uint16(id%4), []ClaimMark{{ID: id, ExpiryMs: t0 + 5000}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := map[uint16]map[string]int64{}
	for p := range uint16(4) {
		want[p], _ = recount(t, s, p)
	}
	// Make it a format 1 store.
	for p := range uint16(4) {
		for _, tag := range []byte{tagCount, tagWaiting} {
			lo, hi := tagSpan(p, tag)
			if err := s.db.DeleteRange(lo, hi, pebble.Sync); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.db.Delete(formatKey, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.db = nil
	// A store before the counters was opened with Pebble's default
	// merger: its OPTIONS file and sstables name it.
	db, err := pebble.Open("db", &pebble.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s2, _ := openTestStore(t, fs, "db")
	for p := range uint16(4) {
		checkCounts(t, s2, p)
		got, _ := recount(t, s2, p)
		if !maps.Equal(got, want[p]) {
			t.Fatalf("partition %d after the upgrade: %v, before %v", p, got, want[p])
		}
	}
	v, err := s2.get(formatKey)
	if err != nil || len(v) != 4 || v[3] != formatVersion {
		t.Fatalf("format key %x, %v", v, err)
	}
}

// Opening a format 2 store deletes its stored segment index (format 3
// keeps it in memory) and keeps everything else.
func TestUpgradeDropsSegmentKeys(t *testing.T) {
	fs := vfs.NewMem()
	s, _ := openTestStore(t, fs, "db")
	for p := range uint16(3) {
		for i := range 20 {
			mustMerge(t, s, p, newTask(uint64(p)*1000+uint64(i)+1, "q", 0))
		}
	}
	// Make it a format 2 store: segment keys and the old version.
	for p := range uint16(3) {
		err := s.scanTaskDigests(p, func(id, d uint64) error {
			k := binary.BigEndian.AppendUint16(partitionPrefix(p, tagSegment), Segment(id))
			return s.db.Set(binary.BigEndian.AppendUint64(k, id), binary.BigEndian.AppendUint64(nil, d), pebble.NoSync)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Set(formatKey, []byte{0, 0, 0, 2}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.db = nil

	s2, _ := openTestStore(t, fs, "db")
	for p := range uint16(3) {
		checkIndexes(t, s2, p) // fails on a stray segment key
		checkCounts(t, s2, p)
		n := 0
		if err := s2.ScanSegmentRanges(p, []SegmentRange{{0, 1 << 16}}, func(uint16, SegmentEntry) error { n++; return nil }); err != nil || n != 20 {
			t.Fatalf("partition %d: %d segment entries after the upgrade, %v", p, n, err)
		}
	}
	v, err := s2.get(formatKey)
	if err != nil || len(v) != 4 || v[3] != formatVersion {
		t.Fatalf("format key %x, %v", v, err)
	}
}

// Opening a format 3 store deletes its stored ready, delayed and claimed
// indexes (format 5 keeps them in memory, built at Open from the task and
// meta keys), and the indexes built hold exactly the ready, delayed and
// claimed tasks, a claim recorded before its task arrived included.
func TestUpgradeDropsIndexKeys(t *testing.T) {
	fs := vfs.NewMem()
	s, _ := openTestStore(t, fs, "db")
	for p := range uint16(2) {
		for i := range 20 {
			mustMerge(t, s, p, newTask(uint64(p)*1000+uint64(i)+1, []string{"q", "r"}[i%2], int32(i%3)))
		}
		base := uint64(p) * 1000
		if err := s.MarkClaimed(p, []ClaimMark{{ID: base + 1, ExpiryMs: t0 + 10}, {ID: base + 2, ExpiryMs: t0 + 10}}); err != nil {
			t.Fatal(err)
		}
		if err := s.ReleaseClaims(p, []uint64{base + 2}); err != nil { // ready again, with a meta key
			t.Fatal(err)
		}
		mustMerge(t, s, p, cancelOf(base+3, t0))
		later := newTask(base+100, "q", 0)
		later.Spec.NotBeforeMs = t0 + 60_000
		mustMerge(t, s, p, later)
		if err := s.MarkClaimed(p, []ClaimMark{{ID: base + 500, ExpiryMs: t0 + 20}}); err != nil { // no task here yet
			t.Fatal(err)
		}
	}
	want := map[uint16][]uint64{}
	for p := range uint16(2) {
		want[p] = append(headIDs(t, s, p, "q", 100), headIDs(t, s, p, "r", 100)...)
		if len(want[p]) != 18 {
			t.Fatalf("partition %d: %d ready before the upgrade, want 18", p, len(want[p]))
		}
	}
	// Make it a format 3 store: ready, delayed and claimed keys as format 3
	// wrote them.
	wantDue := map[uint16][2][]DueEntry{}
	for p := range uint16(2) {
		delayed, _ := s.DelayedDue(p, math.MaxInt64, 100)
		claimed, _ := s.ClaimsExpiring(p, math.MaxInt64, 100)
		if len(delayed) != 1 || len(claimed) != 2 {
			t.Fatalf("partition %d: %d delayed and %d claimed before the upgrade, want 1 and 2", p, len(delayed), len(claimed))
		}
		wantDue[p] = [2][]DueEntry{delayed, claimed}
		for i, tag := range []byte{tagDelayed, tagClaimed} {
			for _, e := range wantDue[p][i] {
				if err := s.db.Set(timeIDKey(p, tag, e.AtMs, e.ID), nil, pebble.NoSync); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for p := range uint16(2) {
		for _, q := range []string{"q", "r"} {
			for _, e := range mustHead(t, s, p, q) {
				k := append(partitionPrefix(p, tagReady), q...)
				k = binary.BigEndian.AppendUint32(append(k, 0), math.MaxUint32-(uint32(e.Priority)^1<<31))
				if err := s.db.Set(binary.BigEndian.AppendUint64(k, e.ID), nil, pebble.NoSync); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := s.db.Set(formatKey, []byte{0, 0, 0, 3}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.db = nil

	s2, _ := openTestStore(t, fs, "db")
	for p := range uint16(2) {
		checkIndexes(t, s2, p) // fails on a stray ready key, or a ready index that is not the ready tasks
		checkCounts(t, s2, p)
		if got := append(headIDs(t, s2, p, "q", 100), headIDs(t, s2, p, "r", 100)...); !slices.Equal(got, want[p]) {
			t.Fatalf("partition %d: ready after the upgrade %v, want %v", p, got, want[p])
		}
		delayed, _ := s2.DelayedDue(p, math.MaxInt64, 100)
		claimed, _ := s2.ClaimsExpiring(p, math.MaxInt64, 100)
		if !slices.Equal(delayed, wantDue[p][0]) || !slices.Equal(claimed, wantDue[p][1]) {
			t.Fatalf("partition %d: delayed %v and claimed %v after the upgrade, want %v", p, delayed, claimed, wantDue[p])
		}
	}
	v, err := s2.get(formatKey)
	if err != nil || len(v) != 4 || v[3] != formatVersion {
		t.Fatalf("format key %x, %v", v, err)
	}
}

func mustHead(t *testing.T, s *Store, p uint16, queue string) []ReadyEntry {
	t.Helper()
	h, err := s.ReadyHead(p, queue, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A store of a newer format is refused, not misread.
func TestNewerFormatRefused(t *testing.T) {
	fs := vfs.NewMem()
	s, _ := openTestStore(t, fs, "db")
	if err := s.db.Set(formatKey, []byte{0, 0, 0, formatVersion + 1}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.db = nil
	_, err := Open(Config{Dir: "db", FS: fs})
	if err == nil || errors.Is(err, ErrCorrupt) {
		t.Fatalf("opening a newer format: %v", err)
	}
}
