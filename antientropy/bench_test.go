package antientropy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// benchDir holds the benchmarks' on-disk stores; TestMain removes it.
var benchDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if pair != nil {
		pair.a.store.Close()
		pair.b.store.Close()
	}
	if benchDir != "" {
		os.RemoveAll(benchDir)
	}
	os.Exit(code)
}

const (
	benchTasks    = 1_000_000
	benchBatch    = 10_000
	benchParts    = 64
	benchHorizon  = t0 - 7*24*3600*1000 // a week of retention: nothing expires
	benchLeafBits = DefaultLeafBits
)

// benchPair is two replicas holding the same benchTasks tasks in partition
// 0, on disk, with trees of DefaultLeafBits for partitions 0 to
// benchParts-1 (the others empty). ids are the tasks' ids.
type benchPair struct {
	a, b  *side
	ids   []uint64
	build time.Duration // writing both stores
	add   time.Duration // building one 1M-task tree from the index (Add)
}

var (
	pairOnce sync.Once
	pair     *benchPair
	pairErr  error
)

// openDiskSide opens a store under benchDir with the store's default
// cache, as a node runs it.
func openDiskSide(name string) (*side, error) {
	s, err := storage.Open(storage.Config{Dir: filepath.Join(benchDir, name), Clock: fixedClock{t0}})
	if err != nil {
		return nil, err
	}
	r, err := NewReplica(ReplicaConfig{Store: s, LeafBits: benchLeafBits, Horizon: func() int64 { return benchHorizon }})
	if err != nil {
		return nil, err
	}
	return &side{store: s, r: r, peer: newDirectPeer(r, s)}, nil
}

// benchTask is a small enqueued task (a 32-byte payload).
func benchTask(id uint64) *crdt.Task {
	return &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: "bench", Payload: make([]byte, 32),
		CreatedAt: crdt.Timestamp{WallMs: t0, Node: 1}}}
}

