//go:build testhooks

package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/faultfs"
	"github.com/norn-dev/norn/node"
)

// Test hooks (nornd -test-hooks), for the Jepsen harness only, and only in
// a build with the tag testhooks (package testhooks): a controllable clock
// (GET and POST /test/clock), a power loss (POST /test/crash, with Pebble
// on faultfs) and seeded bugs (-test-bug). See docs/OPERATIONS.md.

// testHooks are the flags of the test hooks and, once configured, the
// node's test clock.
type testHooks struct {
	on  *bool
	bug *string
	clk *testClock
}

// addTestHookFlags defines -test-hooks and -test-bug on fs.
func addTestHookFlags(fs *flag.FlagSet) *testHooks {
	return &testHooks{
		on:  fs.Bool("test-hooks", false, "Jepsen harness only, never in production: controllable clock (/test/clock), power loss (/test/crash, unsynced writes kept in memory) and -test-bug"),
		bug: fs.String("test-bug", "", "Jepsen harness only (needs -test-hooks): comma-separated seeded bugs: "+strings.Join(node.TestBugNames(), ", ")),
	}
}

// configure sets cfg's seeded bugs, clock and storage filesystem from the
// flags; an error is a usage error.
func (h *testHooks) configure(cfg *node.Config, logger *slog.Logger) error {
	if *h.bug != "" {
		if !*h.on {
			return errors.New("-test-bug needs -test-hooks (the Jepsen harness's test hooks; never in production)")
		}
		bugs, err := node.ParseTestBugs(*h.bug)
		if err != nil {
			return fmt.Errorf("-test-bug: %w", err)
		}
		cfg.TestBugs = bugs
	}
	if *h.on {
		logger.Warn("test hooks enabled: not for production", "test_bugs", *h.bug)
		h.clk = newTestClock()
		cfg.Clock = h.clk
		cfg.MinQueueRetention = time.Second // a run sees tasks deleted
		// A leader change between a tick's write and its record makes the
		// next leader write the tick again: often, under the harness.
		cfg.ScheduleRanDelay = 500 * time.Millisecond
		cfg.StorageFS = faultfs.New(vfs.Default)
	}
	return nil
}

// wrap serves the hooks' routes beside api when -test-hooks is on.
func (h *testHooks) wrap(api http.Handler, n *node.Node, logger *slog.Logger) http.Handler {
	if !*h.on {
		return api
	}
	return testHandler(api, h.clk, logger, os.Exit, testActions{
		transfer: func(task uint64, to string) error {
			return n.TransferLeadershipTo(n.PartitionOf(task), to)
		},
		refuseStates: n.RefuseTaskStates,
	})
}

// testActions are what the hooks do to the node.
type testActions struct {
	transfer     func(task uint64, to string) error // POST /test/transfer
	refuseStates func(on bool)                      // POST /test/refuse-states
}

// refuseStatesRequest is the body of POST /test/refuse-states.
type refuseStatesRequest struct {
	On *bool `json:"on"`
}

// transferRequest is the body of POST /test/transfer: hand the leadership
// of task Task's partition, which this node leads, to node To.
type transferRequest struct {
	Task uint64 `json:"task,string"`
	To   string `json:"to"`
}

// crashExitCode is the exit code of POST /test/crash.
const crashExitCode = 99

// maxClockRate bounds the rate POST /test/clock accepts.
const maxClockRate = 10

// testClock is the node's clock under -test-hooks:
// now = anchor.fake + (realNow - anchor.real) * anchor.rate. Reads are one
// atomic load and a time.Now; POST /test/clock swaps the anchor.
type testClock struct {
	anchor atomic.Pointer[clockAnchor]
}

type clockAnchor struct {
	real time.Time // with its monotonic reading: elapsed real time is measured on it
	fake time.Time // wall only
	rate float64
}

func newTestClock() *testClock {
	c := &testClock{}
	c.set(0, 1)
	return c
}

// at is the clock's reading at real time r.
func (a *clockAnchor) at(r time.Time) time.Time {
	el := r.Sub(a.real)
	if a.rate != 1 {
		el = time.Duration(float64(el) * a.rate)
	}
	return a.fake.Add(el)
}

// Now returns the controlled time.
func (c *testClock) Now() time.Time { return c.anchor.Load().at(time.Now()) }

