package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cmd/internal/testnet"
)

// The binaries built for these tests: a real nornd, and nornctl itself,
// run as subprocesses the way a user runs them.
var norndBin, nornctlBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nornctl-test")
	if err != nil {
		panic(err)
	}
	norndBin = filepath.Join(dir, "nornd")
	nornctlBin = filepath.Join(dir, "nornctl")
	for bin, pkg := range map[string]string{norndBin: "../nornd", nornctlBin: "."} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			panic(fmt.Sprintf("go build %s: %v\n%s", pkg, err, out))
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// startNornd starts a nornd with 8 partitions on a free port of 127.0.0.1
// in a temporary data dir, waits until /healthz answers 200, and kills it
// (by its pid) when the test ends. It returns the node's address.
func startNornd(t *testing.T) string {
	t.Helper()
	addr := freeAddrs(t, 1)[0]
	startNorndArgs(t, "-data-dir", t.TempDir(), "-listen", addr)
	return addr
}

// norndProcess is a nornd a test started, stopped by its pid.
type norndProcess struct {
	cmd    *exec.Cmd
	addr   string // -listen
	exited chan struct{}
}

// stop sends SIGTERM (a clean shutdown) and waits until the process exits.
func (p *norndProcess) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.exited
}

// startNorndArgs starts a nornd with args (after -partitions 8, a short
// Raft timeout and warnings only) and waits until it is ready; it is
// killed (by its pid) when the test ends.
func startNorndArgs(t *testing.T, args ...string) *norndProcess {
	t.Helper()
	p := launchNornd(t, args...)
	p.waitReady(t)
	return p
}

