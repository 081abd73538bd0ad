package storage

import (
	"bytes"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/crdt"
)

// scanQueue pages through queue in partition p with ScanQueue, limit
// tasks a page, and returns the ids in the order listed.
func scanQueue(t testing.TB, s *Store, p uint16, queue string, limit int) []uint64 {
	t.Helper()
	var ids []uint64
	for start, pages := uint64(0), 0; ; pages++ {
		page, next, more, err := s.ScanQueue(p, queue, start, limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > limit || (more && len(page) != limit) || pages > 10_000 {
			t.Fatalf("queue %q: a page of %d tasks with limit %d, more=%v", queue, len(page), limit, more)
		}
		for _, st := range page {
			if st.Partition != p || st.Task.Spec == nil || st.Task.Spec.Queue != queue || st.Task.ID < start {
				t.Fatalf("queue %q from %d: listed %+v", queue, start, st.Task)
			}
			ids = append(ids, st.Task.ID)
		}
		if !more {
			return ids
		}
		if next <= start {
			t.Fatalf("queue %q: next %d after start %d", queue, next, start)
		}
		start = next
	}
}

// The queue index lists each queue's tasks of a partition, in id order,
// in pages, and no other queue's or partition's; a task known only by a
// cancel is not in it until its spec arrives; deleted tasks (DeleteTasks,
// retention) and a dropped partition leave it.
func TestQueueIndex(t *testing.T) {
	s, _ := memStore(t)
	for id := uint64(1); id <= 60; id++ {
		q := "big"
		if id%20 == 0 {
			q = "small"
		}
		mustMerge(t, s, 1, newTask(id, q, int32(id%3)))
	}
	mustMerge(t, s, 0, newTask(100, "small", 0))
	mustMerge(t, s, 2, newTask(200, "small", 0))
	for _, limit := range []int{1, 7, 100} {
		if got, want := scanQueue(t, s, 1, "small", limit), []uint64{20, 40, 60}; !slices.Equal(got, want) {
			t.Fatalf("small, %d a page: %v, want %v", limit, got, want)
		}
		got := scanQueue(t, s, 1, "big", limit)
		if len(got) != 57 || !slices.IsSorted(got) || slices.Contains(got, 20) {
			t.Fatalf("big, %d a page: %v", limit, got)
		}
	}
	if got := scanQueue(t, s, 1, "none", 10); len(got) != 0 {
		t.Fatalf("a queue without tasks: %v", got)
	}
	// A prefix of a queue's name is another queue.
	if got := scanQueue(t, s, 1, "bi", 10); len(got) != 0 {
		t.Fatalf("queue bi: %v", got)
	}
	// From the middle.
	if page, next, more, err := s.ScanQueue(1, "small", 21, 1); err != nil || len(page) != 1 || page[0].Task.ID != 40 || !more || next != 60 {
		t.Fatalf("small from 21: %v next %d more %v, %v", page, next, more, err)
	}

	// A cancel before its enqueue: stored, not indexed; then the spec.
	mustMerge(t, s, 1, cancelOf(61, t0))
	checkIndexes(t, s, 1)
	if got := scanQueue(t, s, 1, "small", 10); slices.Contains(got, 61) {
		t.Fatalf("a task without a spec listed: %v", got)
	}
	mustMerge(t, s, 1, newTask(61, "small", 0))
	if got, want := scanQueue(t, s, 1, "small", 10), []uint64{20, 40, 60, 61}; !slices.Equal(got, want) {
		t.Fatalf("after the spec arrived: %v, want %v", got, want)
	}
	// Later events of an indexed task write no key (the queue is written
	// once).
	mustMerge(t, s, 1, &crdt.Task{ID: 20, Updates: []crdt.Update{{Claim: 1, Seq: 1, Progress: 0.5}}})
	checkIndexes(t, s, 1)

	// DeleteTasks and retention delete the key with the task.
	if err := s.DeleteTasks(1, []uint64{40, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if got, want := scanQueue(t, s, 1, "small", 10), []uint64{20, 60, 61}; !slices.Equal(got, want) {
		t.Fatalf("after DeleteTasks: %v, want %v", got, want)
	}
	mustMerge(t, s, 1, cancelOf(60, t0+10), cancelOf(4, t0+10))
	if n, err := s.DeleteTerminalBefore(1, t0+100, 10, nil); err != nil || n != 3 { // 60, 4 and 61
		t.Fatalf("retention deleted %d, %v", n, err)
	}
	if got, want := scanQueue(t, s, 1, "small", 10), []uint64{20}; !slices.Equal(got, want) {
		t.Fatalf("after retention: %v, want %v", got, want)
	}
	if got := scanQueue(t, s, 1, "big", 100); len(got) != 54 || slices.ContainsFunc(got, func(id uint64) bool { return id >= 2 && id <= 4 }) {
		t.Fatalf("big after deletions: %v", got)
	}
	checkIndexes(t, s, 1)

	// A dropped partition's index goes with it; its neighbours keep theirs.
	if err := s.DropPartition(1); err != nil {
		t.Fatal(err)
	}
	if got := scanQueue(t, s, 1, "big", 100); len(got) != 0 {
		t.Fatalf("dropped partition: %v", got)
	}
	for p, id := range map[uint16]uint64{0: 100, 2: 200} {
		if got := scanQueue(t, s, p, "small", 10); !slices.Equal(got, []uint64{id}) {
			t.Fatalf("partition %d after the drop of 1: %v", p, got)
		}
		checkIndexes(t, s, p)
	}
	if _, _, _, err := s.ScanQueue(0, "small", 0, 0); err == nil {
		t.Fatal("ScanQueue took limit 0")
	}
}

// Two replicas holding different specs of one id (corruption that the
// join resolves): the key follows the winning spec's queue.
func TestQueueIndexFollowsSpecConflict(t *testing.T) {
	s, _ := memStore(t)
	a, b := newTask(9, "q", 1), newTask(9, "other", 5)
	j, _, _ := crdt.Join(a, b)
	loser := a
	if j.Spec.Queue == "q" {
		loser = b
	}
	mustMerge(t, s, 0, loser)
	if got := scanQueue(t, s, 0, loser.Spec.Queue, 10); !slices.Equal(got, []uint64{9}) {
		t.Fatalf("before the conflict: %v", got)
	}
	mustMerge(t, s, 0, a, b)
	if got := scanQueue(t, s, 0, loser.Spec.Queue, 10); len(got) != 0 {
		t.Fatalf("the losing spec's queue still lists the task: %v", got)
	}
	if got := scanQueue(t, s, 0, j.Spec.Queue, 10); !slices.Equal(got, []uint64{9}) {
		t.Fatalf("the winning spec's queue: %v", got)
	}
	checkIndexes(t, s, 0)
}

// An index key whose task is missing, or of another queue, is ErrCorrupt,
// not a silent skip.
func TestScanQueueCorrupt(t *testing.T) {
	for _, c := range []struct {
		name string
		key  []byte
	}{
		{"no task", queueIndexKey(0, "q", 5)},
		{"another queue", queueIndexKey(0, "q", 2)},
		{"short key", append(queueIndexPrefix(0, "q"), 1, 2)},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := memStore(t)
			mustMerge(t, s, 0, newTask(1, "q", 0), newTask(2, "r", 0))
			if err := s.db.Set(c.key, nil, pebble.Sync); err != nil {
				t.Fatal(err)
			}
			if _, _, _, err := s.ScanQueue(0, "q", 0, 10); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v, want ErrCorrupt", err)
			}
		})
	}
}