// set re-anchors the clock: from now on it reads real time + offset,
// advancing at rate.
func (c *testClock) set(offset time.Duration, rate float64) {
	r := time.Now()
	c.anchor.Store(&clockAnchor{real: r, fake: r.Round(0).Add(offset), rate: rate})
}

// clockState is the JSON of GET and POST /test/clock.
type clockState struct {
	OffsetMs int64   `json:"offset_ms"`
	Rate     float64 `json:"rate"`
	NowMs    int64   `json:"now_ms"`
}

func (c *testClock) state() clockState {
	a := c.anchor.Load()
	r := time.Now()
	now := a.at(r)
	return clockState{OffsetMs: now.Sub(r.Round(0)).Milliseconds(), Rate: a.rate, NowMs: now.UnixMilli()}
}

// clockRequest is the body of POST /test/clock; a missing rate is 1.
type clockRequest struct {
	OffsetMs int64    `json:"offset_ms"`
	Rate     *float64 `json:"rate"`
}

func (c *testClock) serveGet(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, c.state())
}

func (c *testClock) servePost(w http.ResponseWriter, r *http.Request) {
	var req clockRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<10)).Decode(&req); err != nil {
		http.Error(w, fmt.Sprintf("body: want {\"offset_ms\": N, \"rate\": R}: %v", err), http.StatusBadRequest)
		return
	}
	rate := 1.0
	if req.Rate != nil {
		rate = *req.Rate
	}
	if !(rate > 0 && rate <= maxClockRate) || math.IsNaN(rate) {
		http.Error(w, fmt.Sprintf("rate: must be > 0 and <= %d, got %v", maxClockRate, rate), http.StatusBadRequest)
		return
	}
	if req.OffsetMs > math.MaxInt64/int64(time.Millisecond) || req.OffsetMs < math.MinInt64/int64(time.Millisecond) {
		http.Error(w, fmt.Sprintf("offset_ms: %d out of range", req.OffsetMs), http.StatusBadRequest)
		return
	}
	c.set(time.Duration(req.OffsetMs)*time.Millisecond, rate)
	writeJSON(w, c.state())
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// testHandler serves the test hooks on /test/ and everything else with api.
// POST /test/transfer moves a partition's leadership to a given node
// (transfer; the answer comes once this node has stepped down, 409 with
// the reason when it could not). POST /test/refuse-states {"on": true}
// makes the node exchange no task states with its peers (replicated
// writes, replica reads, anti-entropy) while its Raft groups go on
// ({"on": false} ends it): a replica that misses writes acked at W < N.
func testHandler(api http.Handler, clk *testClock, logger *slog.Logger, exit func(int), act testActions) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /test/refuse-states", func(w http.ResponseWriter, r *http.Request) {
		var req refuseStatesRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.On == nil {
			http.Error(w, fmt.Sprintf("want {\"on\": true|false}: %v", err), http.StatusBadRequest)
			return
		}
		act.refuseStates(*req.On)
		logger.Warn("test hook: task states with peers", "refused", *req.On)
		fmt.Fprintf(w, "refused %v\n", *req.On)
	})
	mux.HandleFunc("POST /test/transfer", func(w http.ResponseWriter, r *http.Request) {
		var req transferRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.To == "" {
			http.Error(w, fmt.Sprintf("want {\"task\": \"<id>\", \"to\": \"<node id>\"}: %v", err), http.StatusBadRequest)
			return
		}
		if err := act.transfer(req.Task, req.To); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		logger.Warn("test hook: leadership transferred", "task", req.Task, "to", req.To)
		w.Write([]byte("transferred\n"))
	})
	mux.Handle("/", api)
	mux.HandleFunc("GET /test/clock", clk.serveGet)
	mux.HandleFunc("POST /test/clock", clk.servePost)
	mux.HandleFunc("POST /test/crash", func(w http.ResponseWriter, _ *http.Request) {
		// A power loss: exit at once; the writes faultfs holds unsynced
		// are lost with the process. The answer may not arrive.
		logger.Warn("test hook: crashing (power loss)", "exit_code", crashExitCode)
		w.Write([]byte("crashing\n"))
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		os.Stdout.Sync()
		os.Stderr.Sync()
		exit(crashExitCode)
	})
	return mux
}
