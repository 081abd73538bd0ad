package storage

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/norn-dev/norn/crdt"
)

// BenchmarkMergeTask measures synced MergeTask on a real disk with 1 and 64
// concurrent writers, each merging new 100-byte tasks. Group commit should
// make 64 writers many times faster than one.
func BenchmarkMergeTask(b *testing.B) {
	for _, writers := range []int{1, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			s, _ := openTestStore(b, nil, b.TempDir())
			var next atomic.Uint64
			payload := make([]byte, 100)
			b.ResetTimer()
			runConcurrent(b, writers, func() {
				id := next.Add(1)
				t := &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: "bench", Payload: payload}}
				if _, err := s.MergeTask(uint16(id%64), t); err != nil {
					b.Error(err)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

// runConcurrent runs op b.N times in total from n goroutines.
func runConcurrent(b *testing.B, n int, op func()) {
	var left atomic.Int64
	left.Store(int64(b.N))
	done := make(chan struct{})
	for range n {
		go func() {
			defer func() { done <- struct{}{} }()
			for left.Add(-1) >= 0 {
				op()
			}
		}()
	}
	for range n {
		<-done
	}
}

// BenchmarkReadyHead measures reading a queue's head (the in-memory ready
// index) with 10k and 1M tasks in one queue, and with 1M after the first
// 100k heads were claimed.
func BenchmarkReadyHead(b *testing.B) {
	cases := []struct {
		name          string
		tasks, remove int
	}{
		{"tasks=10k", 10_000, 0},
		{"tasks=1M", 1_000_000, 0},
		{"tasks=1M/removed=100k", 1_000_000, 100_000},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			s, _ := openTestStore(b, nil, b.TempDir())
			const batch = 2000
			payload := make([]byte, 64)
			for i := 0; i < c.tasks; i += batch {
				items := make([]MergeItem, 0, batch)
				for j := i; j < min(i+batch, c.tasks); j++ {
					items = append(items, MergeItem{Task: &crdt.Task{ID: uint64(j + 1),
						Spec: &crdt.Spec{Queue: "q", Payload: payload}}})
				}
				if _, err := s.MergeTasks(items); err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; i < c.remove; i += batch {
				marks := make([]ClaimMark, 0, batch)
				for j := i; j < min(i+batch, c.remove); j++ {
					marks = append(marks, ClaimMark{ID: uint64(j + 1), ExpiryMs: t0})
				}
				if err := s.MarkClaimed(0, marks); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				h, err := s.ReadyHead(0, "q", 1)
				if err != nil || len(h) != 1 || h[0].ID != uint64(c.remove+1) {
					b.Fatalf("head %v, %v", h, err)
				}
			}
		})
	}
}

// BenchmarkMergeTasksBatch measures MergeTasks with batches of new tasks
// spread over 64 partitions, as a replica receives them from the enqueue
// path (ids growing like sonyflake's), one writer: its time per task is
// the CPU a replica spends on storing one enqueued task, the fsync shared
// by the batch. The store keeps growing across iterations, so memtable
// inserts and flushes are measured as the benchmark runs.
func BenchmarkMergeTasksBatch(b *testing.B) {
	for _, size := range []int{16, 256} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			s, _ := openTestStore(b, nil, b.TempDir())
			// As on a node: anti-entropy follows every partition's digests.
			for p := range uint16(64) {
				if err := s.TrackDigests(p, nopDigestSink{}); err != nil {
					b.Fatal(err)
				}
			}
			payload := make([]byte, 64)
			id := uint64(1) << 40
			items := make([]MergeItem, 0, size)
			b.ResetTimer()
			for n := 0; n < b.N; {
				items = items[:0]
				for range min(size, b.N-n) {
					id += 7
					items = append(items, MergeItem{Partition: uint16(id % 64), Task: &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: "bench", Payload: payload}}})
				}
				if _, err := s.MergeTasks(items); err != nil {
					b.Fatal(err)
				}
				n += len(items)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}

// nopDigestSink is a DigestSink that drops the changes.
type nopDigestSink struct{}

func (nopDigestSink) DigestChanged(uint16, uint64, uint64, bool, uint64, bool) {}

// BenchmarkListSmallQueue measures finding the 10 tasks of queue small in
// a partition that also holds 200,000 tasks of queue big (small's ids
// spread among big's): through the queue index (ScanQueue, what a
// ListTasks page with a queue filter reads), and by scanning every task
// of the partition and keeping small's (ScanTasks, how a page found them
// before the index, when it did: it stopped after 10,000 tasks). On a
// real disk, with the node's default block cache.
func BenchmarkListSmallQueue(b *testing.B) {
	s, err := Open(Config{Dir: b.TempDir()}) // the default cache, 64 MiB, as a node's
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	const big, small = 200_000, 10
	items := make([]MergeItem, 0, 2000)
	payload := make([]byte, 64)
	for id := uint64(1); id <= big+small; id++ {
		q := "big"
		if id%((big+small)/small) == 0 {
			q = "small"
		}
		items = append(items, MergeItem{Partition: 0, Task: &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: q, Payload: payload}}})
		if len(items) == cap(items) || id == big+small {
			if _, err := s.MergeTasks(items); err != nil {
				b.Fatal(err)
			}
			items = items[:0]
		}
	}
	b.Run("index", func(b *testing.B) {
		for b.Loop() {
			page, _, more, err := s.ScanQueue(0, "small", 0, 256)
			if err != nil || len(page) != small || more {
				b.Fatalf("%d tasks, more %v, %v", len(page), more, err)
			}
		}
	})
	b.Run("scan", func(b *testing.B) {
		for b.Loop() {
			found := 0
			for start, more := uint64(0), true; more; {
				var page []*StoredTask
				var err error
				page, start, more, err = s.ScanTasks(0, start, 256)
				if err != nil {
					b.Fatal(err)
				}
				for _, st := range page {
					if st.Task.Spec.Queue == "small" {
						found++
					}
				}
			}
			if found != small {
				b.Fatalf("found %d", found)
			}
		}
	})
}

