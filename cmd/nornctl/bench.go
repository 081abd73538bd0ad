package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
)

const benchHelp = `
bench is a load generator. It runs up to two phases against one queue
(by default a fresh one, bench-<time>):

  enqueue         --count tasks of --payload-size random bytes, with
                  --concurrency Enqueue calls in flight; the client
                  coalesces concurrent calls into EnqueueBatch RPCs
                  (--batch-linger, --batch-max; --batch-linger 0 sends
                  every Enqueue on its own).
  claim-complete  --workers workers each claim up to --claim-max tasks in
                  one Claim and Complete them with --pipeline Complete
                  calls in flight (16 by default: like a worker process
                  running 16 handlers, client.Worker with Concurrency 16;
                  --pipeline 1 completes one task after the other), the
                  client coalescing concurrent Complete calls into
                  CompleteBatch RPCs (--complete-linger; 0 sends every
                  Complete on its own; with --pipeline 1 and no
                  --complete-linger, the client's default: calls wait to
                  be batched only behind calls in flight), until --count
                  tasks are completed
                  or nothing is claimable for --claim-wait. A worker never
                  claims more than the tasks still to do, so it leaves no
                  task claimed behind.

Both phases batch on the client with a linger by default, as the
throughput targets assume (a producer or worker with many goroutines
should set the client's WithEnqueueBatching and WithCompleteBatching with
a linger; the client's own default batches only calls made while another
is in flight). Unbatched and sequential runs measure per-call latency
instead: --batch-linger 0 --pipeline 1 --complete-linger 0 (a linger of
0 turns batching off here).

What is measured: a phase's rate is tasks per second of wall time from its
first call to its last answer. Latency is per call, from the call to its
answer, over the calls that succeeded: per Enqueue call (with batching, the
time a task waits for its batch and the batch's RPC), per Claim call that
got tasks, and per Complete call. Percentiles are exact (nearest rank over
every sample).

After the enqueue phase, CountTasks must find every acknowledged task in the
queue; after claim-complete, the queue's COMPLETED count must have grown by
the tasks completed. bench exits 1 when a check fails or a call failed.
With -o json it prints one JSON summary instead of the table.

  nornctl bench                                   # 50,000 tasks: enqueue, then claim+complete
  nornctl bench --workload enqueue --count 200000 --concurrency 512
  nornctl bench --workload claim-complete --queue bench-20260101-120000.000 --count 200000`

// benchConfig is what bench was asked to do (its flags).
type benchConfig struct {
	Workload    string        // "enqueue", "claim-complete" or "both"
	Count       int           // tasks per phase
	Concurrency int           // enqueue calls in flight
	Workers     int           // claim-complete workers
	Pipeline    int           // Complete calls in flight per worker
	ClaimMax    int           // tasks per Claim
	PayloadSize int           // bytes per task
	Queue       string        // the queue
	BatchLinger time.Duration // client enqueue coalescing; 0: off
	BatchMax    int           // most tasks per coalesced batch
	CompLinger  time.Duration // client complete coalescing; 0: off
	Lease       time.Duration // lease of every claim
	ClaimWait   time.Duration // long poll of every claim
	Framed      bool          // the client's framed calls (off: gRPC for every call)
}

// completeBatchMax is the most completions bench's client coalesces into
// one CompleteBatch.
const completeBatchMax = 1000

// maxPhaseErrors is how many failed calls stop a phase early.
const maxPhaseErrors = 100

