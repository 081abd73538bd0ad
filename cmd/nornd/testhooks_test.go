//go:build testhooks

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

func TestTestBugNeedsTestHooks(t *testing.T) {
	if out := runFails(t, 2, "-test-bug", "claim-no-check"); !strings.Contains(out, "-test-hooks") {
		t.Fatalf("the error does not name -test-hooks:\n%s", out)
	}
	out := runFails(t, 2, "-test-hooks", "-test-bug", "claim-no-check,nope")
	for _, want := range []string{`"nope"`, "claim-no-check", "ack-before-sync", "expiry-no-skew", "drop-replicated-write"} {
		if !strings.Contains(out, want) {
			t.Fatalf("unknown bug: the error does not say %s:\n%s", want, out)
		}
	}
}

// testReq sends a request to a /test/ path and returns the status and body.
func testReq(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestNoTestHooksWithoutTheFlag(t *testing.T) {
	addr := freeAddr(t)
	p := startNornd(t, t.TempDir(), addr)
	for _, r := range [][2]string{{"GET", "/test/clock"}, {"POST", "/test/clock"}, {"POST", "/test/crash"}} {
		if code, body := testReq(t, r[0], "http://"+addr+r[1], `{"offset_ms": 1000}`); code != http.StatusNotFound {
			t.Fatalf("%s %s without -test-hooks: %d %s", r[0], r[1], code, body)
		}
	}
	if p.cmd.ProcessState != nil {
		t.Fatal("nornd exited")
	}
	if _, err := client(addr).CountTasks(context.Background(), connect.NewRequest(&nornv1.CountTasksRequest{Queue: "q"})); err != nil {
		t.Fatalf("nornd stopped serving: %v", err)
	}
}

// clockReq sends a request to /test/clock that must succeed and returns
// the clock's state it answers.
func clockReq(t *testing.T, method, url, body string) clockState {
	t.Helper()
	code, body := testReq(t, method, url, body)
	if code != http.StatusOK {
		t.Fatalf("clock: %d %s", code, body)
	}
	var st clockState
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("clock: %v: %s", err, body)
	}
	return st
}

func near(got, want, slack int64) bool { return math.Abs(float64(got-want)) <= float64(slack) }

func TestClockHook(t *testing.T) {
	addr := freeAddr(t)
	startNornd(t, t.TempDir(), addr, "-test-hooks")
	url := "http://" + addr + "/test/clock"
	st := clockReq(t, "GET", url, "")
	if !near(st.OffsetMs, 0, 50) || st.Rate != 1 || !near(st.NowMs, time.Now().UnixMilli(), 1000) {
		t.Fatalf("initial clock: %+v", st)
	}
	r0 := time.Now()
	st = clockReq(t, "POST", url, `{"offset_ms": 3600000, "rate": 2}`)
	if !near(st.OffsetMs, 3600000, 50) || st.Rate != 2 {
		t.Fatalf("after POST: %+v", st)
	}
	time.Sleep(200 * time.Millisecond)
	st2 := clockReq(t, "GET", url, "")
	elapsed := time.Since(r0).Milliseconds()
	if d := st2.NowMs - st.NowMs; d < 2*200-2 || d > 2*elapsed+2 {
		t.Fatalf("at rate 2, %d ms (at most %d real) moved the clock %d ms", 200, elapsed, d)
	}
	// The node runs on it: a task enqueued now is created an hour ahead.
	api := client(addr)
	ctx := context.Background()
	r, err := api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q"}}))
	if err != nil {
		t.Fatal(err)
	}
	g, err := api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: r.Msg.Id}))
	if err != nil {
		t.Fatal(err)
	}
	if c := g.Msg.Task.GetCreatedAt().AsTime(); time.Until(c) < 59*time.Minute {
		t.Fatalf("task created at %v, want an hour ahead of %v", c, time.Now())
	}
	// Backwards, rate default 1.
	st = clockReq(t, "POST", url, `{"offset_ms": -5000}`)
	if !near(st.OffsetMs, -5000, 50) || st.Rate != 1 {
		t.Fatalf("after POST backwards: %+v", st)
	}
	for _, bad := range []string{`{"offset_ms": 0, "rate": 0}`, `{"offset_ms": 0, "rate": -1}`, `{"offset_ms": 0, "rate": 10.5}`} {
		if code, body := testReq(t, "POST", url, bad); code != http.StatusBadRequest || !strings.Contains(body, "rate") {
			t.Fatalf("POST %s: %d %s, want 400 naming rate", bad, code, body)
		}
	}
	if code, body := testReq(t, "POST", url, `{"offset_ms": "x"}`); code != http.StatusBadRequest {
		t.Fatalf("POST garbage: %d %s, want 400", code, body)
	}
	if st := clockReq(t, "GET", url, ""); !near(st.OffsetMs, -5000, 50) || st.Rate != 1 {
		t.Fatalf("refused POSTs changed the clock: %+v", st)
	}
}

