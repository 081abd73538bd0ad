package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"time"
)

// Common holds the flags shared by every system driver.
type Common struct {
	System   string // row label in the results table, e.g. "nats-r3"
	Setting  string // durability / replication setting, free text for the table
	Workload string // enqueue | claim
	N        int
	Inflight int
	Workers  int
	Payload  int
	Run      int
	Out      string
	Timeout  time.Duration
	CPU      cpuMeter // the server processes' CPU time, if -server-pids
}

// LatStats is a latency summary in microseconds.
type LatStats struct {
	Count  int     `json:"count"`
	MeanUS float64 `json:"mean_us"`
	P50US  float64 `json:"p50_us"`
	P90US  float64 `json:"p90_us"`
	P99US  float64 `json:"p99_us"`
	MaxUS  float64 `json:"max_us"`
}

// Recorder collects latency samples; safe for concurrent use.
type Recorder struct {
	mu sync.Mutex
	d  []time.Duration
}

func NewRecorder(capacity int) *Recorder { return &Recorder{d: make([]time.Duration, 0, capacity)} }

func (r *Recorder) Add(d time.Duration) {
	r.mu.Lock()
	r.d = append(r.d, d)
	r.mu.Unlock()
}

func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.d)
}

func (r *Recorder) Stats() LatStats {
	r.mu.Lock()
	s := append([]time.Duration(nil), r.d...)
	r.mu.Unlock()
	if len(s) == 0 {
		return LatStats{}
	}
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var sum float64
	for _, v := range s {
		sum += float64(v)
	}
	pct := func(p float64) float64 {
		// nearest-rank percentile
		idx := int(math.Ceil(p/100*float64(len(s)))) - 1
		if idx < 0 {
			idx = 0
		}
		if idx >= len(s) {
			idx = len(s) - 1
		}
		return us(s[idx])
	}
	return LatStats{
		Count:  len(s),
		MeanUS: math.Round(sum/float64(len(s))/10) / 100,
		P50US:  pct(50),
		P90US:  pct(90),
		P99US:  pct(99),
		MaxUS:  us(s[len(s)-1]),
	}
}

func us(d time.Duration) float64 { return math.Round(float64(d)/1e1) / 1e2 }

// Result is one run of one workload against one system; one JSON line.
type Result struct {
	System      string              `json:"system"`
	Setting     string              `json:"setting"`
	Workload    string              `json:"workload"`
	Run         int                 `json:"run"`
	N           int                 `json:"n"`
	Completed   int64               `json:"completed"`
	ElapsedS    float64             `json:"elapsed_s"`
	TasksPerSec float64             `json:"tasks_per_s"`
	Lat         map[string]LatStats `json:"lat"`
	LatDesc     map[string]string   `json:"lat_desc,omitempty"`
	Params      map[string]any      `json:"params,omitempty"`
	ServerCPU   *CPUStats           `json:"server_cpu,omitempty"`
	Errors      int64               `json:"errors"`
	Started     string              `json:"started"`
}

func newResult(c *Common) *Result {
	return &Result{
		System:   c.System,
		Setting:  c.Setting,
		Workload: c.Workload,
		Run:      c.Run,
		N:        c.N,
		Lat:      map[string]LatStats{},
		LatDesc:  map[string]string{},
		Params: map[string]any{
			"payload_bytes": c.Payload,
			"inflight":      c.Inflight,
			"workers":       c.Workers,
		},
		Started: time.Now().UTC().Format(time.RFC3339),
	}
}

func (r *Result) finish(completed int64, elapsed time.Duration) {
	r.Completed = completed
	r.ElapsedS = math.Round(elapsed.Seconds()*1e4) / 1e4
	if elapsed > 0 {
		r.TasksPerSec = math.Round(float64(completed) / elapsed.Seconds())
	}
}

func (r *Result) write(path string) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%s | %s | %s | run %d: %d tasks in %.3fs = %.0f tasks/s", r.System, r.Setting, r.Workload, r.Run, r.Completed, r.ElapsedS, r.TasksPerSec)
	for k, v := range r.Lat {
		fmt.Fprintf(os.Stderr, " | %s p50=%.0fus p99=%.0fus (n=%d)", k, v.P50US, v.P99US, v.Count)
	}
	if r.ServerCPU != nil {
		fmt.Fprintf(os.Stderr, " | server CPU %.1f us/task (%d processes, %.2fs tail)", r.ServerCPU.PerTaskUS, r.ServerCPU.Processes, r.ServerCPU.TailS)
	}
	fmt.Fprintln(os.Stderr)
	if path == "" || path == "-" {
		_, err = os.Stdout.Write(append(b, '\n'))
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write(append(b, '\n'))
	return err
}

// payloadBytes returns a deterministic printable payload of n bytes.
func payloadBytes(n int) []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[i%len(alphabet)]
	}
	return b
}

// runConcurrent calls fn(i) for i in [0,n) from `inflight` goroutines (so at most
// `inflight` calls are outstanding) and returns the number of errors.
func runConcurrent(n, inflight int, fn func(i int) error) int64 {
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		errs     int64
		firstErr error
	)
	claim := make(chan int, inflight)
	go func() {
		for i := 0; i < n; i++ {
			claim <- i
		}
		close(claim)
	}()
	for g := 0; g < inflight; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range claim {
				if err := fn(i); err != nil {
					errMu.Lock()
					errs++
					if firstErr == nil {
						firstErr = err
						fmt.Fprintln(os.Stderr, "first error:", err)
					}
					errMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return errs
}
