package storage

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/crdt"
)

// testClock is a Clock the test sets by hand.
type testClock struct {
	mu sync.Mutex
	ms int64
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.UnixMilli(c.ms)
}

func (c *testClock) set(ms int64) {
	c.mu.Lock()
	c.ms = ms
	c.mu.Unlock()
}

const t0 = 1_700_000_000_000 // test start time, Unix ms

func openTestStore(t testing.TB, fs vfs.FS, dir string) (*Store, *testClock) {
	t.Helper()
	clk := &testClock{ms: t0}
	s, err := Open(Config{Dir: dir, FS: fs, Clock: clk, CacheBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s.db != nil {
			s.Close()
		}
	})
	return s, clk
}

func memStore(t testing.TB) (*Store, *testClock) { return openTestStore(t, vfs.NewMem(), "db") }

func newTask(id uint64, queue string, prio int32) *crdt.Task {
	return &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: queue, Priority: prio, Payload: []byte(fmt.Sprint("payload-", id)),
		CreatedAt: crdt.Timestamp{WallMs: t0, Node: 1}}}
}

func cancelOf(id uint64, at int64) *crdt.Task {
	return &crdt.Task{ID: id, Terminals: []crdt.Terminal{{At: crdt.Timestamp{WallMs: at}, Kind: crdt.Cancelled}}}
}

func mustMerge(t testing.TB, s *Store, p uint16, tasks ...*crdt.Task) []MergeResult {
	t.Helper()
	items := make([]MergeItem, len(tasks))
	for i, x := range tasks {
		items[i] = MergeItem{Partition: p, Task: x}
	}
	res, err := s.MergeTasks(items)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func headIDs(t testing.TB, s *Store, p uint16, queue string, limit int) []uint64 {
	t.Helper()
	h, err := s.ReadyHead(p, queue, limit)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uint64, len(h))
	for i, e := range h {
		ids[i] = e.ID
	}
	return ids
}

func TestMergeTaskNewThenIdempotent(t *testing.T) {
	s, _ := memStore(t)
	task := newTask(42, "q", 0)
	r1, err := s.MergeTask(3, task)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Existed || !r1.Changed() || r1.NewDigest != task.Digest() {
		t.Fatalf("first merge = %+v", r1)
	}
	r2, err := s.MergeTask(3, task)
	if err != nil {
		t.Fatal(err)
	}
	if !r2.Existed || r2.Changed() || r2.OldDigest != r1.NewDigest {
		t.Fatalf("repeat merge = %+v, want unchanged", r2)
	}
	st, err := s.GetTask(3, 42)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(st.Task.Encode(), task.Encode()) || st.Index != IndexReady || st.Digest != r1.NewDigest {
		t.Fatalf("stored %+v", st)
	}
	if _, err := s.GetTask(4, 42); !errors.Is(err, ErrNotFound) {
		t.Fatalf("other partition: err = %v, want ErrNotFound", err)
	}
	checkIndexes(t, s, 3)
}

func TestMergeJoinsWithStoredState(t *testing.T) {
	s, _ := memStore(t)
	// The cancel arrives before the enqueue (this replica missed it).
	r1 := mustMerge(t, s, 0, cancelOf(7, t0+5))[0]
	st, _ := s.GetTask(0, 7)
	if st.Index != IndexNone || st.Task.Spec != nil {
		t.Fatalf("cancel-only state indexed: %+v", st)
	}
	r2 := mustMerge(t, s, 0, newTask(7, "q", 0))[0]
	want, _, _ := crdt.Join(cancelOf(7, t0+5), newTask(7, "q", 0))
	if r2.OldDigest != r1.NewDigest || r2.NewDigest != want.Digest() {
		t.Fatalf("merge result %+v, want digest %x", r2, want.Digest())
	}
	if got := headIDs(t, s, 0, "q", 10); len(got) != 0 {
		t.Fatalf("cancelled task is ready: %v", got)
	}
	checkIndexes(t, s, 0)
}

func TestMergeTerminalLeavesReadyIndex(t *testing.T) {
	s, _ := memStore(t)
	mustMerge(t, s, 0, newTask(1, "q", 0), newTask(2, "q", 0))
	mustMerge(t, s, 0, cancelOf(1, t0))
	if got := headIDs(t, s, 0, "q", 10); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("head = %v, want [2]", got)
	}
	checkIndexes(t, s, 0)
}