func runBench(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	var cfg benchConfig
	fs.StringVar(&cfg.Workload, "workload", "both", "enqueue, claim-complete, or both (enqueue, then claim+complete those tasks)")
	fs.IntVar(&cfg.Count, "count", 50000, "tasks to enqueue and to claim+complete")
	fs.IntVar(&cfg.Concurrency, "concurrency", 256, "enqueue calls in flight")
	fs.IntVar(&cfg.Workers, "workers", 8, "claim-complete workers")
	fs.IntVar(&cfg.ClaimMax, "claim-max", 16, "most tasks a worker claims at once, 1 to 1000")
	fs.IntVar(&cfg.Pipeline, "pipeline", 16, "Complete calls a worker has in flight for the tasks of one claim (1: one after the other)")
	fs.IntVar(&cfg.PayloadSize, "payload-size", 64, "payload bytes per task")
	fs.StringVar(&cfg.Queue, "queue", "", "queue to use (default: a fresh bench-<time>; required for --workload claim-complete)")
	fs.DurationVar(&cfg.BatchLinger, "batch-linger", time.Millisecond, "client enqueue coalescing: longest wait for a batch to fill (0: off)")
	fs.IntVar(&cfg.BatchMax, "batch-max", 500, "client enqueue coalescing: most tasks per batch, 1 to 10000")
	fs.DurationVar(&cfg.CompLinger, "complete-linger", time.Millisecond, "client complete coalescing: longest wait for a batch of completes to fill (0: off, one Complete RPC per task)")
	fs.DurationVar(&cfg.Lease, "lease", time.Minute, "lease of every claim")
	fs.BoolVar(&cfg.Framed, "framed", true, "send the hot calls framed (cleartext only; false: every call over gRPC, to compare)")
	fs.DurationVar(&cfg.ClaimWait, "claim-wait", time.Second, "long poll of every claim; a worker stops after one that finds nothing")
	if _, err := e.parse(cmd, fs, args, 0, 0); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return usagef(cmd, "%v", err)
	}
	if cfg.Queue == "" {
		cfg.Queue = "bench-" + time.Now().UTC().Format("20060102-150405.000")
	}
	lingerSet := false
	fs.Visit(func(f *flag.Flag) { lingerSet = lingerSet || f.Name == "complete-linger" })
	c, err := e.client(append(cfg.clientOptions(lingerSet), client.WithFramedCalls(cfg.Framed))...)
	if err != nil {
		return err
	}
	b := &bench{cfg: cfg, c: c, log: e.stderr}
	if e.json() {
		b.log = io.Discard
	}
	rep, err := b.run(e.ctx)
	if err != nil {
		return err
	}
	rep.Addr = c.Addr()
	if e.json() {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		tw := newTabWriter(e.stdout)
		rep.writeTable(tw)
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if !rep.OK {
		return fmt.Errorf("%s", rep.Problem)
	}
	return nil
}

func (cfg *benchConfig) validate() error {
	switch {
	case cfg.Workload != "enqueue" && cfg.Workload != "claim-complete" && cfg.Workload != "both":
		return fmt.Errorf("--workload %q: want enqueue, claim-complete or both", cfg.Workload)
	case cfg.Count < 1:
		return fmt.Errorf("--count %d: want at least 1", cfg.Count)
	case cfg.Concurrency < 1:
		return fmt.Errorf("--concurrency %d: want at least 1", cfg.Concurrency)
	case cfg.Workers < 1:
		return fmt.Errorf("--workers %d: want at least 1", cfg.Workers)
	case cfg.ClaimMax < 1 || cfg.ClaimMax > 1000:
		return fmt.Errorf("--claim-max %d: want 1 to 1000", cfg.ClaimMax)
	case cfg.Pipeline < 1:
		return fmt.Errorf("--pipeline %d: want at least 1", cfg.Pipeline)
	case cfg.PayloadSize < 0:
		return fmt.Errorf("--payload-size %d: negative", cfg.PayloadSize)
	case cfg.BatchLinger < 0 || cfg.CompLinger < 0:
		return fmt.Errorf("--batch-linger %v, --complete-linger %v: must not be negative", cfg.BatchLinger, cfg.CompLinger)
	case cfg.BatchMax < 1 || cfg.BatchMax > 10000:
		return fmt.Errorf("--batch-max %d: want 1 to 10000", cfg.BatchMax)
	case cfg.Lease <= 0 || cfg.ClaimWait < 0:
		return fmt.Errorf("--lease must be positive and --claim-wait not negative")
	case cfg.Workload == "claim-complete" && cfg.Queue == "":
		return fmt.Errorf("--workload claim-complete needs --queue (a queue with tasks to claim)")
	}
	return nil
}

// clientOptions returns the client's batching for the bench. A linger of 0
// measures calls one by one: batching off (not the client's default,
// batching while in flight). With --pipeline 1 and no --complete-linger
// given, completes keep the client's default: a worker completing one
// task after another would otherwise hold each complete for a linger
// waiting for the other workers' (2,582 against 3,315 tasks/s, session
// 12), and a worker with one handler gets the default.
func (cfg benchConfig) clientOptions(completeLingerSet bool) []client.Option {
	opts := []client.Option{client.WithEnqueueBatching(0, 1)}
	if cfg.BatchLinger > 0 {
		opts[0] = client.WithEnqueueBatching(cfg.BatchLinger, cfg.BatchMax)
	}
	switch {
	case cfg.Pipeline == 1 && !completeLingerSet:
	case cfg.CompLinger > 0:
		opts = append(opts, client.WithCompleteBatching(cfg.CompLinger, completeBatchMax))
	default:
		opts = append(opts, client.WithCompleteBatching(0, 1))
	}
	return opts
}

