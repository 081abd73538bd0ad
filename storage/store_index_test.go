package storage

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/crdt"
)

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
// against a brute-force model; then it reopens the store and checks the
// ready index built from the stored keys against the same model.
func TestReadyHeadMatchesModel(t *testing.T) {
	fs := vfs.NewMem()
	s, _ := openTestStore(t, fs, "db")
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
	close(stop)
	wg.Wait()
	stop = make(chan struct{})

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, _ = openTestStore(t, fs, "db")
	if got, want := headIDs(t, s, 0, "q", len(ready)+1), modelHead(len(ready)+1); !slices.Equal(got, want) {
		t.Fatalf("after reopening: head %v, model %v", got, want)
	}
	checkIndexes(t, s, 0)
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
