package storage

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
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

func TestReadyOrderAndQueueIsolation(t *testing.T) {
	s, _ := memStore(t)
	r := rand.New(rand.NewPCG(1, 1))
	type entry struct {
		id   uint64
		prio int32
	}
	var want []entry
	var tasks []*crdt.Task
	for range 300 {
		e := entry{r.Uint64N(1 << 40), r.Int32N(7) - 3}
		if r.IntN(10) == 0 {
			e.prio = []int32{-1 << 31, 1<<31 - 1}[r.IntN(2)]
		}
		want = append(want, e)
		tasks = append(tasks, newTask(e.id, "a", e.prio))
	}
	// Neighbouring queue names must not leak into "a".
	tasks = append(tasks, newTask(1, "ab", 100), newTask(2, "a-", 100))
	mustMerge(t, s, 1, tasks...)
	slices.SortFunc(want, func(x, y entry) int {
		if c := cmp.Compare(y.prio, x.prio); c != 0 {
			return c
		}
		return cmp.Compare(x.id, y.id)
	})
	head, err := s.ReadyHead(1, "a", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(head) != len(want) {
		t.Fatalf("%d ready, want %d", len(head), len(want))
	}
	for i := range want {
		if head[i].ID != want[i].id || head[i].Priority != want[i].prio {
			t.Fatalf("position %d: got %+v, want %+v", i, head[i], want[i])
		}
	}
}

// TestReadyHeadMatchesModel drives random inserts, claims of the head,
// releases and cancels, concurrently with head reads, and checks every head
// against a brute-force model: the head cache must never skip a live task
// nor keep a removed one. A tiny cache exercises refills and trimming.
func TestReadyHeadMatchesModel(t *testing.T) {
	for _, cacheLen := range []int{2, defaultHeadCacheLen} {
		t.Run(fmt.Sprint("cache=", cacheLen), func(t *testing.T) { testReadyHeadModel(t, cacheLen) })
	}
}

func testReadyHeadModel(t *testing.T, cacheLen int) {
	s, _ := memStore(t)
	s.headCacheLen = cacheLen
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 2))
	defer func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	}()
	ready := map[uint64]int32{}
	claimed := map[uint64]bool{}
	next := uint64(1)
	modelHead := func(n int) []uint64 {
		ids := make([]uint64, 0, len(ready))
		for id := range ready {
			ids = append(ids, id)
		}
		slices.SortFunc(ids, func(a, b uint64) int {
			if c := cmp.Compare(ready[b], ready[a]); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		return ids[:min(n, len(ids))]
	}
	// A concurrent reader keeps refilling the cache while the writer works.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				if _, err := s.ReadyHead(0, "q", 3); err != nil {
					t.Error(err)
					return
				}
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	for step := range 2000 {
		switch op := r.IntN(10); {
		case op < 4: // enqueue, sometimes ahead of the current head
			prio := r.Int32N(3)
			mustMerge(t, s, 0, newTask(next, "q", prio))
			ready[next] = prio
			next++
		case op < 7: // claim the head
			h := modelHead(1)
			if len(h) == 0 {
				continue
			}
			if err := s.MarkClaimed(0, []ClaimMark{{ID: h[0], ExpiryMs: t0 + int64(step)}}); err != nil {
				t.Fatal(err)
			}
			claimed[h[0]] = true
			delete(ready, h[0])
		case op < 9: // release a claimed task (its key is back among the cached heads)
			for id := range claimed {
				if err := s.ReleaseClaims(0, []uint64{id}); err != nil {
					t.Fatal(err)
				}
				delete(claimed, id)
				st, _ := s.GetTask(0, id)
				ready[id] = st.Task.Spec.Priority
				break
			}
		default: // cancel a random ready task
			for id := range ready {
				mustMerge(t, s, 0, cancelOf(id, t0))
				delete(ready, id)
				break
			}
		}
		if got, want := headIDs(t, s, 0, "q", 5), modelHead(5); !slices.Equal(got, want) {
			t.Fatalf("step %d: head %v, model %v", step, got, want)
		}
	}
	checkIndexes(t, s, 0)
}

