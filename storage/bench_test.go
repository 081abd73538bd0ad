package storage

import (
	"fmt"
	"sync/atomic"
	"testing"

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