// TestCrashHook enqueues a task (acked) on a nornd with -test-hooks, crashes
// it with POST /test/crash (exit code 99), restarts it without hooks and
// reads the task: with the seeded bug ack-before-sync the acked write was
// never synced and is gone; without it the task survives.
func TestCrashHook(t *testing.T) {
	for _, bug := range []bool{false, true} {
		name := map[bool]string{false: "synced", true: "ack-before-sync"}[bug]
		t.Run(name, func(t *testing.T) {
			dir, addr := t.TempDir(), freeAddr(t)
			args := []string{"-test-hooks"}
			if bug {
				args = append(args, "-test-bug", "ack-before-sync")
			}
			p := startNornd(t, dir, addr, args...)
			// Let the start-up Raft writes (synced, they would sync the
			// task's write too) settle: then nothing syncs the WAL.
			time.Sleep(300 * time.Millisecond)
			api := client(addr)
			ctx := context.Background()
			r, err := api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q", Payload: []byte("acked")}}))
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest("POST", "http://"+addr+"/test/crash", nil)
			if resp, err := http.DefaultClient.Do(req); err == nil { // the answer may not arrive
				resp.Body.Close()
			}
			done := make(chan error, 1)
			go func() { done <- p.cmd.Wait() }()
			select {
			case err := <-done:
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != crashExitCode {
					t.Fatalf("after /test/crash: %v, want exit code %d", err, crashExitCode)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("nornd still running 5 s after /test/crash")
			}

			startNornd(t, dir, addr)
			_, err = api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: r.Msg.Id}))
			switch {
			case bug && connect.CodeOf(err) != connect.CodeNotFound:
				t.Fatalf("with ack-before-sync the unsynced task survived the crash: %v", err)
			case !bug && err != nil:
				t.Fatalf("acked task lost in the crash: %v", err)
			}
		})
	}
}

// TestTestClockInProcess checks the clock's arithmetic and that readers
// and re-anchoring race with nothing (run it with -race).
func TestTestClockInProcess(t *testing.T) {
	c := newTestClock()
	if d := time.Since(c.Now()); d < -time.Millisecond || d > 50*time.Millisecond {
		t.Fatalf("a new clock is %v off", d)
	}
	c.set(-time.Hour, 1)
	if d := time.Until(c.Now()); d < -time.Hour-50*time.Millisecond || d > -time.Hour+50*time.Millisecond {
		t.Fatalf("set back an hour: %v off", d)
	}
	c.anchor.Store(&clockAnchor{real: time.Now().Add(-time.Second), fake: time.UnixMilli(0), rate: 3})
	if ms := c.Now().UnixMilli(); ms < 3000 || ms > 3100 {
		t.Fatalf("a second at rate 3 from 0: %d ms", ms)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 1000 {
			c.set(time.Duration(i)*time.Millisecond, 1+float64(i%3))
		}
	}()
	for range 1000 {
		c.Now()
		c.state()
	}
	<-done
}

// TestTransferHook: POST /test/transfer passes the task and the target
// node on, answers 409 with the reason when the transfer fails, and 400
// to a body without a target.
func TestTransferHook(t *testing.T) {
	var got []string
	var fail error
	h := testHandler(http.NotFoundHandler(), newTestClock(), slog.New(slog.DiscardHandler), func(int) {}, testActions{transfer: func(task uint64, to string) error {
		got = append(got, fmt.Sprint(task, " ", to))
		return fail
	}})
	do := func(body string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/test/transfer", strings.NewReader(body)))
		return rec.Code
	}
	if code := do(`{"task": "153032758812213269", "to": "n2"}`); code != http.StatusOK || len(got) != 1 || got[0] != "153032758812213269 n2" {
		t.Fatalf("transfer: %d, %v", code, got)
	}
	fail = errors.New("not the leader")
	if code := do(`{"task": "1", "to": "n2"}`); code != http.StatusConflict {
		t.Fatalf("failed transfer: %d", code)
	}
	if code := do(`{"task": "1"}`); code != http.StatusBadRequest || len(got) != 2 {
		t.Fatalf("no target: %d, %v", code, got)
	}
}

// TestRefuseStatesHook: POST /test/refuse-states passes on and off on, and
// answers 400 to a body without "on".
func TestRefuseStatesHook(t *testing.T) {
	var got []bool
	h := testHandler(http.NotFoundHandler(), newTestClock(), slog.New(slog.DiscardHandler), func(int) {}, testActions{refuseStates: func(on bool) { got = append(got, on) }})
	do := func(body string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/test/refuse-states", strings.NewReader(body)))
		return rec.Code
	}
	if code := do(`{"on": true}`); code != http.StatusOK {
		t.Fatalf("on: %d", code)
	}
	if code := do(`{"on": false}`); code != http.StatusOK {
		t.Fatalf("off: %d", code)
	}
	if code := do(`{}`); code != http.StatusBadRequest {
		t.Fatalf("no on: %d", code)
	}
	if len(got) != 2 || !got[0] || got[1] {
		t.Fatalf("passed on: %v, want [true false]", got)
	}
}