// TestReadyHeadRefillRace inserts a task while a head-cache refill is
// between its Pebble read and installing the result: the refill must not
// install a cache that misses the new task.
func TestReadyHeadRefillRace(t *testing.T) {
	s, _ := memStore(t)
	mustMerge(t, s, 0, newTask(10, "q", 0))
	s.testHookRefillRead = func() {
		s.testHookRefillRead = nil
		mustMerge(t, s, 0, newTask(5, "q", 9))
	}
	if got := headIDs(t, s, 0, "q", 5); !slices.Equal(got, []uint64{10}) {
		t.Fatalf("racing read = %v, want what it read before the insert", got)
	}
	if got := headIDs(t, s, 0, "q", 5); !slices.Equal(got, []uint64{5, 10}) {
		t.Fatalf("head after the race = %v, want [5 10]", got)
	}
}

func TestDelayedIndexAndPromotion(t *testing.T) {
	s, clk := memStore(t)
	later := newTask(1, "q", 0)
	later.Spec.NotBeforeMs = t0 + 1000
	past := newTask(2, "q", 0)
	past.Spec.NotBeforeMs = t0 - 1000
	mustMerge(t, s, 0, later, past)
	if got := headIDs(t, s, 0, "q", 10); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("ready = %v, want only the task whose time has come", got)
	}
	due, _ := s.DelayedDue(0, t0+999, 10)
	if len(due) != 0 {
		t.Fatalf("due early: %v", due)
	}
	due, _ = s.DelayedDue(0, t0+1000, 10)
	if len(due) != 1 || due[0] != (DueEntry{ID: 1, AtMs: t0 + 1000}) {
		t.Fatalf("due = %v", due)
	}
	if n, _ := s.PromoteDelayed(0, 10); n != 0 {
		t.Fatalf("promoted %d before its time", n)
	}
	clk.set(t0 + 1000)
	if n, err := s.PromoteDelayed(0, 10); n != 1 || err != nil {
		t.Fatalf("promoted %d, %v", n, err)
	}
	if got := headIDs(t, s, 0, "q", 10); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("ready = %v", got)
	}
	checkIndexes(t, s, 0)
}