// bench runs the phases of one bench command.
type bench struct {
	cfg benchConfig
	c   *client.Client
	log io.Writer // progress lines
}

// benchReport is the result of bench, printed as a table or JSON.
type benchReport struct {
	Addr          string        `json:"addr"`
	Queue         string        `json:"queue"`
	Workload      string        `json:"workload"`
	Count         int           `json:"count"`
	PayloadSize   int           `json:"payloadSize"`
	Enqueue       *phaseReport  `json:"enqueue,omitempty"`
	ClaimComplete *phaseReport  `json:"claimComplete,omitempty"`
	Checks        []checkReport `json:"checks"`
	OK            bool          `json:"ok"`
	Problem       string        `json:"problem,omitempty"`
}

// phaseReport is one phase: its rate, and the latency of each kind of call.
type phaseReport struct {
	Concurrency    int        `json:"concurrency"` // calls (enqueue) or workers (claim-complete) at once
	Tasks          int64      `json:"tasks"`       // tasks enqueued, or completed
	ElapsedSeconds float64    `json:"elapsedSeconds"`
	TasksPerSecond float64    `json:"tasksPerSecond"`
	Errors         int64      `json:"errors"`
	FirstError     string     `json:"firstError,omitempty"`
	Calls          []opReport `json:"calls"`
}

// opReport is the latency of one kind of call, over the calls that
// succeeded.
type opReport struct {
	Name      string         `json:"name"` // "enqueue", "claim" or "complete"
	Calls     int            `json:"calls"`
	LatencyMs latencySummary `json:"latencyMs"`
}

// checkReport is one CountTasks check after a phase.
type checkReport struct {
	What string `json:"what"`
	Got  uint64 `json:"got"`
	Want uint64 `json:"want"`
	OK   bool   `json:"ok"`
}