// Opening a store of format 5 (no queue index) builds the index from the
// stored tasks: every task with a spec, in every partition, and no task
// known only by a cancel.
func TestUpgradeBuildsQueueIndex(t *testing.T) {
	fs := vfs.NewMem()
	s, _ := openTestStore(t, fs, "db")
	want := map[uint16]map[string][]uint64{}
	for p := range uint16(3) {
		want[p] = map[string][]uint64{}
		for i := range 50 {
			id := uint64(p)*1000 + uint64(i) + 1
			q := []string{"a", "b", "c"}[i%3]
			mustMerge(t, s, p, newTask(id, q, 0))
			want[p][q] = append(want[p][q], id)
		}
		mustMerge(t, s, p, cancelOf(uint64(p)*1000+999, t0)) // no spec
		mustMerge(t, s, p, cancelOf(uint64(p)*1000+1, t0))   // terminal: still listed
	}
	// Make it a format 5 store: no queue index keys, the old version.
	for p := range uint16(3) {
		lo, hi := tagSpan(p, tagQueue)
		if err := s.db.DeleteRange(lo, hi, pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if got := scanQueue(t, s, p, "a", 100); len(got) != 0 {
			t.Fatalf("partition %d: queue a after deleting the index: %v", p, got)
		}
	}
	if err := s.db.Set(formatKey, []byte{0, 0, 0, 5}, pebble.Sync); err != nil {
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
	if !strings.Contains(logged.String(), `msg="built the queue index (store format 6)" tasks=150 `) {
		t.Fatalf("the upgrade logged %q", logged.String())
	}
	for p := range uint16(3) {
		checkIndexes(t, s2, p) // every task with a spec indexed, nothing else
		checkCounts(t, s2, p)
		for q, ids := range want[p] {
			if got := scanQueue(t, s2, p, q, 7); !slices.Equal(got, ids) {
				t.Fatalf("partition %d queue %s after the upgrade: %v, want %v", p, q, got, ids)
			}
		}
	}
	v, err := s2.get(formatKey)
	if err != nil || len(v) != 4 || v[3] != formatVersion || formatVersion != 7 {
		t.Fatalf("format key %x, %v", v, err)
	}
}

// The upgrade's progress callback and count: buildQueueIndex commits in
// batches and reports the tasks indexed after each.
func TestBuildQueueIndexProgress(t *testing.T) {
	s, _ := memStore(t)
	const n = 40_000
	items := make([]MergeItem, 0, n)
	for id := uint64(1); id <= n; id++ {
		items = append(items, MergeItem{Partition: 3, Task: &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: "q"}}})
	}
	if _, err := s.MergeTasks(items); err != nil {
		t.Fatal(err)
	}
	var reports []int
	got, err := s.buildQueueIndex(3, func(n int) { reports = append(reports, n) })
	if err != nil || got != n {
		t.Fatalf("indexed %d, %v", got, err)
	}
	if len(reports) < 3 || reports[len(reports)-1] != n || !slices.IsSorted(reports) {
		t.Fatalf("progress %v", reports)
	}
	if ids := scanQueue(t, s, 3, "q", 1000); len(ids) != n {
		t.Fatalf("listed %d of %d", len(ids), n)
	}
}