func TestMergeSpecConflictReported(t *testing.T) {
	s, _ := memStore(t)
	a, b := newTask(9, "q", 1), newTask(9, "other", 5)
	mustMerge(t, s, 0, a)
	r := mustMerge(t, s, 0, b)[0]
	if !r.SpecConflict {
		t.Fatalf("conflict not reported: %+v", r)
	}
	j, _, _ := crdt.Join(a, b)
	if r.NewDigest != j.Digest() {
		t.Fatalf("stored state is not the join")
	}
	// The task is indexed under the winning spec only.
	checkIndexes(t, s, 0)
}

func TestMergeBatchWithDuplicates(t *testing.T) {
	s, _ := memStore(t)
	u1 := &crdt.Task{ID: 5, Updates: []crdt.Update{{Claim: 1, Seq: 1, Progress: 0.1}}}
	u2 := &crdt.Task{ID: 5, Updates: []crdt.Update{{Claim: 1, Seq: 2, Progress: 0.2}}}
	res := mustMerge(t, s, 0, newTask(5, "q", 0), u1, newTask(6, "q", 0), u2)
	if res[0] != res[1] || res[0] != res[3] || res[2].ID != 6 {
		t.Fatalf("results %+v", res)
	}
	st, _ := s.GetTask(0, 5)
	if len(st.Task.Updates) != 2 || st.Task.Spec == nil {
		t.Fatalf("stored %+v", st.Task)
	}
}

func TestMergeConcurrentWritersLoseNothing(t *testing.T) {
	s, _ := memStore(t)
	const writers, each = 8, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				u := &crdt.Task{ID: 1, Updates: []crdt.Update{{Claim: uint64(w + 1), Seq: uint64(i + 1)}}}
				if _, err := s.MergeTask(0, u); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	st, err := s.GetTask(0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Task.Updates) != writers*each {
		t.Fatalf("%d updates stored, want %d", len(st.Task.Updates), writers*each)
	}
}

// eachStored calls fn with every task of partition p as GetTask reads it
// (with its index state), in id order.
func eachStored(t testing.TB, s *Store, p uint16, fn func(*StoredTask)) {
	t.Helper()
	for start := uint64(0); ; {
		page, next, more, err := s.ScanTasks(p, start, 256)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range page {
			st, err := s.GetTask(p, x.Task.ID)
			if err != nil {
				t.Fatal(err)
			}
			fn(st)
		}
		if !more {
			return
		}
		start = next
	}
}