// latencySummary is exact percentiles of a set of latencies, in
// milliseconds.
type latencySummary struct {
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// summarize sorts lat in place and returns its percentiles by nearest
// rank: the p-th percentile is the smallest sample with at least p% of the
// samples at or below it. Empty: all zero.
func summarize(lat []time.Duration) latencySummary {
	if len(lat) == 0 {
		return latencySummary{}
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	return latencySummary{
		P50:  ms(percentile(lat, 50)),
		P95:  ms(percentile(lat, 95)),
		P99:  ms(percentile(lat, 99)),
		Max:  ms(lat[len(lat)-1]),
		Mean: ms(sum / time.Duration(len(lat))),
	}
}

// percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted, which must not be empty.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(float64(len(sorted))*p/100)) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// phase collects the samples and errors of one phase's goroutines.
type phase struct {
	mu       sync.Mutex
	lat      map[string][]time.Duration
	errors   atomic.Int64
	firstErr string
	cancel   context.CancelFunc // stops the phase after maxPhaseErrors
}

func newPhase(cancel context.CancelFunc) *phase {
	return &phase{lat: map[string][]time.Duration{}, cancel: cancel}
}

// add merges one goroutine's samples of op.
func (p *phase) add(op string, lat []time.Duration) {
	p.mu.Lock()
	p.lat[op] = append(p.lat[op], lat...)
	p.mu.Unlock()
}

// fail records a failed call.
func (p *phase) fail(err error) {
	p.mu.Lock()
	if p.firstErr == "" {
		p.firstErr = errorMessage(err)
	}
	p.mu.Unlock()
	if p.errors.Add(1) >= maxPhaseErrors {
		p.cancel()
	}
}

// report summarizes the phase; ops are the call kinds in table order.
func (p *phase) report(concurrency int, tasks int64, elapsed time.Duration, ops ...string) *phaseReport {
	r := &phaseReport{Concurrency: concurrency, Tasks: tasks, ElapsedSeconds: elapsed.Seconds(),
		Errors: p.errors.Load(), FirstError: p.firstErr}
	if elapsed > 0 {
		r.TasksPerSecond = float64(tasks) / elapsed.Seconds()
	}
	for _, op := range ops {
		r.Calls = append(r.Calls, opReport{Name: op, Calls: len(p.lat[op]), LatencyMs: summarize(p.lat[op])})
	}
	if r.Errors >= maxPhaseErrors {
		r.FirstError += fmt.Sprintf(" (phase stopped after %d errors)", r.Errors)
	}
	return r
}

func (b *bench) run(ctx context.Context) (*benchReport, error) {
	cfg := b.cfg
	rep := &benchReport{Queue: cfg.Queue, Workload: cfg.Workload, Count: cfg.Count, PayloadSize: cfg.PayloadSize, OK: true}
	target := int64(cfg.Count)
	if cfg.Workload != "claim-complete" {
		before, err := b.count(ctx)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(b.log, "enqueue: %d tasks of %d bytes to %s, %d in flight\n", cfg.Count, cfg.PayloadSize, cfg.Queue, cfg.Concurrency)
		rep.Enqueue = b.enqueue(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		after, err := b.count(ctx)
		if err != nil {
			return nil, err
		}
		rep.check("tasks in the queue after enqueue", after.GetTotal()-before.GetTotal(), uint64(rep.Enqueue.Tasks))
		rep.fail(rep.Enqueue, "enqueue")
		target = rep.Enqueue.Tasks
	}
	if cfg.Workload != "enqueue" && target > 0 {
		before, err := b.count(ctx)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(b.log, "claim-complete: %d tasks of %s, %d workers claiming up to %d\n", target, cfg.Queue, cfg.Workers, cfg.ClaimMax)
		rep.ClaimComplete = b.claimComplete(ctx, target)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		after, err := b.count(ctx)
		if err != nil {
			return nil, err
		}
		done := after.GetByStatus()["COMPLETED"] - before.GetByStatus()["COMPLETED"]
		rep.check("COMPLETED tasks after claim-complete", done, uint64(target))
		rep.fail(rep.ClaimComplete, "claim-complete")
	}
	return rep, nil
}

// check records a check of a count; a mismatch fails the report.
func (r *benchReport) check(what string, got, want uint64) {
	c := checkReport{What: what, Got: got, Want: want, OK: got == want}
	r.Checks = append(r.Checks, c)
	if !c.OK && r.OK {
		r.OK, r.Problem = false, fmt.Sprintf("%s: %d, want %d", what, got, want)
	}
}

// fail fails the report when the phase had errors.
func (r *benchReport) fail(p *phaseReport, name string) {
	if p.Errors > 0 && r.OK {
		r.OK, r.Problem = false, fmt.Sprintf("%d failed calls in %s, the first: %s", p.Errors, name, p.FirstError)
	}
}

func (b *bench) count(ctx context.Context) (*nornv1.CountTasksResponse, error) {
	return b.c.CountTasks(ctx, b.cfg.Queue)
}

// payloads returns a source of distinct random payloads of size bytes:
// windows of one random buffer.
func payloads(size int) func(i int) []byte {
	if size == 0 {
		return func(int) []byte { return nil }
	}
	buf := make([]byte, max(1<<20, 2*size))
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	windows := (len(buf) - size) / 7
	return func(i int) []byte {
		off := (i % windows) * 7
		return buf[off : off+size : off+size]
	}
}

// enqueue runs the enqueue phase: cfg.Concurrency goroutines call Enqueue
// until cfg.Count tasks are done.
func (b *bench) enqueue(ctx context.Context) *phaseReport {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := newPhase(cancel)
	payload := payloads(b.cfg.PayloadSize)
	var next, ok atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range b.cfg.Concurrency {
		wg.Go(func() {
			var lat []time.Duration
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(b.cfg.Count) {
					break
				}
				spec := &nornv1.TaskSpec{Queue: b.cfg.Queue, Payload: payload(int(i))}
				t0 := time.Now()
				_, err := b.c.Enqueue(ctx, spec)
				if err != nil {
					if ctx.Err() == nil {
						p.fail(err)
					}
					continue
				}
				lat = append(lat, time.Since(t0))
				ok.Add(1)
			}
			p.add("enqueue", lat)
		})
	}
	wg.Wait()
	return p.report(b.cfg.Concurrency, ok.Load(), time.Since(start), "enqueue")
}

// claimComplete runs the claim-complete phase: cfg.Workers workers claim
// and complete until target tasks are done. Each worker first reserves the
// tasks it asks for out of those still to do, so that no worker claims
// more than remain (which would leave tasks claimed and wait out a long
// poll for nothing); a claim that gets fewer gives the rest back.
func (b *bench) claimComplete(ctx context.Context, target int64) *phaseReport {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := newPhase(cancel)
	var reserved, completed atomic.Int64
	reserve := func() int64 {
		for {
			r := reserved.Load()
			n := min(int64(b.cfg.ClaimMax), target-r)
			if n <= 0 {
				return 0
			}
			if reserved.CompareAndSwap(r, r+n) {
				return n
			}
		}
	}
	name := "nornctl-bench-" + strconv.Itoa(os.Getpid()) + "-"
	var wg sync.WaitGroup
	start := time.Now()
	for w := range b.cfg.Workers {
		wg.Go(func() {
			var claimLat, completeLat []time.Duration
			defer func() {
				p.add("claim", claimLat)
				p.add("complete", completeLat)
			}()
			worker := name + strconv.Itoa(w)
			failures := 0 // consecutive failed claims
			for ctx.Err() == nil {
				n := reserve()
				if n == 0 {
					return // the rest is claimed by others
				}
				t0 := time.Now()
				tasks, err := b.c.Claim(ctx, client.ClaimRequest{Queue: b.cfg.Queue, Worker: worker,
					Lease: b.cfg.Lease, Max: int(n), Wait: b.cfg.ClaimWait})
				d := time.Since(t0)
				reserved.Add(int64(len(tasks)) - n)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					p.fail(err)
					if failures++; failures >= 10 {
						return
					}
					time.Sleep(10 * time.Millisecond)
					continue
				}
				failures = 0
				if len(tasks) == 0 {
					return // nothing claimable for ClaimWait
				}
				claimLat = append(claimLat, d)
				// Complete the claimed tasks with up to --pipeline calls in
				// flight (1: one after the other).
				var mu sync.Mutex
				var cw sync.WaitGroup
				slots := make(chan struct{}, b.cfg.Pipeline)
				for _, t := range tasks {
					slots <- struct{}{}
					cw.Go(func() {
						defer func() { <-slots }()
						t0 := time.Now()
						if err := b.c.Complete(ctx, t.GetTask().GetId(), t.GetClaimId(), nil); err != nil {
							if ctx.Err() == nil {
								p.fail(err)
							}
							return
						}
						mu.Lock()
						completeLat = append(completeLat, time.Since(t0))
						mu.Unlock()
						completed.Add(1)
					})
				}
				cw.Wait()
			}
		})
	}
	wg.Wait()
	return p.report(b.cfg.Workers, completed.Load(), time.Since(start), "claim", "complete")
}

// writeTable prints the report as a table.
func (r *benchReport) writeTable(w io.Writer) {
	fmt.Fprintf(w, "bench: %s, %d tasks of %d bytes, queue %s, node %s\n\n", r.Workload, r.Count, r.PayloadSize, r.Queue, r.Addr)
	fmt.Fprintf(w, "PHASE\tCONC\tTASKS\tELAPSED\tTASKS/S\tERRORS\tCALL\tCALLS\tP50\tP95\tP99\tMAX\tMEAN\n")
	row := func(name string, p *phaseReport) {
		if p == nil {
			return
		}
		for i, op := range p.Calls {
			head := fmt.Sprintf("%s\t%d\t%d\t%s\t%.0f\t%d", name, p.Concurrency, p.Tasks,
				time.Duration(p.ElapsedSeconds*float64(time.Second)).Round(time.Millisecond), p.TasksPerSecond, p.Errors)
			if i > 0 {
				head = "\t\t\t\t\t"
			}
			l := op.LatencyMs
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", head, op.Name, op.Calls,
				fmtMs(l.P50), fmtMs(l.P95), fmtMs(l.P99), fmtMs(l.Max), fmtMs(l.Mean))
		}
	}
	row("enqueue", r.Enqueue)
	row("claim+complete", r.ClaimComplete)
	fmt.Fprintln(w)
	for _, p := range []*phaseReport{r.Enqueue, r.ClaimComplete} {
		if p != nil && p.FirstError != "" {
			fmt.Fprintf(w, "first error:\t%s\n", p.FirstError)
		}
	}
	for _, c := range r.Checks {
		verdict := "ok"
		if !c.OK {
			verdict = "MISMATCH"
		}
		fmt.Fprintf(w, "check:\t%s: %d, want %d: %s\n", c.What, c.Got, c.Want, verdict)
	}
}

func fmtMs(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "ms" }
