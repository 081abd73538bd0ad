package console

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/metrics"
)

// served is a request whose Spec names a served procedure.
type served struct {
	connect.AnyRequest
	proc string
}

func (r served) Spec() connect.Spec { return connect.Spec{Procedure: r.proc} }

// calls records n served calls of proc through the RPC metrics'
// interceptor, ending with err.
func calls(r *metrics.RPC, proc string, n int, err error) {
	f := r.Interceptor().WrapUnary(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) { return nil, err })
	for range n {
		f(context.Background(), served{connect.NewRequest(&nornv1.StatusRequest{}), proc}) //nolint:errcheck
	}
}

// slowCalls records n calls of proc that took at least d (a refused
// call's start is the caller's).
func slowCalls(r *metrics.RPC, proc string, n int, d time.Duration) {
	for range n {
		r.ObserveRefused(proc, time.Now().Add(-d), nil)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestSparksSample: the sampler's points are what the recorded calls
// imply: 50 calls in 10 s are 5/s, the errors the calls not ok, latencies
// all in one bucket give p50 and p99 inside it (interpolated linearly);
// a counter that goes down gives no point; PeerService is left out; the
// view lists the called methods, busiest first, and trims to the window.
func TestSparksSample(t *testing.T) {
	reg := prometheus.NewRegistry()
	rpc := metrics.NewRPC(reg)
	s := newSampler(reg, 0)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	calls(rpc, nornv1connect.TaskServiceEnqueueProcedure, 3, nil) // before the base: not in any point
	s.sample(t0)
	if v := s.view(); len(v.Rows) != 0 || v.Window != "10 minutes" || v.Every != "10s" {
		t.Fatalf("after the first gather: %+v, want no rows over 10 minutes", v)
	}

	calls(rpc, nornv1connect.TaskServiceEnqueueProcedure, 40, nil)
	calls(rpc, nornv1connect.TaskServiceEnqueueProcedure, 10, connect.NewError(connect.CodeResourceExhausted, errors.New("full")))
	slowCalls(rpc, nornv1connect.TaskServiceClaimProcedure, 20, 700*time.Millisecond) // the (0.5, 1] s bucket
	calls(rpc, nornv1connect.QueueServiceListQueuesProcedure, 2, nil)
	calls(rpc, nornv1connect.PeerServiceReplicateProcedure, 100, nil)
	s.sample(t0.Add(10 * time.Second))

	enq := s.series["norn.v1.TaskService/Enqueue"]
	if len(enq) != 1 || !enq[0].rated || !near(enq[0].calls, 5) || !near(enq[0].errs, 1) || !enq[0].timed {
		t.Fatalf("Enqueue's point %+v, want 5 calls/s, 1 error/s, timed", enq)
	}
	claim := s.series["norn.v1.TaskService/Claim"][0]
	if !near(claim.calls, 2) || claim.errs != 0 || !near(claim.p50, 0.75) || !near(claim.p99, 0.995) {
		t.Fatalf("Claim's point %+v, want 2/s, p50 0.75 s and p99 0.995 s (inside the (0.5, 1] bucket)", claim)
	}
	if q := s.series["norn.v1.QueueService/ListQueues"]; len(q) != 1 || !near(q[0].calls, 0.2) {
		t.Fatalf("ListQueues' points %+v, want 0.2/s", q)
	}
	for m := range s.series {
		if strings.Contains(m, "PeerService") {
			t.Fatalf("PeerService charted: %s", m)
		}
	}
	v := s.view()
	var names []string
	for _, r := range v.Rows {
		names = append(names, r.Method)
	}
	if strings.Join(names, " ") != "TaskService/Enqueue TaskService/Claim QueueService/ListQueues" {
		t.Fatalf("rows %v, want the three called public methods, busiest first", names)
	}
	if r := v.Rows[0]; r.CallsNow != "5" || r.ErrsNow != "1" || !r.Erring || len(r.Calls.Lines) != 2 {
		t.Fatalf("Enqueue's row %+v, want 5 calls/s, 1 error/s and an errors line", r)
	}
	if r := v.Rows[1]; r.P50 != "750 ms" || r.P99 != "995 ms" || len(r.Calls.Lines) != 1 {
		t.Fatalf("Claim's row %+v, want p50 750 ms, p99 995 ms, no errors line", r)
	}

	// An interval without calls: 0/s, no latency.
	s.sample(t0.Add(20 * time.Second))
	if p := s.series["norn.v1.TaskService/Claim"][1]; !p.rated || p.calls != 0 || p.timed {
		t.Fatalf("Claim's idle point %+v, want rated 0, not timed", p)
	}

	// The counters go down (a restart: another registry, fewer calls):
	// no point for that interval, then points again.
	reg2 := prometheus.NewRegistry()
	rpc2 := metrics.NewRPC(reg2)
	calls(rpc2, nornv1connect.TaskServiceEnqueueProcedure, 5, nil)
	s.g = reg2
	s.sample(t0.Add(30 * time.Second))
	if p := s.series["norn.v1.TaskService/Enqueue"][2]; p.rated || p.timed {
		t.Fatalf("Enqueue's point across a reset %+v, want none", p)
	}
	if p := s.series["norn.v1.TaskService/Claim"][2]; p.rated || p.timed {
		t.Fatalf("Claim's point with its series gone %+v, want none", p)
	}
	calls(rpc2, nornv1connect.TaskServiceEnqueueProcedure, 20, nil)
	s.sample(t0.Add(40 * time.Second))
	if p := s.series["norn.v1.TaskService/Enqueue"][3]; !p.rated || !near(p.calls, 2) {
		t.Fatalf("Enqueue's point after the reset %+v, want 2/s", p)
	}
	// The gap splits Enqueue's line in two.
	if r := s.view().Rows[0]; r.Method != "TaskService/Enqueue" || len(r.Calls.Lines) != 4 || r.CallsNow != "2" {
		t.Fatalf("Enqueue's row after the reset %+v, want its calls and errors lines each in two", r)
	}

	// The window keeps sampleKeep points; Claim's calls leave it.
	for i := range sampleKeep {
		s.sample(t0.Add(time.Duration(50+10*i) * time.Second))
	}
	for m, ser := range s.series {
		if len(ser) != sampleKeep {
			t.Fatalf("%s has %d points, want %d", m, len(ser), sampleKeep)
		}
	}
	if rows := s.view().Rows; len(rows) != 0 {
		t.Fatalf("rows %+v after a window without calls, want none", rows)
	}
}

// TestSparksRender: the overview's charts are SVG polylines with
// presentation attributes (no style attribute: the CSP forbids inline
// styles), the newest point at the right edge; without metrics, a line
// says there are no charts.
func TestSparksRender(t *testing.T) {
	reg := prometheus.NewRegistry()
	rpc := metrics.NewRPC(reg)
	s := newSampler(reg, 0)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s.sample(t0)
	for i := 1; i <= 3; i++ {
		slowCalls(rpc, nornv1connect.TaskServiceClaimProcedure, 10*i, 2*time.Millisecond)
		s.sample(t0.Add(time.Duration(i) * 10 * time.Second))
	}
	c := &Console{pages: parsePages()}
	page := func(calls *sparksView) string {
		var b bytes.Buffer
		if err := c.pages["overview"].Execute(&b, &view{Data: overviewData{Calls: calls}}); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	out := page(s.view())
	// 1, 2 then 3 calls/s: the top of the chart at the right edge.
	for _, want := range []string{"<td>TaskService/Claim</td>", `<svg class="spark"`, `<polyline class="calls" points="114.1,15.3 116.0,8.7 118.0,2.0"`,
		`class="p99"`, `class="p50"`, `aria-label="latency p99 and p50"`, ">3</td>", "last 10 minutes"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in the page\n%s", want, out)
		}
	}
	if strings.Contains(out, "style=") {
		t.Fatalf("a style attribute in the page\n%s", out)
	}
	if out := page(&sparksView{Off: true}); !strings.Contains(out, "No charts") || strings.Contains(out, "<svg") {
		t.Fatalf("the page without metrics\n%s", out)
	}
}

// TestSparksClose: a console with metrics samples in a goroutine that
// Close stops; Close may be called twice, and without metrics too.
func TestSparksClose(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(Config{Metrics: reg, SampleEvery: time.Millisecond})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.sparks.mu.Lock()
		n := c.sparks.n
		c.sparks.mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no sample in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	c.Close()
	c.Close()
	select {
	case <-c.sparks.done:
	default:
		t.Fatal("sampling goes on after Close")
	}
	New(Config{}).Close()
}