// checkIndexes verifies that partition p's indexes agree with its tasks:
// every task has a meta entry, exactly the index entry its meta names, and
// no index holds an entry for a task that does not name it.
func checkIndexes(t testing.TB, s *Store, p uint16) {
	t.Helper()
	want := map[string]bool{}
	wantReady := map[queueKey][]ReadyEntry{}
	wantTimes := map[byte][]DueEntry{}
	eachStored(t, s, p, func(st *StoredTask) {
		if st.Index == IndexReady {
			k := queueKey{p, st.Task.Spec.Queue}
			wantReady[k] = append(wantReady[k], ReadyEntry{ID: st.Task.ID, Priority: st.Task.Spec.Priority})
		}
		if tag, e, ok := timeEntry(st.Task.ID, meta{st.Index, st.ExpiryMs, st.DueMs}, st.Task.Spec); ok {
			wantTimes[tag] = append(wantTimes[tag], e)
		}
		if e, ok := deadlineEntry(st.Task.ID, meta{st.Index, st.ExpiryMs, st.DueMs}, st.Task.Spec); ok {
			wantTimes[tagDeadline] = append(wantTimes[tagDeadline], e)
		}
		if k := terminalKey(p, st.Task); k != nil {
			want[string(k)] = true
		}
		if st.Task.Spec != nil {
			want[string(queueIndexKey(p, st.Task.Spec.Queue, st.Task.ID))] = true
		}
		_, terminal := st.Task.Terminal()
		if unclaimable := terminal || st.Task.Spec == nil; st.Index != IndexClaimed && unclaimable != (st.Index == IndexNone) {
			t.Fatalf("task %d: index state %v, terminal=%v spec=%v", st.Task.ID, st.Index, terminal, st.Task.Spec != nil)
		}
	})
	for _, tag := range []byte{tagReady, tagDelayed, tagClaimed, tagSegment, tagTerminal, tagTerminalQ, tagQueue} {
		lo, hi := tagSpan(p, tag)
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			t.Fatal(err)
		}
		for ok := it.First(); ok; ok = it.Next() {
			k := string(it.Key())
			if !want[k] {
				t.Fatalf("stray index entry %x (tag %#x, id %d)", k, tag, binary.BigEndian.Uint64(it.Key()[len(k)-8:]))
			}
			delete(want, k)
		}
		it.Close()
	}
	if len(want) != 0 {
		t.Fatalf("%d index entries missing", len(want))
	}
	// The in-memory ready index holds exactly the ready tasks, in order.
	s.readyMu.RLock()
	queues := map[queueKey]*readyQueue{}
	for k, q := range s.ready {
		if k.p == p {
			queues[k] = q
		}
	}
	s.readyMu.RUnlock()
	for k, q := range queues {
		q.mu.Lock()
		got := q.l.head(q.l.len()+1, nil)
		q.mu.Unlock()
		w := wantReady[k]
		slices.SortFunc(w, func(a, b ReadyEntry) int {
			return cmp.Or(cmp.Compare(b.Priority, a.Priority), cmp.Compare(a.ID, b.ID))
		})
		if !slices.Equal(got, w) {
			t.Fatalf("ready index of queue %q: %v, want %v", k.queue, got, w)
		}
		delete(wantReady, k)
	}
	for k, w := range wantReady {
		t.Fatalf("queue %q: %d ready tasks missing from the ready index", k.queue, len(w))
	}
	// So do the delayed and claimed indexes; a claim recorded before its
	// task arrived (a meta key without a task) is claimed too.
	lo, hi := tagSpan(p, tagMeta)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.Fatal(err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		id := idFromKey(it.Key())
		if _, err := s.get(taskKey(p, id)); !errors.Is(err, ErrNotFound) {
			continue
		}
		if m, ok := decodeMeta(it.Value()); ok && m.state == IndexClaimed {
			wantTimes[tagClaimed] = append(wantTimes[tagClaimed], DueEntry{ID: id, AtMs: max(m.expiryMs, 0)})
		}
	}
	it.Close()
	for _, tag := range []byte{tagDelayed, tagClaimed, tagDeadline} {
		var got []DueEntry
		if x := s.timeIndex(p, tag, false); x != nil {
			got = x.before(math.MaxInt64, math.MaxInt)
		}
		w := wantTimes[tag]
		slices.SortFunc(w, func(a, b DueEntry) int { return cmp.Or(cmp.Compare(a.AtMs, b.AtMs), cmp.Compare(a.ID, b.ID)) })
		if !slices.Equal(got, w) {
			t.Fatalf("time index %#x: %v, want %v", tag, got, w)
		}
	}
}

// TestMergeWithEncodingsStoresWhatMergeWithoutStores merges the same
// writes into two stores, once with each task's encoding given
// (MergeItem.Encoding, as replicated writes are) and once without, and
// checks that both store the same states: the encoding is taken as is
// only for a task new to the replica and not joined with another write
// of the same batch.
func TestMergeWithEncodingsStoresWhatMergeWithoutStores(t *testing.T) {
	plain, _ := memStore(t)
	given, _ := memStore(t)
	stored := newTask(7, "q", 0)
	mustMerge(t, plain, 0, stored)
	mustMerge(t, given, 0, stored)
	update := func(id, seq uint64) *crdt.Task {
		return &crdt.Task{ID: id, Updates: []crdt.Update{{Claim: 1, Seq: seq, Progress: 0.5}}}
	}
	batch := []*crdt.Task{
		newTask(5, "q", 1), // new
		update(5, 1),       // joins the one above
		newTask(6, "r", 2), // new, alone
		update(7, 1),       // joins the stored state
		cancelOf(8, t0),    // new, terminal, no spec
		{ID: 9, Spec: &crdt.Spec{Queue: "q", NotBeforeMs: t0 + 60_000, CreatedAt: crdt.Timestamp{WallMs: t0}}}, // new, delayed
	}
	items := make([]MergeItem, len(batch))
	for i, x := range batch {
		items[i] = MergeItem{Partition: 0, Task: x, Encoding: x.Encode()}
	}
	want := mustMerge(t, plain, 0, batch...)
	got, err := given.MergeTasks(items)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("results with encodings %+v, without %+v", got, want)
	}
	for _, id := range []uint64{5, 6, 7, 8, 9} {
		a, err := plain.GetTask(0, id)
		if err != nil {
			t.Fatal(err)
		}
		b, err := given.GetTask(0, id)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.Task.Encode(), b.Task.Encode()) || a.Digest != b.Digest || a.Index != b.Index {
			t.Errorf("task %d: stored with encodings %+v (digest %x, index %v), without %+v (digest %x, index %v)",
				id, b.Task, b.Digest, b.Index, a.Task, a.Digest, a.Index)
		}
	}
	checkIndexes(t, given, 0)
}