func buildPair() (*benchPair, error) {
	var err error
	if benchDir, err = os.MkdirTemp("", "norn-ae-bench-"); err != nil {
		return nil, err
	}
	p := &benchPair{}
	if p.a, err = openDiskSide("a"); err != nil {
		return nil, err
	}
	if p.b, err = openDiskSide("b"); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(1, 1))
	p.ids = make([]uint64, benchTasks)
	for i := range p.ids {
		p.ids[i] = rng.Uint64()
	}
	start := time.Now()
	errs := make(chan error, 2)
	for _, s := range []*side{p.a, p.b} {
		go func() {
			items := make([]storage.MergeItem, 0, benchBatch)
			for i, id := range p.ids {
				items = append(items, storage.MergeItem{Partition: 0, Task: benchTask(id)})
				if len(items) == benchBatch || i == len(p.ids)-1 {
					if _, err := s.store.MergeTasks(items); err != nil {
						errs <- err
						return
					}
					items = items[:0]
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			return nil, err
		}
	}
	p.build = time.Since(start)
	for _, s := range []*side{p.a, p.b} {
		start := time.Now()
		if err := s.r.Add(0); err != nil {
			return nil, err
		}
		p.add = time.Since(start)
		for part := uint16(1); part < benchParts; part++ {
			if err := s.r.Add(part); err != nil {
				return nil, err
			}
		}
	}
	if p.a.r.Tree(0).Root() != p.b.r.Tree(0).Root() {
		return nil, fmt.Errorf("the two replicas' roots differ after the build")
	}
	return p, nil
}

func getPair(b *testing.B) *benchPair {
	b.Helper()
	pairOnce.Do(func() { pair, pairErr = buildPair() })
	if pairErr != nil {
		b.Fatal(pairErr)
	}
	return pair
}

// BenchmarkExchange measures one exchange between two replicas of a
// partition of 1M tasks (on disk, DefaultLeafBits) with 0, 10 and 1,000
// tasks differing, half of them new tasks on the caller, half tasks the
// peer completed; and, roots equal, a round over 64 partitions. bytes/op
// is what went over the wire both ways (protobuf sizes); the time
// includes merging the transferred states on both sides (synced).
func BenchmarkExchange(b *testing.B) {
	p := getPair(b)
	b.Logf("setup: %d tasks written to each of two stores in %v; one tree built from the index (Add) in %v",
		benchTasks, p.build.Round(time.Millisecond), p.add.Round(time.Millisecond))
	rng := rand.New(rand.NewPCG(2, 2))
	next := 0 // p.ids[next:] have not been completed yet
	for _, tc := range []struct {
		name  string
		diffs int
		parts int
	}{
		{"equal", 0, 1},
		{"equal-64partitions", 0, benchParts},
		{"diff=10", 10, 1},
		{"diff=1000", 1000, 1},
	} {
		parts := make([]uint16, tc.parts)
		for i := range parts {
			parts[i] = uint16(i)
		}
		b.Run(tc.name, func(b *testing.B) {
			var sent, recv, leaves, moved int
			for b.Loop() {
				if tc.diffs > 0 {
					b.StopTimer()
					var onA, onB []storage.MergeItem
					for i := range tc.diffs {
						if i%2 == 0 {
							onA = append(onA, storage.MergeItem{Task: benchTask(rng.Uint64())})
						} else {
							id := p.ids[next]
							next++
							onB = append(onB, storage.MergeItem{Task: terminalOf(id, t0+int64(i), crdt.Completed, 1)})
						}
					}
					if _, err := p.a.store.MergeTasks(onA); err != nil {
						b.Fatal(err)
					}
					if _, err := p.b.store.MergeTasks(onB); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				st, err := p.a.r.Exchange(context.Background(), p.b.peer, parts, Options{})
				if err != nil {
					b.Fatal(err)
				}
				if len(st.Converged) != len(parts) || st.Pushed+st.Pulled != tc.diffs {
					b.Fatalf("exchange did not converge or moved the wrong states: %+v", st)
				}
				sent += st.BytesSent
				recv += st.BytesRecv
				leaves += st.Leaves
				moved += st.Pushed + st.Pulled
			}
			n := float64(b.N)
			b.ReportMetric(float64(sent+recv)/n, "bytes/op")
			b.ReportMetric(float64(sent)/n, "sent-bytes/op")
			b.ReportMetric(float64(recv)/n, "recv-bytes/op")
			b.ReportMetric(float64(leaves)/n, "leaves/op")
			b.ReportMetric(float64(moved)/n, "states/op")
		})
	}
	if p.a.r.Tree(0).Root() != p.b.r.Tree(0).Root() {
		b.Fatal("roots differ after the exchanges")
	}
}

// BenchmarkTreeMaintenance measures the write path's cost of keeping a
// tree: MergeTasks of batches of new tasks (growing ids, as enqueues
// write them) into one in-memory store, alternating between partition 0,
// tracked by a tree (Replica.Add), and partition 1, not tracked, with the
// same ids, so that both share the memtable, the background work and the
// machine. It reports each partition's time per task and the overhead. In
// memory, without the disk's fsync, the tree's share is the largest it
// can be.
func BenchmarkTreeMaintenance(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			s := newSide(b, sideConfig{}, 0)
			var took [2]time.Duration // per partition
			next := [2]uint64{1 << 40, 1 << 40}
			items := make([]storage.MergeItem, batch)
			for i := 0; b.Loop(); i++ {
				for k := range 2 {
					p := uint16((i + k) % 2) // alternate which goes first
					for j := range items {
						next[p]++
						items[j] = storage.MergeItem{Partition: p, Task: benchTask(next[p])}
					}
					start := time.Now()
					if _, err := s.store.MergeTasks(items); err != nil {
						b.Fatal(err)
					}
					took[p] += time.Since(start)
				}
			}
			tasks := float64(b.N * batch)
			b.ReportMetric(float64(took[0].Nanoseconds())/tasks, "tracked-ns/task")
			b.ReportMetric(float64(took[1].Nanoseconds())/tasks, "untracked-ns/task")
			b.ReportMetric(100*(float64(took[0])/float64(took[1])-1), "overhead-%")
			if s.r.Tree(0).Root() != bruteRoot(stored(b, s.store, 0)) {
				b.Fatal("tracked tree does not match the store")
			}
		})
	}
}

// BenchmarkDigestChanged is the tree's share of a write: one task's change
// applied to a default tree.
func BenchmarkDigestChanged(b *testing.B) {
	t := mustTree(b, DefaultLeafBits)
	rng := rand.New(rand.NewPCG(4, 4))
	ids := make([]uint64, 4096)
	for i := range ids {
		ids[i] = rng.Uint64()
	}
	i := 0
	for b.Loop() {
		id := ids[i%len(ids)]
		t.DigestChanged(storage.Segment(id), id, uint64(i), i >= len(ids), uint64(i+1), true)
		i++
	}
}

// BenchmarkTreesMemory reports the memory of every tree of a node holding
// 64 partition replicas at DefaultLeafBits (Replica.Partitions), and what
// the heap really gave them; an op is building the 64 (empty) trees.
func BenchmarkTreesMemory(b *testing.B) {
	s, err := storage.Open(storage.Config{Dir: "db", FS: vfs.NewMem(), Clock: fixedClock{t0}, CacheBytes: 8 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var bytes int
	var heap uint64
	for b.Loop() {
		r, err := NewReplica(ReplicaConfig{Store: s, Horizon: func() int64 { return 0 }})
		if err != nil {
			b.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for p := range uint16(benchParts) {
			if err := r.Add(p); err != nil {
				b.Fatal(err)
			}
		}
		runtime.ReadMemStats(&after)
		heap = after.TotalAlloc - before.TotalAlloc
		_, bytes = r.Partitions()
	}
	b.ReportMetric(float64(bytes), "tree-bytes")
	b.ReportMetric(float64(bytes)/benchParts, "bytes/tree")
	b.ReportMetric(float64(heap), "heap-bytes")
}
