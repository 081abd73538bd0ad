package node

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// BenchmarkEnqueue measures single-task Enqueue RPCs over HTTP/2 against
// one node on a real disk (64 partitions), with 256 callers in flight.
func BenchmarkEnqueue(b *testing.B) { benchEnqueue(b, newBenchHarness(b)) }

// BenchmarkEnqueueTraced is BenchmarkEnqueue with tracing on, every
// request sampled, the spans batched to an exporter that drops them: the
// cost of tracing without the export's network (docs/OPERATIONS.md,
// Tracing).
func BenchmarkEnqueueTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	benchEnqueue(b, newHarnessWith(b, b.TempDir(), nil, func(cfg *Config) { cfg.TracerProvider = tp }))
}

func benchEnqueue(b *testing.B, h *harness) {
	payload := make([]byte, 64)
	b.SetParallelism(128) // x GOMAXPROCS(2) = 256 callers
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, err := h.api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{
				Task: &nornv1.TaskSpec{Queue: "bench", Payload: payload}}))
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
}

// BenchmarkEnqueueUnique is BenchmarkEnqueue with a unique key per task
// (each new: every enqueue takes its key in a Raft entry of the key's
// partition before the write), and BenchmarkEnqueueUniqueHeld with 16
// keys, held from the first round on (every enqueue after is answered
// as a duplicate: the Raft entry and a majority read of the holder).
func BenchmarkEnqueueUnique(b *testing.B) { benchEnqueueUnique(b, 0) }

func BenchmarkEnqueueUniqueHeld(b *testing.B) { benchEnqueueUnique(b, 16) }

func benchEnqueueUnique(b *testing.B, keys int64) {
	h := newBenchHarness(b)
	payload := make([]byte, 64)
	var n atomic.Int64
	b.SetParallelism(128)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := n.Add(1)
			if keys > 0 {
				k %= keys
			}
			_, err := h.api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{
				Task: &nornv1.TaskSpec{Queue: "bench", Payload: payload, UniqueKey: fmt.Sprint("key-", k)}}))
			if err != nil && connect.CodeOf(err) != connect.CodeUnavailable { // a holder not stored yet: retry
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
}

// BenchmarkEnqueueBatch measures EnqueueBatch RPCs of 100 tasks, 16 in
// flight.
func BenchmarkEnqueueBatch(b *testing.B) {
	h := newBenchHarness(b)
	specs := make([]*nornv1.TaskSpec, 100)
	for i := range specs {
		specs[i] = &nornv1.TaskSpec{Queue: "bench", Payload: make([]byte, 64)}
	}
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, err := h.api.EnqueueBatch(context.Background(), connect.NewRequest(&nornv1.EnqueueBatchRequest{Tasks: specs}))
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N*len(specs))/b.Elapsed().Seconds(), "tasks/s")
}

// BenchmarkClaimComplete measures claim (16 at a time) then complete of
// each task, with 8 workers; b.N tasks are enqueued first (not timed).
func BenchmarkClaimComplete(b *testing.B) {
	h := newBenchHarness(b)
	ctx := context.Background()
	specs := make([]*nornv1.TaskSpec, 0, 1000)
	for left := b.N; left > 0; left -= len(specs) {
		specs = specs[:0]
		for range min(left, 1000) {
			specs = append(specs, &nornv1.TaskSpec{Queue: "bench", Payload: make([]byte, 64)})
		}
		if _, err := h.api.EnqueueBatch(ctx, connect.NewRequest(&nornv1.EnqueueBatchRequest{Tasks: specs})); err != nil {
			b.Fatal(err)
		}
	}
	var done atomic.Int64
	b.SetParallelism(4) // x 2 = 8 workers
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for done.Load() < int64(b.N) {
			r, err := h.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "bench", Worker: "w",
				Max: 16, Lease: durationpb.New(time.Minute)}))
			if err != nil {
				b.Error(err)
				return
			}
			if len(r.Msg.Tasks) == 0 {
				break
			}
			for _, c := range r.Msg.Tasks {
				if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: c.Task.Id, ClaimId: c.ClaimId})); err != nil {
					b.Error(err)
					return
				}
				done.Add(1)
			}
		}
		for pb.Next() {
		}
	})
	b.ReportMetric(float64(done.Load())/b.Elapsed().Seconds(), "tasks/s")
}

func newBenchHarness(b *testing.B) *harness {
	b.Helper()
	h := newHarness(b, b.TempDir(), nil)
	return h
}

// BenchmarkReadyHeads measures what a node answers another node's claim
// with (PeerService.ReadyHeads, without the call): the best 16 claimable
// heads of a queue over the partitions it leads, with 1,000 and 100,000
// ready tasks of assorted priorities. Its cost must not grow with the
// ready tasks (docs/API.md, "Claim order").
func BenchmarkReadyHeads(b *testing.B) {
	for _, ready := range []int{1_000, 100_000} {
		b.Run(fmt.Sprint(ready), func(b *testing.B) {
			h := newBenchHarness(b)
			specs := make([]*nornv1.TaskSpec, 0, 1000)
			for left := ready; left > 0; left -= len(specs) {
				specs = specs[:0]
				for i := range min(left, 1000) {
					specs = append(specs, &nornv1.TaskSpec{Queue: "bench", Priority: int32(i % 7), Payload: make([]byte, 64)})
				}
				if _, err := h.api.EnqueueBatch(context.Background(), connect.NewRequest(&nornv1.EnqueueBatchRequest{Tasks: specs})); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				resp, err := h.node.dispatch.ReadyHeads("bench", 16, false)
				if err != nil || len(resp.Heads) != 16 {
					b.Fatalf("ReadyHeads: %d heads, %v", len(resp.GetHeads()), err)
				}
			}
		})
	}
}

// BenchmarkClaimFairKeys measures the latency of a claim of one task,
// one worker at a time, on a node whose queue holds 200,000 ready tasks
// without a key and spread over 1, 10 and 100,000 fairness keys
// (docs/SCHEDULING.md, "Fair claims": within 2x of one key), plus b.N
// more so it never runs dry;
// p50 and p99 reported.
func BenchmarkClaimFairKeys(b *testing.B) {
	for _, keys := range []int{0, 1, 10, 100_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			h := newBenchHarness(b)
			ctx := context.Background()
			specs := make([]*nornv1.TaskSpec, 0, 1000)
			n := 0
			for total := 200_000 + b.N; n < total; {
				specs = specs[:0]
				for range min(total-n, 1000) {
					key := "" // keys=0: no key, as before fairness keys
					if keys > 0 {
						key = fmt.Sprintf("tenant-%d", n%keys)
					}
					specs = append(specs, &nornv1.TaskSpec{Queue: "bench", FairnessKey: key, Payload: make([]byte, 64)})
					n++
				}
				if _, err := h.api.EnqueueBatch(ctx, connect.NewRequest(&nornv1.EnqueueBatchRequest{Tasks: specs})); err != nil {
					b.Fatal(err)
				}
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				r, err := h.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "bench", Worker: "w",
					Max: 1, Lease: durationpb.New(time.Hour)}))
				if err != nil || len(r.Msg.Tasks) != 1 {
					b.Fatalf("claim: %v, %d tasks", err, len(r.Msg.GetTasks()))
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