func TestClaimedIndex(t *testing.T) {
	s, _ := memStore(t)
	mustMerge(t, s, 0, newTask(1, "q", 0), newTask(2, "q", 0), newTask(3, "q", 0))
	if err := s.MarkClaimed(0, []ClaimMark{{1, t0 + 100}, {2, t0 + 50}}); err != nil {
		t.Fatal(err)
	}
	if got := headIDs(t, s, 0, "q", 10); !slices.Equal(got, []uint64{3}) {
		t.Fatalf("ready = %v", got)
	}
	due, _ := s.ClaimsExpiring(0, t0+100, 10)
	if len(due) != 2 || due[0].ID != 2 || due[1].ID != 1 {
		t.Fatalf("expiring = %v, want 2 then 1", due)
	}
	// Renewal moves the entry within the claimed index.
	if err := s.MarkClaimed(0, []ClaimMark{{2, t0 + 500}}); err != nil {
		t.Fatal(err)
	}
	if due, _ = s.ClaimsExpiring(0, t0+100, 10); len(due) != 1 || due[0].ID != 1 {
		t.Fatalf("after renew, expiring = %v", due)
	}
	// A terminal event leaves the claim to the FSM: still claimed, and
	// released to no index.
	mustMerge(t, s, 0, &crdt.Task{ID: 1, Terminals: []crdt.Terminal{{At: crdt.Timestamp{WallMs: t0}, Kind: crdt.Completed, Claim: 9}}})
	if due, _ = s.ClaimsExpiring(0, t0+1000, 10); len(due) != 2 {
		t.Fatalf("after complete, expiring = %v, want the claim kept", due)
	}
	if err := s.ReleaseClaims(0, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.GetTask(0, 1); st.Index != IndexNone {
		t.Fatalf("released completed task is in index %v", st.Index)
	}
	// A claim of a task this replica has not seen is recorded (the FSM
	// decides), and its release leaves nothing behind.
	if err := s.MarkClaimed(0, []ClaimMark{{99, t0}}); err != nil {
		t.Fatal(err)
	}
	if due, _ = s.ClaimsExpiring(0, t0, 10); len(due) != 1 || due[0].ID != 99 {
		t.Fatalf("claim of an absent task not indexed: %v", due)
	}
	if _, err := s.GetTask(0, 99); !errors.Is(err, ErrNotFound) {
		t.Fatalf("absent task: %v", err)
	}
	if err := s.ReleaseClaims(0, []uint64{99}); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := s.getMeta(0, 99); found {
		t.Fatalf("meta of an absent task left after release")
	}
	// Release: back to ready, idempotently.
	for range 2 {
		if err := s.ReleaseClaims(0, []uint64{2}); err != nil {
			t.Fatal(err)
		}
	}
	if got := headIDs(t, s, 0, "q", 10); !slices.Equal(got, []uint64{2, 3}) {
		t.Fatalf("ready = %v", got)
	}
	// A merge while claimed keeps the claim.
	if err := s.MarkClaimed(0, []ClaimMark{{3, t0 + 7}}); err != nil {
		t.Fatal(err)
	}
	mustMerge(t, s, 0, &crdt.Task{ID: 3, Updates: []crdt.Update{{Claim: 4, Seq: 1, Progress: 0.5}}})
	if st, _ := s.GetTask(0, 3); st.Index != IndexClaimed || st.ExpiryMs != t0+7 {
		t.Fatalf("update moved a claimed task: %+v", st)
	}
	checkIndexes(t, s, 0)
}

func TestScanTasksPagesAndDropPartition(t *testing.T) {
	s, _ := memStore(t)
	var ids []uint64
	for i := range 25 {
		id := uint64(i*7 + 1)
		ids = append(ids, id)
		mustMerge(t, s, 2, newTask(id, "q", 0))
	}
	mustMerge(t, s, 1, newTask(1000, "q", 0))
	mustMerge(t, s, 3, newTask(2000, "q", 0))
	var got []uint64
	start, pages := uint64(0), 0
	for {
		page, next, more, err := s.ScanTasks(2, start, 10)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, st := range page {
			got = append(got, st.Task.ID)
		}
		if !more {
			break
		}
		start = next
	}
	if !slices.Equal(got, ids) || pages != 3 {
		t.Fatalf("scanned %v in %d pages", got, pages)
	}
	if err := s.DropPartition(2); err != nil {
		t.Fatal(err)
	}
	if page, _, _, _ := s.ScanTasks(2, 0, 10); len(page) != 0 {
		t.Fatalf("partition 2 not dropped: %d tasks", len(page))
	}
	if h := headIDs(t, s, 2, "q", 10); len(h) != 0 {
		t.Fatalf("ready index of a dropped partition: %v", h)
	}
	for p, id := range map[uint16]uint64{1: 1000, 3: 2000} {
		if _, err := s.GetTask(p, id); err != nil {
			t.Fatalf("neighbour partition %d lost task: %v", p, err)
		}
		checkIndexes(t, s, p)
	}
}

func TestSegmentIndex(t *testing.T) {
	s, _ := memStore(t)
	want := map[uint64]uint64{}
	for i := range 50 {
		res := mustMerge(t, s, 0, newTask(uint64(i+1), "q", 0))
		want[uint64(i+1)] = res[0].NewDigest
	}
	res := mustMerge(t, s, 0, cancelOf(3, t0))
	want[3] = res[0].NewDigest
	got := map[uint64]uint64{}
	prev := -1
	err := s.ScanSegments(0, 0, 1<<16, func(seg uint16, e SegmentEntry) error {
		if int(seg) < prev || seg != Segment(e.ID) {
			return fmt.Errorf("entry %d in segment %d out of order or misplaced", e.ID, seg)
		}
		prev = int(seg)
		got[e.ID] = e.Digest
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("segment index %v, want %v", got, want)
	}
	// A sub-range returns exactly the ids in it.
	n := 0
	_ = s.ScanSegments(0, 0, 1<<15, func(seg uint16, _ SegmentEntry) error {
		if seg >= 1<<15 {
			t.Errorf("segment %d outside [0, 32768)", seg)
		}
		n++
		return nil
	})
	if n == 0 || n == len(want) {
		t.Fatalf("half-range scan saw %d of %d entries", n, len(want))
	}
}

func TestCorruptValuesGiveErrors(t *testing.T) {
	s, _ := memStore(t)
	mustMerge(t, s, 0, newTask(1, "q", 0), newTask(2, "q", 0))
	if err := s.db.Set(taskKey(0, 1), []byte{1, 2, 3}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Set(metaKey(0, 2), []byte{7}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint64{1, 2} {
		_, err := s.GetTask(0, id)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "key ") {
			t.Fatalf("task %d: err = %v, want ErrCorrupt naming the key", id, err)
		}
	}
	if _, err := s.MergeTask(0, newTask(1, "q", 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("merge into corrupt state: %v", err)
	}
	if _, _, _, err := s.ScanTasks(0, 0, 10); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("scan over corrupt state: %v", err)
	}
	// The corrupt value is left as it was: nothing overwrote it.
	v, _ := s.get(taskKey(0, 1))
	if !bytes.Equal(v, []byte{1, 2, 3}) {
		t.Fatalf("corrupt value was overwritten: %x", v)
	}
}

// TestCrashKeepsAckedWrites runs Pebble on a crashable filesystem and
// crashes it (unsynced data dropped at random) twice: right after a burst of
// concurrent acked merges, and after acked claims with unsynced writes in
// flight. Every acked write must survive each crash, and the indexes must
// agree with the tasks.
func TestCrashKeepsAckedWrites(t *testing.T) {
	for round := range 3 {
		t.Run(fmt.Sprint("round", round), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			s, _ := openTestStore(t, fs, "db")
			r := rand.New(rand.NewPCG(uint64(round), 3))
			crash := func() vfs.FS {
				return fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(r.Uint64(), 4))})
			}
			acked := map[uint64]uint64{} // id -> digest
			var mu sync.Mutex
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Go(func() {
					for i := range 50 {
						id := uint64(w*1000 + i + 1)
						res, err := s.MergeTask(uint16(id%4), newTask(id, "q", int32(i%3)))
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						acked[id] = res.NewDigest
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			afterMerges := crash()
			checkCrashed(t, afterMerges, "db", acked, nil)

			claimed := map[uint64]int64{}
			for id := range acked {
				if r.IntN(4) == 0 {
					exp := t0 + int64(r.IntN(1000))
					if err := s.MarkClaimed(uint16(id%4), []ClaimMark{{id, exp}}); err != nil {
						t.Fatal(err)
					}
					claimed[id] = exp
				}
			}
			// Unsynced work in flight at the crash: may or may not survive.
			// They are whole merges (task and indexes in one batch, as
			// prepareMerge builds them) committed without a sync: a
			// background WAL sync may keep any of them, and then they must
			// be consistent too.
			for i := range 20 {
				id := uint64(90000 + i)
				_, b, _, _, err := s.prepareMerge([]MergeItem{{Partition: uint16(id % 4), Task: newTask(id, "q", 0)}})
				if err != nil {
					t.Fatal(err)
				}
				_ = b.Commit(pebble.NoSync)
				b.Close()
			}
			checkCrashed(t, crash(), "db", acked, claimed)
		})
	}
}

// checkCrashed opens the crashed store in dir on fs and checks that every
// acked task (and acked claim) is there and the indexes agree with the
// tasks.
func checkCrashed(t *testing.T, fs vfs.FS, dir string, acked map[uint64]uint64, claimed map[uint64]int64) {
	t.Helper()
	s, _ := openTestStore(t, fs, dir)
	defer func() { s.Close(); s.db = nil }()
	for id, dig := range acked {
		st, err := s.GetTask(uint16(id%4), id)
		if err != nil {
			t.Fatalf("acked task %d lost: %v", id, err)
		}
		if st.Digest != dig {
			t.Fatalf("task %d digest %x, acked %x", id, st.Digest, dig)
		}
		if exp, ok := claimed[id]; ok && (st.Index != IndexClaimed || st.ExpiryMs != exp) {
			t.Fatalf("task %d claim lost: %+v", id, st)
		}
	}
	for p := range uint16(4) {
		checkIndexes(t, s, p)
	}
}

// checkIndexes verifies that partition p's indexes agree with its tasks:
// every task has a meta entry, exactly the index entry its meta names, and
// no index holds an entry for a task that does not name it.
func checkIndexes(t testing.TB, s *Store, p uint16) {
	t.Helper()
	want := map[string]bool{}
	start := uint64(0)
	for {
		page, next, more, err := s.ScanTasks(p, start, 256)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range page {
			st, err := s.GetTask(p, x.Task.ID)
			if err != nil {
				t.Fatal(err)
			}
			if k := indexKey(p, st.Task.ID, meta{st.Index, st.ExpiryMs}, st.Task.Spec); k != nil {
				want[string(k)] = true
			}
			want[string(segmentKey(p, Segment(st.Task.ID), st.Task.ID))] = true
			if k := terminalKey(p, st.Task); k != nil {
				want[string(k)] = true
			}
			_, terminal := st.Task.Terminal()
			if unclaimable := terminal || st.Task.Spec == nil; st.Index != IndexClaimed && unclaimable != (st.Index == IndexNone) {
				t.Fatalf("task %d: index state %v, terminal=%v spec=%v", st.Task.ID, st.Index, terminal, st.Task.Spec != nil)
			}
		}
		if !more {
			break
		}
		start = next
	}
	for _, tag := range []byte{tagReady, tagDelayed, tagClaimed, tagSegment, tagTerminal} {
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
}

func TestRetentionIndexAndDelete(t *testing.T) {
	s, _ := memStore(t)
	mustMerge(t, s, 0, newTask(1, "q", 0), newTask(2, "q", 0), newTask(3, "q", 0))
	mustMerge(t, s, 0, cancelOf(1, t0+50), cancelOf(2, t0+10))
	due, _ := s.TerminalBefore(0, t0+20, 10)
	if len(due) != 1 || due[0] != (DueEntry{ID: 2, AtMs: t0 + 10}) {
		t.Fatalf("terminal before t0+20 = %v", due)
	}
	// An earlier terminal event arriving later moves the entry.
	mustMerge(t, s, 0, cancelOf(1, t0+5))
	if due, _ = s.TerminalBefore(0, t0+20, 10); len(due) != 2 || due[0].ID != 1 {
		t.Fatalf("after an earlier event arrived: %v", due)
	}
	if err := s.MarkClaimed(0, []ClaimMark{{3, t0}}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTasks(0, []uint64{1, 3, 99}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint64{1, 3} {
		if _, err := s.GetTask(0, id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("task %d after delete: %v", id, err)
		}
	}
	if due, _ = s.TerminalBefore(0, t0+100, 10); len(due) != 1 || due[0].ID != 2 {
		t.Fatalf("retention index after delete: %v", due)
	}
	if c, _ := s.ClaimsExpiring(0, t0+100, 10); len(c) != 0 {
		t.Fatalf("claimed index after delete: %v", c)
	}
	checkIndexes(t, s, 0)
}

// OnReady is called after commits that made tasks ready, once per
// partition and queue, and not for tasks that went elsewhere.
func TestOnReady(t *testing.T) {
	type pq struct {
		p     uint16
		queue string
	}
	var got []pq
	clk := &testClock{ms: t0}
	s, err := Open(Config{Dir: "db", FS: vfs.NewMem(), Clock: clk, CacheBytes: 8 << 20,
		OnReady: func(p uint16, queue string) { got = append(got, pq{p, queue}) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	expect := func(what string, want ...pq) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%s: OnReady calls %v, want %v", what, got, want)
		}
		got = nil
	}
	mustMerge(t, s, 0, newTask(1, "q", 0), newTask(2, "q", 1))
	expect("two ready tasks of one queue", pq{0, "q"})
	mustMerge(t, s, 3, newTask(3, "r", 0))
	expect("a ready task", pq{3, "r"})
	delayed := newTask(4, "d", 0)
	delayed.Spec.NotBeforeMs = t0 + 1000
	mustMerge(t, s, 0, delayed)
	expect("a delayed task")
	mustMerge(t, s, 0, cancelOf(1, t0))
	expect("a task leaving the ready index")
	mustMerge(t, s, 0, newTask(2, "q", 1))
	expect("a merge that changes nothing")
	clk.set(t0 + 1000)
	if n, err := s.PromoteDelayed(0, 10); n != 1 || err != nil {
		t.Fatalf("promoted %d, %v", n, err)
	}
	expect("a promotion", pq{0, "d"})
}