// launchNornd starts a nornd as startNorndArgs does, without waiting.
func launchNornd(t *testing.T, args ...string) *norndProcess {
	t.Helper()
	cmd := exec.Command(norndBin, append([]string{"-partitions", "8", "-raft-timeout", "100ms", "-log-level", "warn"}, args...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &norndProcess{cmd: cmd, exited: make(chan struct{})}
	for i, a := range args[:len(args)-1] {
		if a == "-listen" {
			p.addr = args[i+1]
		}
	}
	go func() { cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// waitReady waits until the node answers /healthz with 200.
func (p *norndProcess) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + p.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-p.exited:
			t.Fatalf("nornd %s exited before it was ready", strings.Join(p.cmd.Args, " "))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nornd %s did not become ready: %v", strings.Join(p.cmd.Args, " "), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freeAddrs returns n distinct free addresses of 127.0.0.1.
func freeAddrs(t *testing.T, n int) []string { return testnet.FreeAddrs(t, n) }

// result is one nornctl run.
type result struct {
	stdout, stderr string
	code           int
}

// nornctl runs the nornctl binary with args against the node at addr
// (through NORN_ADDR; "" leaves it unset) and stdin, and returns what it
// printed and its exit code.
func nornctl(t *testing.T, addr, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nornctlBin, args...)
	cmd.Env = append(os.Environ(), addrEnv+"="+addr)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("nornctl %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// ok runs nornctl and fails the test unless it exits 0; it returns stdout.
func ok(t *testing.T, addr string, args ...string) string {
	t.Helper()
	r := nornctl(t, addr, "", args...)
	if r.code != 0 {
		t.Fatalf("nornctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// okJSON runs nornctl with -o json and decodes its output into m.
func okJSON(t *testing.T, addr string, m proto.Message, args ...string) {
	t.Helper()
	out := ok(t, addr, append([]string{"-o", "json"}, args...)...)
	if err := protojson.Unmarshal([]byte(out), m); err != nil {
		t.Fatalf("nornctl %s: output is not a %T: %v\n%s", strings.Join(args, " "), m, err, out)
	}
}

func mustContain(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s does not contain %q:\n%s", what, w, got)
		}
	}
}

// TestLifecycle walks one task through its life with nornctl: enqueue, get,
// claim, update, renew, complete, get; then count, list and status.
func TestLifecycle(t *testing.T) {
	addr := startNornd(t)

	out := ok(t, addr, "enqueue", "emails", "hello", "--priority", "5", "--deadline", "1h")
	id, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatalf("enqueue printed %q, want an id", out)
	}
	ids := strconv.FormatUint(id, 10)
	mustContain(t, "get", ok(t, addr, "get", ids), "emails", "READY", `"hello"`, "DEADLINE:")

	var claimed nornv1.ClaimResponse
	okJSON(t, addr, &claimed, "claim", "emails", "--worker", "test-worker", "--lease", "30s", "--max", "5")
	if len(claimed.GetTasks()) != 1 || claimed.GetTasks()[0].GetTask().GetId() != id {
		t.Fatalf("claim got %v, want task %d", claimed.GetTasks(), id)
	}
	claimID := strconv.FormatUint(claimed.GetTasks()[0].GetClaimId(), 10)

	// Global flags may come before or after the command.
	ok(t, "", "--addr", addr, "update", ids, claimID, "--seq", "1", "--progress", "0.5", "--message", "half way")
	var renewed nornv1.RenewResponse
	okJSON(t, addr, &renewed, "renew", ids, claimID, "--lease", "1m")
	if time.Until(renewed.GetExpiry().AsTime()) < 50*time.Second {
		t.Errorf("renew --lease 1m: expiry %v is less than 50s away", renewed.GetExpiry().AsTime())
	}
	ok(t, "", "complete", ids, claimID, "--result", "done", "--addr", addr)

	get := ok(t, addr, "get", ids)
	mustContain(t, "get after complete", get, "COMPLETED", "test-worker", "half way", `"done"`)
	var task nornv1.GetTaskResponse
	okJSON(t, addr, &task, "get", ids)
	if s := task.GetTask().GetStatus(); s != nornv1.TaskStatus_TASK_STATUS_COMPLETED {
		t.Errorf("get -o json: status %v, want COMPLETED", s)
	}

	// A second task, its payload from stdin, stays READY.
	r := nornctl(t, addr, "from stdin", "enqueue", "emails", "--payload-file", "-")
	if r.code != 0 {
		t.Fatalf("enqueue --payload-file -: exit %d: %s", r.code, r.stderr)
	}

	var count nornv1.CountTasksResponse
	okJSON(t, addr, &count, "count", "--queue", "emails")
	if count.GetTotal() != 2 || count.GetByStatus()["COMPLETED"] != 1 || count.GetByStatus()["READY"] != 1 {
		t.Errorf("count: %v, want 2 tasks: 1 COMPLETED, 1 READY", &count)
	}
	mustContain(t, "count", ok(t, addr, "count"), "COMPLETED  1", "READY      1", "TOTAL      2")

	mustContain(t, "list", ok(t, addr, "list", "--queue", "emails"), ids, "COMPLETED", "READY", `"from stdin"`)
	var list nornv1.ListTasksResponse
	okJSON(t, addr, &list, "list", "--status", "completed", "--all")
	if len(list.GetTasks()) != 1 || list.GetTasks()[0].GetId() != id {
		t.Errorf("list --status completed: %v, want task %d only", list.GetTasks(), id)
	}
	// Newest first: the task from stdin, enqueued second, comes first.
	var newest nornv1.ListTasksResponse
	okJSON(t, addr, &newest, "list", "--queue", "emails", "--newest-first", "--page-size", "1", "--all")
	if ts := newest.GetTasks(); len(ts) != 2 || ts[0].GetId() <= ts[1].GetId() || ts[1].GetId() != id {
		t.Errorf("list --newest-first: %v, want the second task, then %d", ts, id)
	}
	mustContain(t, "list header", ok(t, addr, "list"), "LAST ERROR")
	// Search: the payload text and the worker find the first task only.
	var found nornv1.ListTasksResponse
	okJSON(t, addr, &found, "list", "--payload", "stdin", "--all")
	if ts := found.GetTasks(); len(ts) != 1 || ts[0].GetId() == id {
		t.Errorf("list --payload stdin: %v, want the second task only", ts)
	}
	okJSON(t, addr, &found, "list", "--worker", "test-worker", "--error", "", "--all")
	if ts := found.GetTasks(); len(ts) != 1 || ts[0].GetId() != id {
		t.Errorf("list --worker test-worker: %v, want task %d only", ts, id)
	}
	okJSON(t, addr, &found, "list", "--depends-on", strconv.FormatUint(id, 10), "--all")
	if ts := found.GetTasks(); len(ts) != 0 {
		t.Errorf("list --depends-on %d: %v, want none", id, ts)
	}

	st := ok(t, addr, "status")
	mustContain(t, "status", st, "NODE:", "n1", "UPTIME:", "PARTITION", "LEADER", "Leader")
	var status nornv1.StatusResponse
	okJSON(t, addr, &status, "status")
	if len(status.GetPartitions()) != 8 {
		t.Errorf("status: %d partitions, want 8", len(status.GetPartitions()))
	}
	var enq nornv1.EnqueueResponse
	okJSON(t, addr, &enq, "-o", "json", "enqueue", "other", "x")
	if enq.Id == 0 || enq.Acks != 1 {
		t.Fatalf("enqueue -o json: %v, want the id and the acks", &enq)
	}

	// A unique key: the second enqueue prints the holder and says so.
	first := ok(t, addr, "enqueue", "reports", "a", "--unique-key", "monthly:2026-11", "--unique-for", "1h")
	r = nornctl(t, addr, "", "enqueue", "reports", "b", "--unique-key", "monthly:2026-11")
	if r.code != 0 || r.stdout != first || !strings.Contains(r.stderr, "held by task "+strings.TrimSpace(first)) {
		t.Fatalf("second unique enqueue: exit %d, stdout %q (first %q), stderr %q", r.code, r.stdout, first, r.stderr)
	}
	okJSON(t, addr, &enq, "-o", "json", "enqueue", "reports", "c", "--unique-key", "monthly:2026-11")
	if !enq.Duplicate || strconv.FormatUint(enq.Id, 10) != strings.TrimSpace(first) {
		t.Fatalf("unique enqueue -o json: %v", &enq)
	}
	mustContain(t, "get", ok(t, addr, "get", strings.TrimSpace(first)), `UNIQUE KEY:  "monthly:2026-11" (held until finished, and 1h0m0s after its enqueue)`)

	// A fairness key and its weight, shown by get.
	fair := ok(t, addr, "enqueue", "reports", "d", "--fairness-key", "acme", "--fairness-weight", "3")
	mustContain(t, "get", ok(t, addr, "get", strings.TrimSpace(fair)), `FAIRNESS KEY:  "acme" (weight 3)`)
	if r := nornctl(t, addr, "", "enqueue", "reports", "e", "--fairness-weight", "3"); r.code != 2 || !strings.Contains(r.stderr, "--fairness-weight needs --fairness-key") {
		t.Fatalf("--fairness-weight without a key: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestErrors checks the exit codes and messages of failures: the server's
// (exit 1, its code in the message) and the command line's (exit 2, with
// the usage).
func TestErrors(t *testing.T) {
	addr := startNornd(t)

	r := nornctl(t, addr, "", "cancel", "12345")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "nornctl: ") || !strings.Contains(r.stderr, "NOT_FOUND") {
		t.Errorf("cancel of an unknown id: exit %d, stderr %q; want exit 1 and a NOT_FOUND message", r.code, r.stderr)
	}
	r = nornctl(t, addr, "", "complete", "12345", "7")
	if r.code != 1 || !strings.Contains(r.stderr, "NOT_FOUND") {
		t.Errorf("complete of an unknown id: exit %d, stderr %q", r.code, r.stderr)
	}
	r = nornctl(t, addr, "", "enqueue", "bad queue!")
	if r.code != 1 || !strings.Contains(r.stderr, "INVALID_ARGUMENT") {
		t.Errorf("enqueue to an invalid queue: exit %d, stderr %q", r.code, r.stderr)
	}

	usage := []struct {
		name string
		args []string
	}{
		{"no command", nil},
		{"unknown command", []string{"frobnicate"}},
		{"unknown global flag", []string{"--nope", "status"}},
		{"missing id", []string{"get"}},
		{"extra argument", []string{"get", "1", "2"}},
		{"bad id", []string{"get", "x1"}},
		{"zero id", []string{"cancel", "0"}},
		{"unknown flag", []string{"claim", "q", "--frob"}},
		{"bad output", []string{"-o", "yaml", "status"}},
		{"bad status", []string{"list", "--status", "SLEEPING"}},
		{"bad dependency id", []string{"list", "--depends-on", "x1"}},
		{"bad not-before", []string{"enqueue", "q", "--not-before", "tomorrow"}},
		{"bad deadline", []string{"enqueue", "q", "--deadline", "-5m"}},
		{"unique-for alone", []string{"enqueue", "q", "--unique-for", "1h"}},
		{"payload twice", []string{"enqueue", "q", "x", "--payload-file", "-"}},
		{"abort without code", []string{"abort", "1", "2"}},
		{"seq 0", []string{"update", "1", "2", "--seq", "0"}},
		{"bad workload", []string{"bench", "--workload", "sleep"}},
	}
	for _, tc := range usage {
		r := nornctl(t, addr, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, "usage:") {
			t.Errorf("%s (%q): exit %d, stderr %q; want exit 2 with the usage", tc.name, tc.args, r.code, r.stderr)
		}
	}

	// Help goes to stdout and succeeds.
	for _, args := range [][]string{{"help"}, {"-h"}, {"help", "enqueue"}, {"enqueue", "-h"}, {"bench", "--help"}} {
		r := nornctl(t, addr, "", args...)
		if r.code != 0 || !strings.Contains(r.stdout, "usage: nornctl") {
			t.Errorf("nornctl %q: exit %d, stdout %q", args, r.code, r.stdout)
		}
	}
	mustContain(t, "enqueue -h", nornctl(t, addr, "", "enqueue", "-h").stdout, "-priority", "-not-before", "-depends-on", "-addr")
}

// TestBench runs a small bench end to end and checks its JSON summary: every
// task enqueued and completed, and the counts verified.
func TestBench(t *testing.T) {
	addr := startNornd(t)
	out := ok(t, addr, "bench", "--count", "2000", "--concurrency", "32", "--workers", "4", "-o", "json")
	var rep benchReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("bench -o json: %v\n%s", err, out)
	}
	if !rep.OK || rep.Enqueue == nil || rep.ClaimComplete == nil {
		t.Fatalf("bench: %s", out)
	}
	if rep.Enqueue.Tasks != 2000 || rep.ClaimComplete.Tasks != 2000 || rep.Enqueue.Errors+rep.ClaimComplete.Errors != 0 {
		t.Errorf("bench: enqueued %d and completed %d of 2000, %d errors", rep.Enqueue.Tasks, rep.ClaimComplete.Tasks,
			rep.Enqueue.Errors+rep.ClaimComplete.Errors)
	}
	if len(rep.Checks) != 2 {
		t.Errorf("bench: %d checks, want 2", len(rep.Checks))
	}
	for _, c := range rep.Checks {
		if !c.OK || c.Got != 2000 {
			t.Errorf("bench check %q: got %d, want 2000", c.What, c.Got)
		}
	}
	lat := rep.ClaimComplete.Calls
	if len(lat) != 2 || lat[1].Name != "complete" || lat[1].Calls != 2000 || lat[1].LatencyMs.P50 <= 0 {
		t.Errorf("bench: claim-complete calls %+v, want claim and 2000 completes with latencies", lat)
	}

	// The table form reports the check too.
	table := ok(t, addr, "bench", "--count", "200", "--concurrency", "8", "--workers", "2")
	mustContain(t, "bench table", table, "enqueue", "claim+complete", "complete", "P99",
		"COMPLETED tasks after claim-complete: 200, want 200: ok")
}

// TestRetries: enqueue with a retry policy, fail an attempt (abort
// --retry), see it DELAYED with its error and attempt, and a bad policy
// refused naming its field.
func TestRetries(t *testing.T) {
	addr := startNornd(t)
	out := ok(t, addr, "enqueue", "hooks", "x", "--max-attempts", "3", "--backoff", "1h", "--backoff-multiplier", "2", "--max-backoff", "4h", "--jitter", "0.1")
	ids := strings.TrimSpace(out)
	mustContain(t, "get", ok(t, addr, "get", ids), "RETRY:", "3 attempts, 1h0m0s x2 up to 4h0m0s, jitter 0.1")
	var claimed nornv1.ClaimResponse
	okJSON(t, addr, &claimed, "claim", "hooks", "--lease", "30s")
	if len(claimed.GetTasks()) != 1 {
		t.Fatalf("claim: %v", claimed.GetTasks())
	}
	claimID := strconv.FormatUint(claimed.GetTasks()[0].GetClaimId(), 10)
	mustContain(t, "abort --retry", ok(t, addr, "abort", ids, claimID, "--retry", "--code", "downstream_503"), "failed the attempt")
	mustContain(t, "get after the failure", ok(t, addr, "get", ids), "DELAYED", "FAILED ATTEMPTS:", "RETRY AT:", "FAILED", "ATTEMPT", "downstream_503")
	// Failed for good, then retried: READY again in its life 1.
	okJSON(t, addr, &claimed, "claim", "hooks", "--lease", "30s", "--max", "5")
	if len(claimed.GetTasks()) != 0 {
		t.Fatalf("claimed during the backoff: %v", claimed.GetTasks())
	}
	other := strings.TrimSpace(ok(t, addr, "enqueue", "hooks2", "y"))
	okJSON(t, addr, &claimed, "claim", "hooks2", "--lease", "30s")
	ok(t, addr, "abort", other, strconv.FormatUint(claimed.GetTasks()[0].GetClaimId(), 10), "--code", "bad")
	mustContain(t, "retry", ok(t, addr, "retry", other), "life 1")
	mustContain(t, "retry again", ok(t, addr, "retry", other, "--life", "0"), "life 1")
	mustContain(t, "get after the retry", ok(t, addr, "get", other), "READY", "LIFE:")
	r := nornctl(t, addr, "", "enqueue", "hooks", "--backoff", "1m", "--max-backoff", "1s")
	if r.code != 1 || !strings.Contains(r.stderr, "task.retry.maxBackoff") {
		t.Fatalf("a max backoff below the backoff: exit %d: %s", r.code, r.stderr)
	}
}

// TestBulkRetryAndCancel: retry and cancel by filter, safe to run twice.
func TestBulkRetryAndCancel(t *testing.T) {
	addr := startNornd(t)
	for i := range 3 {
		id := strings.TrimSpace(ok(t, addr, "enqueue", "bulk", fmt.Sprint(i)))
		var claimed nornv1.ClaimResponse
		okJSON(t, addr, &claimed, "claim", "bulk", "--lease", "30s")
		code := "timeout"
		if i == 2 {
			code = "bad_input"
		}
		ok(t, addr, "abort", id, strconv.FormatUint(claimed.GetTasks()[0].GetClaimId(), 10), "--code", code)
	}
	mustContain(t, "bulk retry", ok(t, addr, "retry", "--queue", "bulk", "--status", "aborted", "--error-contains", "timeout"), "2 tasks matched, 2 done")
	mustContain(t, "bulk retry again", ok(t, addr, "retry", "--queue", "bulk", "--status", "aborted", "--error-contains", "timeout"), "0 tasks matched")
	var count nornv1.CountTasksResponse
	okJSON(t, addr, &count, "count", "--queue", "bulk")
	if count.GetByStatus()["READY"] != 2 || count.GetByStatus()["ABORTED"] != 1 {
		t.Fatalf("after the bulk retry: %v", &count)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(ok(t, addr, "-o", "json", "cancel", "--queue", "bulk", "--status", "ready")), &res); err != nil ||
		res["done"] != float64(2) || res["matched"] != float64(2) {
		t.Fatalf("bulk cancel -o json: %v, %v", res, err)
	}
	okJSON(t, addr, &count, "count", "--queue", "bulk")
	if count.GetByStatus()["CANCELLED"] != 2 {
		t.Fatalf("after the bulk cancel: %v", &count)
	}
	if r := nornctl(t, addr, "", "retry", "--status", "dead"); r.code != 2 || !strings.Contains(r.stderr, "--queue") {
		t.Fatalf("a bulk retry without --queue: exit %d: %s", r.code, r.stderr)
	}
}

// TestSchedules walks a schedule through nornctl: create, its ticks'
// tasks, get and list, trigger, pause and resume, update, delete; and
// the usage errors.
func TestSchedules(t *testing.T) {
	addr := startNornd(t)
	out := ok(t, addr, "schedule", "create", "beat", "--every", "1s", "--queue", "beats", "--overlap", "allow", "ping")
	mustContain(t, "create", out, "NAME:", "beat", "every 1s", "beats", "NEXT TICK:")
	// The ticks' tasks appear, one a second.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var counted nornv1.CountTasksResponse
		okJSON(t, addr, &counted, "count", "--queue", "beats")
		if counted.GetTotal() >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ticks' tasks after 20 s: %v", &counted)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var got nornv1.Schedule
	okJSON(t, addr, &got, "schedule", "get", "beat")
	if got.GetLastTaskId() == 0 || got.GetLastTick() == nil || string(got.GetTemplate().GetPayload()) != "ping" {
		t.Fatalf("get after ticks: %v", &got)
	}
	mustContain(t, "list", ok(t, addr, "schedule", "list"), "NAME", "WHEN", "beat", "every 1s")
	id := strings.TrimSpace(ok(t, addr, "schedule", "trigger", "beat"))
	mustContain(t, "the triggered task", ok(t, addr, "get", id), "beats", `"ping"`)
	mustContain(t, "pause", ok(t, addr, "schedule", "pause", "beat"), "PAUSED:", "yes")
	mustContain(t, "resume", ok(t, addr, "schedule", "resume", "beat"), "PAUSED:", "no")
	mustContain(t, "update", ok(t, addr, "schedule", "update", "beat", "--cron", "@hourly", "--tz", "Europe/Paris", "--queue", "beats",
		"--max-attempts", "4", "--backoff", "2s", "--backoff-multiplier", "3", "--max-backoff", "1m", "--backoff-jitter", "0.25", "--jitter", "5s"),
		`"@hourly" Europe/Paris`)
	okJSON(t, addr, &got, "schedule", "get", "beat")
	if rp := got.GetTemplate().GetRetry(); rp.GetMaxAttempts() != 4 || rp.GetInitialBackoff().AsDuration() != 2*time.Second || rp.GetMultiplier() != 3 ||
		rp.GetMaxBackoff().AsDuration() != time.Minute || rp.GetJitter() != 0.25 || got.GetJitter().AsDuration() != 5*time.Second {
		t.Fatalf("the ticks' retry policy and jitter after update: %v", &got)
	}
	ok(t, addr, "schedule", "delete", "beat")
	r := nornctl(t, addr, "", "schedule", "get", "beat")
	if r.code != 1 || !strings.Contains(r.stderr, "NOT_FOUND") {
		t.Fatalf("get after delete: exit %d, stderr %q", r.code, r.stderr)
	}
	r = nornctl(t, addr, "", "schedule", "create", "bad", "--cron", "61 * * * *", "--queue", "q")
	if r.code != 1 || !strings.Contains(r.stderr, "schedule.cron") {
		t.Fatalf("a bad cron expression: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, args := range [][]string{{"schedule"}, {"schedule", "frob"}, {"schedule", "get"}, {"schedule", "create", "x", "--overlap", "never"}} {
		if r := nornctl(t, addr, "", args...); r.code != 2 || !strings.Contains(r.stderr, "usage:") {
			t.Errorf("%q: exit %d, stderr %q; want the usage", args, r.code, r.stderr)
		}
	}
}