// BenchmarkUpgradeQueueIndex measures the format 6 upgrade at Open of a
// store of 1,000,000 tasks (in 64 partitions) written without the queue
// index: each iteration deletes the index, marks the store format 5 and
// reopens it, the open timed (the upgrade and the in-memory indexes
// every Open builds). BenchmarkReopen is the same open without the
// upgrade; the difference is the upgrade's time.
func BenchmarkUpgradeQueueIndex(b *testing.B) { benchReopen(b, true) }

// BenchmarkReopen measures Open of the store of BenchmarkUpgradeQueueIndex
// without an upgrade.
func BenchmarkReopen(b *testing.B) { benchReopen(b, false) }

func benchReopen(b *testing.B, upgrade bool) {
	const tasks, parts = 1_000_000, 64
	dir := b.TempDir()
	s, _ := openTestStore(b, nil, dir)
	items := make([]MergeItem, 0, 4096)
	payload := make([]byte, 64)
	for id := uint64(1); id <= tasks; id++ {
		items = append(items, MergeItem{Partition: uint16(id % parts), Task: &crdt.Task{ID: id,
			Spec: &crdt.Spec{Queue: fmt.Sprint("q", id%8), Payload: payload}}})
		if len(items) == cap(items) || id == tasks {
			if _, err := s.MergeTasks(items); err != nil {
				b.Fatal(err)
			}
			items = items[:0]
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		s, err := Open(Config{Dir: dir, CacheBytes: 64 << 20})
		if err != nil {
			b.Fatal(err)
		}
		if upgrade {
			for p := range uint16(parts) {
				lo, hi := tagSpan(p, tagQueue)
				if err := s.db.DeleteRange(lo, hi, pebble.NoSync); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.db.Set(formatKey, []byte{0, 0, 0, 5}, pebble.NoSync); err != nil {
				b.Fatal(err)
			}
		}
		// Compacted, so that the open reads no tombstones of an earlier
		// round.
		if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff, 0xff, 0xff, 0xff}, true); err != nil {
			b.Fatal(err)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if s, err = Open(Config{Dir: dir, CacheBytes: 64 << 20}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/tasks, "ns/task")
}

// BenchmarkReadyListKeys measures a claim's work on the ready index of
// one queue and priority holding 200,000 tasks over 1, 10 and 100,000
// fairness keys: read the head (4 entries, as a claim's first read) and
// take the first, then put a task back at the end (the queue stays as
// full). The cost must not grow with the keys (docs/SCHEDULING.md, "Fair
// claims").
func BenchmarkReadyListKeys(b *testing.B) {
	for _, keys := range []int{1, 10, 100_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			var l readyList
			const tasks = 200_000
			next := uint64(1)
			names := make([]string, keys)
			for i := range names {
				names[i] = fmt.Sprintf("tenant-%d", i)
			}
			key := func(i uint64) string { return names[i%uint64(keys)] }
			for ; next <= tasks; next++ {
				l.insert(ReadyEntry{ID: next, Key: key(next), Weight: 1})
			}
			b.ReportAllocs()
			var out []ReadyEntry
			for b.Loop() {
				out = l.head(4, out[:0])
				l.remove(out[0])
				l.insert(ReadyEntry{ID: next, Key: key(next), Weight: 1})
				next++
			}
		})
	}
}
