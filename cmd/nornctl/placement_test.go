package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// fakeAdmin is a scripted AdminService for the placement commands' tests,
// served over HTTP/2 cleartext on 127.0.0.1 as a node serves it. Every
// placement RPC answers plan (with apply false) or applied (with apply
// true); Status answers the statuses in turn, repeating the last, and
// fails while statusErrs is above 0. It records every call.
type fakeAdmin struct {
	nornv1connect.UnimplementedAdminServiceHandler

	addr string

	mu         sync.Mutex
	plan       *nornv1.Plan // the answer to apply = false
	applied    *nornv1.Plan // the answer to apply = true; nil: plan, applied
	join       *nornv1.JoinResponse
	statuses   []*nornv1.StatusResponse
	statusErrs int             // Status calls still to fail with UNAVAILABLE
	onStatus   func()          // when set, runs at every Status call
	placeErr   error           // when set, the answer of every placement RPC
	applyErr   error           // when set, the answer of every placement RPC with apply
	calls      []string        // "Rebalance apply=false", "Status", ...
	reqs       []proto.Message // the placement requests, in order
}

func newFakeAdmin(t *testing.T) *fakeAdmin {
	t.Helper()
	f := &fakeAdmin{}
	mux := http.NewServeMux()
	mux.Handle(nornv1connect.NewAdminServiceHandler(f))
	srv := httptest.NewUnstartedServer(mux)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)
	f.addr = srv.Listener.Addr().String()
	return f
}

// called returns the calls made so far.
func (f *fakeAdmin) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// requests returns the placement requests received so far.
func (f *fakeAdmin) requests() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

// setStatuses replaces the Status answers (status's discovery may still be
// calling Status after a run).
func (f *fakeAdmin) setStatuses(sts ...*nornv1.StatusResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statuses = sts
}

// answer records a placement call and returns its plan.
func (f *fakeAdmin) answer(method string, req proto.Message, apply bool) (*nornv1.Plan, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("%s apply=%v", method, apply))
	f.reqs = append(f.reqs, proto.Clone(req))
	if f.placeErr != nil {
		return nil, f.placeErr
	}
	if apply && f.applyErr != nil {
		return nil, f.applyErr
	}
	if !apply {
		return proto.CloneOf(f.plan), nil
	}
	p := f.applied
	if p == nil {
		p = f.plan
	}
	p = proto.CloneOf(p)
	p.Applied = true
	return p, nil
}

func (f *fakeAdmin) Join(_ context.Context, req *connect.Request[nornv1.JoinRequest]) (*connect.Response[nornv1.JoinResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "Join "+req.Msg.GetNode())
	return connect.NewResponse(proto.CloneOf(f.join)), nil
}

func (f *fakeAdmin) Rebalance(_ context.Context, req *connect.Request[nornv1.RebalanceRequest]) (*connect.Response[nornv1.RebalanceResponse], error) {
	method := "Rebalance"
	if req.Msg.GetCancel() {
		method = "Rebalance cancel"
	}
	p, err := f.answer(method, req.Msg, req.Msg.GetApply())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.RebalanceResponse{Plan: p}), nil
}

func (f *fakeAdmin) Drain(_ context.Context, req *connect.Request[nornv1.DrainRequest]) (*connect.Response[nornv1.DrainResponse], error) {
	p, err := f.answer("Drain", req.Msg, req.Msg.GetApply())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.DrainResponse{Plan: p}), nil
}

func (f *fakeAdmin) Decommission(_ context.Context, req *connect.Request[nornv1.DecommissionRequest]) (*connect.Response[nornv1.DecommissionResponse], error) {
	p, err := f.answer("Decommission", req.Msg, req.Msg.GetApply())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.DecommissionResponse{Plan: p}), nil
}

func (f *fakeAdmin) Remove(_ context.Context, req *connect.Request[nornv1.RemoveRequest]) (*connect.Response[nornv1.RemoveResponse], error) {
	p, err := f.answer("Remove", req.Msg, req.Msg.GetApply())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.RemoveResponse{Plan: p}), nil
}

func (f *fakeAdmin) Status(_ context.Context, req *connect.Request[nornv1.StatusRequest]) (*connect.Response[nornv1.StatusResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "Status")
	if f.onStatus != nil {
		f.onStatus()
	}
	if f.statusErrs > 0 {
		f.statusErrs--
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("node restarting"))
	}
	if len(f.statuses) == 0 {
		return connect.NewResponse(&nornv1.StatusResponse{NodeId: "n1"}), nil
	}
	st := f.statuses[0]
	if len(f.statuses) > 1 {
		f.statuses = f.statuses[1:]
	}
	return connect.NewResponse(proto.CloneOf(st)), nil
}

// runFake runs nornctl in-process against f with stdin, without waiting
// between the polls of a watch.
func runFake(t *testing.T, f *fakeAdmin, stdin string, args ...string) result {
	t.Helper()
	return runFakeCtx(t.Context(), f, strings.NewReader(stdin), args...)
}

// runFakeCtx is runFake with its context and stdin.
func runFakeCtx(ctx context.Context, f *fakeAdmin, stdin io.Reader, args ...string) result {
	var stdout, stderr bytes.Buffer
	e := newEnv(ctx, stdin, &stdout, &stderr, func(string) string { return "" })
	e.poll = 0
	code := e.dispatch(append([]string{"--addr", f.addr}, args...))
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

func move(partition uint32, from, to, state, err string) *nornv1.MoveStatus {
	return &nornv1.MoveStatus{Partition: partition, FromNode: from, ToNode: to, State: state, Error: err, Epoch: 12}
}

// testPlan moves two of 24 replicas to the new node n4.
func testPlan() *nornv1.Plan {
	return &nornv1.Plan{
		Moves: []*nornv1.MoveStatus{move(3, "n1", "n4", "queued", ""), move(12, "n2", "n4", "queued", "")},
		Loads: []*nornv1.NodeLoad{
			{NodeId: "n1", Before: 8, After: 7, Role: "member"},
			{NodeId: "n2", Before: 8, After: 7, Role: "member"},
			{NodeId: "n3", Before: 8, After: 8, Role: "member"},
			{NodeId: "n4", Before: 0, After: 2, Role: "member"},
		},
		RingEpoch: 12,
	}
}

// statusWith is a Status answer of node n1 at ring epoch 13 with moves.
func statusWith(moves ...*nornv1.MoveStatus) *nornv1.StatusResponse {
	return &nornv1.StatusResponse{NodeId: "n1", RingEpoch: 13, Moves: moves}
}

// progress is a rebalance of testPlan going well: p3 fills, catches up and
// is done while p12 waits, then p12 follows.
func progress() []*nornv1.StatusResponse {
	return []*nornv1.StatusResponse{
		statusWith(move(3, "n1", "n4", "filling", ""), move(12, "n2", "n4", "queued", "")),
		statusWith(move(3, "n1", "n4", "filling", ""), move(12, "n2", "n4", "queued", "")), // no change
		statusWith(move(3, "n1", "n4", "catching-up", ""), move(12, "n2", "n4", "queued", "")),
		statusWith(move(3, "n1", "n4", "done", ""), move(12, "n2", "n4", "filling", "")),
		statusWith(move(3, "n1", "n4", "done", ""), move(12, "n2", "n4", "done", "")),
	}
}

func wantCalls(t *testing.T, f *fakeAdmin, want ...string) {
	t.Helper()
	if got := f.called(); !slices.Equal(got, want) {
		t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func mustNotContain(t *testing.T, what, got string, unwanted ...string) {
	t.Helper()
	for _, u := range unwanted {
		if strings.Contains(got, u) {
			t.Errorf("%s contains %q:\n%s", what, u, got)
		}
	}
}

const question = "apply this plan? [y/N] "

func TestRebalanceDryRun(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	r := runFake(t, f, "", "rebalance", "--dry-run")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	mustContain(t, "rebalance --dry-run", r.stdout,
		"PARTITION  FROM  TO\n3          n1    n4\n12         n2    n4\n",
		"moving 2 of 24 replicas",
		"NODE  ROLE    BEFORE  AFTER\nn1    member  8       7\n",
		"n4    member  0       2\n")
	mustNotContain(t, "rebalance --dry-run stderr", r.stderr, question)
	wantCalls(t, f, "Rebalance apply=false")
}

func TestRebalanceBalanced(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = &nornv1.Plan{Loads: testPlan().Loads, RingEpoch: 12}
	r := runFake(t, f, "y\n", "rebalance")
	if r.code != 0 || r.stdout != balancedMsg+"\n" || r.stderr != "" {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 0 and %q", r.code, r.stdout, r.stderr, balancedMsg)
	}
	wantCalls(t, f, "Rebalance apply=false")
}

// TestRebalanceAnswers checks which answers to the question apply the plan.
func TestRebalanceAnswers(t *testing.T) {
	tests := []struct {
		stdin string
		apply bool
	}{
		{"y\n", true},
		{"yes\n", true},
		{" YES \r\n", true},
		{"Y", true}, // no newline before the end of input
		{"n\n", false},
		{"\n", false},
		{"", false},
		{"yep\n", false},
		{"no\ny\n", false}, // only the first line counts
	}
	for _, tc := range tests {
		f := newFakeAdmin(t)
		f.plan = testPlan()
		r := runFake(t, f, tc.stdin, "rebalance", "--watch=false")
		if !strings.Contains(r.stderr, question) {
			t.Errorf("stdin %q: stderr %q does not ask %q", tc.stdin, r.stderr, question)
		}
		mustContain(t, fmt.Sprintf("stdin %q: stdout", tc.stdin), r.stdout, "PARTITION  FROM  TO", "moving 2 of 24 replicas")
		if !tc.apply {
			if r.code != 1 || !strings.Contains(r.stderr, "nornctl: rebalance: not applied") {
				t.Errorf("stdin %q: exit %d, stderr %q; want exit 1, not applied", tc.stdin, r.code, r.stderr)
			}
			wantCalls(t, f, "Rebalance apply=false")
			continue
		}
		if r.code != 0 {
			t.Errorf("stdin %q: exit %d: %s", tc.stdin, r.code, r.stderr)
		}
		mustContain(t, fmt.Sprintf("stdin %q: stdout", tc.stdin), r.stdout, "queued 2 moves at ring epoch 12")
		wantCalls(t, f, "Rebalance apply=false", "Rebalance apply=true")
	}
}

// TestRebalanceWatch applies with a yes answer and watches the moves to
// their end: one line per change, none for a poll that changes nothing.
func TestRebalanceWatch(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	f.statuses = progress()
	r := runFake(t, f, "y\n", "rebalance")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	want := "queued 2 moves at ring epoch 12\n" +
		"watching 2 moves (Ctrl-C stops watching, not the moves)\n" +
		"p3 n1 -> n4: filling\n" +
		"p3 n1 -> n4: catching-up\n" +
		"p3 n1 -> n4: done\n" +
		"p12 n2 -> n4: filling\n" +
		"p12 n2 -> n4: done\n" +
		"2 of 2 moves done\n"
	if !strings.HasSuffix(r.stdout, want) {
		t.Errorf("stdout ends:\n%s\nwant:\n%s", r.stdout, want)
	}
	// The plan printed once, before the question: the applied one is the same.
	if n := strings.Count(r.stdout, "PARTITION  FROM  TO"); n != 1 {
		t.Errorf("the plan printed %d times, want once:\n%s", n, r.stdout)
	}
	wantCalls(t, f, "Rebalance apply=false", "Rebalance apply=true", "Status", "Status", "Status", "Status", "Status")
}

// TestRebalanceYes applies without asking, and prints the applied plan.
func TestRebalanceYes(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	f.statuses = progress()
	r := runFake(t, f, "", "rebalance", "--yes")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	mustNotContain(t, "rebalance --yes stderr", r.stderr, question)
	mustContain(t, "rebalance --yes", r.stdout, "PARTITION  FROM  TO\n3          n1    n4\n", "queued 2 moves", "2 of 2 moves done")
	if n := strings.Count(r.stdout, "PARTITION  FROM  TO"); n != 1 {
		t.Errorf("the plan printed %d times, want once:\n%s", n, r.stdout)
	}
	wantCalls(t, f, "Rebalance apply=false", "Rebalance apply=true", "Status", "Status", "Status", "Status", "Status")
}

// TestRebalanceChangedPlan: the ring changed between the question and the
// apply, so the node applied another plan; it is printed and watched.
func TestRebalanceChangedPlan(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	f.applied = testPlan()
	f.applied.Moves = []*nornv1.MoveStatus{move(5, "n3", "n4", "queued", "")}
	f.applied.RingEpoch = 13
	f.statuses = []*nornv1.StatusResponse{statusWith(move(5, "n3", "n4", "done", ""))}
	r := runFake(t, f, "y\n", "rebalance")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	mustContain(t, "rebalance", r.stdout,
		"the ring changed since the plan above was made; the node applied this plan:\n\nPARTITION  FROM  TO\n5          n3    n4\n",
		"queued 1 move at ring epoch 13", "p5 n3 -> n4: done", "1 of 1 move done")
}

// TestRebalanceWatchFailed ends the watch with exit 1 when a move failed,
// once every move has ended; the error of a step being retried is shown.
func TestRebalanceWatchFailed(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	f.statuses = []*nornv1.StatusResponse{
		statusWith(move(3, "n1", "n4", "filling", "n4: connection refused"), move(12, "n2", "n4", "filling", "")),
		statusWith(move(3, "n1", "n4", "failed", "n4 unreachable for 5m"), move(12, "n2", "n4", "catching-up", "")),
		statusWith(move(3, "n1", "n4", "failed", "n4 unreachable for 5m"), move(12, "n2", "n4", "done", "")),
	}
	r := runFake(t, f, "", "rebalance", "--yes")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1: %s", r.code, r.stderr)
	}
	mustContain(t, "stdout", r.stdout,
		"p3 n1 -> n4: filling (n4: connection refused)\n",
		"p3 n1 -> n4: failed (n4 unreachable for 5m)\n",
		"p12 n2 -> n4: done\n")
	mustNotContain(t, "stdout", r.stdout, "moves done")
	mustContain(t, "stderr", r.stderr, "nornctl: rebalance: 1 of 2 moves failed")
	wantCalls(t, f, "Rebalance apply=false", "Rebalance apply=true", "Status", "Status", "Status")
}

// TestRebalanceWatchStatusErrors: the watch rides out failed Status calls,
// and gives up after maxWatchErrors in a row.
func TestRebalanceWatchStatusErrors(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	f.statuses = []*nornv1.StatusResponse{statusWith(move(3, "n1", "n4", "done", ""), move(12, "n2", "n4", "done", ""))}
	f.statusErrs = maxWatchErrors - 1
	r := runFake(t, f, "", "rebalance", "--yes")
	if r.code != 0 || strings.Count(r.stderr, "UNAVAILABLE: node restarting (retrying)") != maxWatchErrors-1 {
		t.Errorf("exit %d, stderr %q; want exit 0 after %d retries", r.code, r.stderr, maxWatchErrors-1)
	}
	mustContain(t, "stdout", r.stdout, "2 of 2 moves done")

	f = newFakeAdmin(t)
	f.plan = testPlan()
	f.statusErrs = maxWatchErrors
	r = runFake(t, f, "", "rebalance", "--yes")
	if r.code != 1 || !strings.Contains(r.stderr, "watching the moves: UNAVAILABLE: node restarting") {
		t.Errorf("exit %d, stderr %q; want exit 1 after %d failures", r.code, r.stderr, maxWatchErrors)
	}
}

// TestRebalanceWatchReplaced: the node's ring reached the plan's epoch
// without the plan's moves, so a later plan replaced them; a ring behind
// the plan's epoch is waited for.
func TestRebalanceWatchReplaced(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	f.statuses = []*nornv1.StatusResponse{
		{NodeId: "n1", RingEpoch: 11, Moves: []*nornv1.MoveStatus{move(7, "n1", "n2", "done", "")}}, // behind
		{NodeId: "n1", RingEpoch: 15, Moves: []*nornv1.MoveStatus{move(3, "n1", "n4", "done", ""), move(9, "n2", "n3", "filling", "")}},
	}
	r := runFake(t, f, "", "rebalance", "--yes")
	if r.code != 1 || !strings.Contains(r.stderr, "lacks 1 of the plan's 2 moves: a later plan replaced it") {
		t.Errorf("exit %d, stderr %q; want exit 1, replaced", r.code, r.stderr)
	}
	wantCalls(t, f, "Rebalance apply=false", "Rebalance apply=true", "Status", "Status")
}

// blockingStdin is a terminal nobody answers: Read cancels the run's
// context (Ctrl-C), then blocks until the test ends.
type blockingStdin struct {
	cancel context.CancelFunc
	done   <-chan struct{}
}

func (b blockingStdin) Read([]byte) (int, error) {
	b.cancel()
	<-b.done
	return 0, io.EOF
}

// TestRebalanceInterrupted: Ctrl-C at the question applies nothing, and
// during the watch stops the watch only.
func TestRebalanceInterrupted(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	defer close(done)
	r := runFakeCtx(ctx, f, blockingStdin{cancel, done}, "rebalance")
	if r.code != 1 || !strings.Contains(r.stderr, "nornctl: rebalance: not applied: interrupted") {
		t.Errorf("Ctrl-C at the question: exit %d, stderr %q", r.code, r.stderr)
	}
	wantCalls(t, f, "Rebalance apply=false")

	f = newFakeAdmin(t)
	f.plan = testPlan()
	f.statuses = progress()
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	f.onStatus = func() {
		if len(f.calls) == 2+3 { // the third Status call
			cancel()
		}
	}
	r = runFakeCtx(ctx, f, strings.NewReader(""), "rebalance", "--yes")
	if r.code != 1 || !strings.Contains(r.stderr, "stopped watching: context canceled; the moves go on") {
		t.Errorf("Ctrl-C in the watch: exit %d, stderr %q", r.code, r.stderr)
	}
	mustContain(t, "stdout", r.stdout, "p3 n1 -> n4: filling\n")
	mustNotContain(t, "stdout", r.stdout, "catching-up")
}

func TestRebalanceNoWatch(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	r := runFake(t, f, "", "rebalance", "--yes", "--watch=false")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	mustNotContain(t, "stdout", r.stdout, "watching")
	wantCalls(t, f, "Rebalance apply=false", "Rebalance apply=true")
}

// TestRebalanceJSON: -o json prints one document on stdout, the dry run's
// or the applied one's; the plan shown with the question, the question and
// the watch go to stderr.
func TestRebalanceJSON(t *testing.T) {
	decode := func(t *testing.T, out string) *nornv1.RebalanceResponse {
		t.Helper()
		var resp nornv1.RebalanceResponse
		if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
			t.Fatalf("stdout is not a RebalanceResponse: %v\n%s", err, out)
		}
		return &resp
	}
	t.Run("dry-run", func(t *testing.T) {
		f := newFakeAdmin(t)
		f.plan = testPlan()
		r := runFake(t, f, "", "-o", "json", "rebalance", "--dry-run")
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if resp := decode(t, r.stdout); resp.GetPlan().GetApplied() || !proto.Equal(resp.GetPlan(), testPlan()) {
			t.Errorf("got %v, want the unapplied plan", resp)
		}
		mustContain(t, "stdout", r.stdout, `"ringEpoch":"12"`, `"fromNode":"n1"`)
	})
	t.Run("yes", func(t *testing.T) {
		f := newFakeAdmin(t)
		f.plan = testPlan()
		f.statuses = progress()
		r := runFake(t, f, "", "rebalance", "--yes", "-o", "json")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if resp := decode(t, r.stdout); !resp.GetPlan().GetApplied() || len(resp.GetPlan().GetMoves()) != 2 {
			t.Errorf("got %v, want the applied plan", resp)
		}
		mustNotContain(t, "stderr", r.stderr, question)
		mustContain(t, "stderr", r.stderr, "p3 n1 -> n4: catching-up\n", "2 of 2 moves done\n")
	})
	t.Run("asked", func(t *testing.T) {
		f := newFakeAdmin(t)
		f.plan = testPlan()
		r := runFake(t, f, "y\n", "rebalance", "-o", "json", "--watch=false")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		decode(t, r.stdout)
		mustContain(t, "stderr", r.stderr, "PARTITION  FROM  TO", "moving 2 of 24 replicas", question)
		mustNotContain(t, "stdout", r.stdout, "PARTITION")
	})
	t.Run("not applied", func(t *testing.T) {
		f := newFakeAdmin(t)
		f.plan = testPlan()
		r := runFake(t, f, "n\n", "rebalance", "-o", "json")
		if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "not applied") {
			t.Errorf("exit %d, stdout %q, stderr %q; want exit 1, nothing on stdout", r.code, r.stdout, r.stderr)
		}
	})
}

func TestRebalanceStatus(t *testing.T) {
	f := newFakeAdmin(t)
	f.statuses = []*nornv1.StatusResponse{statusWith(
		move(3, "n1", "n4", "done", ""),
		move(5, "n1", "n4", "failed", "no quorum\nfor 5m"),
		move(12, "n2", "n4", "catching-up", ""),
	)}
	r := runFake(t, f, "", "rebalance", "status")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	want := "PARTITION  FROM  TO  STATE        ERROR\n" +
		"3          n1    n4  done         -\n" +
		"5          n1    n4  failed       no quorum for 5m\n" +
		"12         n2    n4  catching-up  -\n" +
		"\n1 of 3 moves done, 1 failed\n"
	if r.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
	}

	f = newFakeAdmin(t)
	if r := runFake(t, f, "", "rebalance", "status"); r.code != 0 || r.stdout != "no rebalance under way\n" {
		t.Errorf("no moves: exit %d, stdout %q", r.code, r.stdout)
	}

	f = newFakeAdmin(t)
	f.statuses = []*nornv1.StatusResponse{statusWith(move(3, "n1", "n4", "done", ""))}
	r = runFake(t, f, "", "rebalance", "status", "-o", "json")
	var st nornv1.StatusResponse
	if err := protojson.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 0 || len(st.GetMoves()) != 1 {
		t.Errorf("-o json: exit %d, %v: %s", r.code, err, r.stdout)
	}
}

// TestNodePlans covers drain, decommission and remove: the node and the
// flags reach the request, the plan is applied, and a plan with no move
// is still applied (it changes the node's role).
func TestNodePlans(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want proto.Message // the applying request
	}{
		{[]string{"drain", "n2"}, &nornv1.DrainRequest{Node: "n2", Apply: true}},
		{[]string{"decommission", "10.0.0.2:7400"}, &nornv1.DecommissionRequest{Node: "10.0.0.2:7400", Apply: true}},
		{[]string{"remove", "--dead", "n2"}, &nornv1.RemoveRequest{Node: "n2", Dead: true, Apply: true}},
		{[]string{"remove", "n2", "--dead"}, &nornv1.RemoveRequest{Node: "n2", Dead: true, Apply: true}},
	} {
		name := strings.Join(tc.args, " ")
		f := newFakeAdmin(t)
		f.plan = testPlan()
		f.statuses = progress()
		r := runFake(t, f, "yes\n", tc.args...)
		if r.code != 0 {
			t.Errorf("%s: exit %d: %s", name, r.code, r.stderr)
			continue
		}
		mustContain(t, name, r.stdout, "moving 2 of 24 replicas", "queued 2 moves", "2 of 2 moves done")
		reqs := f.requests()
		if len(reqs) != 2 || !proto.Equal(reqs[1], tc.want) {
			t.Errorf("%s: requests %v, want the second %v", name, reqs, tc.want)
		}
		dry := proto.Clone(tc.want)
		dry.ProtoReflect().Clear(dry.ProtoReflect().Descriptor().Fields().ByName("apply"))
		if len(reqs) > 0 && !proto.Equal(reqs[0], dry) {
			t.Errorf("%s: first request %v, want %v", name, reqs[0], dry)
		}
	}

	// Draining an empty node moves nothing and is still applied.
	f := newFakeAdmin(t)
	f.plan = &nornv1.Plan{Loads: []*nornv1.NodeLoad{{NodeId: "n4", Role: "draining"}}, RingEpoch: 20}
	r := runFake(t, f, "", "drain", "n4", "--yes")
	if r.code != 0 {
		t.Fatalf("drain of an empty node: exit %d: %s", r.code, r.stderr)
	}
	mustContain(t, "drain of an empty node", r.stdout, "no replica moves", "n4    draining  0       0", "applied at ring epoch 20; nothing to move")
	wantCalls(t, f, "Drain apply=false", "Drain apply=true")

	// --dry-run does not apply; n does not either.
	f = newFakeAdmin(t)
	f.plan = testPlan()
	if r := runFake(t, f, "", "decommission", "n2", "--dry-run"); r.code != 0 {
		t.Errorf("decommission --dry-run: exit %d: %s", r.code, r.stderr)
	}
	if r := runFake(t, f, "n\n", "decommission", "n2"); r.code != 1 || !strings.Contains(r.stderr, "not applied") {
		t.Errorf("decommission answered n: exit %d: %s", r.code, r.stderr)
	}
	wantCalls(t, f, "Decommission apply=false", "Decommission apply=false")
}

func TestPlacementErrors(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = testPlan()
	usage := []struct {
		name string
		args []string
		msg  string
	}{
		{"remove without --dead", []string{"remove", "n2"}, "remove is only for a node gone for good, which --dead confirms; a live node is decommissioned instead: nornctl decommission n2"},
		{"drain without node", []string{"drain"}, "want <node>"},
		{"decommission of two nodes", []string{"decommission", "n1", "n2"}, `unexpected argument "n2"`},
		{"empty node", []string{"join", " "}, "node: empty"},
		{"node URL", []string{"drain", "http://10.0.0.1:7400"}, "not a URL"},
		{"dry-run and yes", []string{"rebalance", "--dry-run", "--yes"}, "--dry-run and --yes"},
		{"rebalance argument", []string{"rebalance", "now"}, `unexpected argument "now"`},
		{"rebalance status flags", []string{"rebalance", "status", "--yes", "--watch=false"}, "rebalance status takes no --watch, --yes"},
	}
	for _, tc := range usage {
		r := runFake(t, f, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.msg) || !strings.Contains(r.stderr, "usage: nornctl "+tc.args[0]) {
			t.Errorf("%s: exit %d, stderr %q; want exit 2, %q and the usage", tc.name, r.code, r.stderr, tc.msg)
		}
	}
	wantCalls(t, f) // none reached the node

	// The server's refusal is exit 1 with its code.
	f.placeErr = connect.NewError(connect.CodeFailedPrecondition, errors.New("n2 is alive as gossip sees it"))
	r := runFake(t, f, "", "remove", "n2", "--dead", "--yes")
	if r.code != 1 || r.stderr != "nornctl: remove: FAILED_PRECONDITION: n2 is alive as gossip sees it\n" {
		t.Errorf("refused remove: exit %d, stderr %q", r.code, r.stderr)
	}
	// An apply that failed unanswered may have been applied.
	f.placeErr = nil
	f.applyErr = connect.NewError(connect.CodeUnavailable, errors.New("leader lost"))
	r = runFake(t, f, "", "rebalance", "--yes")
	if r.code != 1 || r.stderr != "nornctl: rebalance: UNAVAILABLE: leader lost (the plan may have been applied: see `nornctl rebalance status`)\n" {
		t.Errorf("failed apply: exit %d, stderr %q", r.code, r.stderr)
	}
	f.applyErr = nil

	// Help.
	for _, name := range []string{"join", "rebalance", "drain", "decommission", "remove"} {
		r := runFake(t, f, "", name, "-h")
		if r.code != 0 || !strings.Contains(r.stdout, "usage: nornctl "+name) {
			t.Errorf("%s -h: exit %d, stdout %q", name, r.code, r.stdout)
		}
	}
	mustContain(t, "rebalance -h", runFake(t, f, "", "rebalance", "-h").stdout, "-dry-run", "-yes", "-watch", "rebalance status")
	mustContain(t, "remove -h", runFake(t, f, "", "remove", "-h").stdout, "-dead")
	mustContain(t, "help", runFake(t, f, "", "help").stdout, "join", "rebalance", "drain", "decommission", "remove")
}

func TestErrorMessage(t *testing.T) {
	unavailable := connect.NewError(connect.CodeUnavailable, errors.New("leader lost"))
	tests := []struct {
		err  error
		want string
	}{
		{unavailable, "UNAVAILABLE: leader lost"},
		{connect.NewError(connect.CodeNotFound, nil), "NOT_FOUND"},
		{fmt.Errorf("watching the moves: %w (they go on)", unavailable), "watching the moves: UNAVAILABLE: leader lost (they go on)"},
		{errNotApplied, "not applied"},
	}
	for _, tc := range tests {
		if got := errorMessage(tc.err); got != tc.want {
			t.Errorf("errorMessage(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestJoin(t *testing.T) {
	f := newFakeAdmin(t)
	f.join = &nornv1.JoinResponse{NodeId: "n4", RingEpoch: 12, MetaVoter: true}
	r := runFake(t, f, "", "join", "10.0.0.4:7400")
	want := "joined n4 at ring epoch 12; meta voter: yes\nrun `nornctl rebalance` to move partitions to it\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("exit %d, stdout %q; want %q (stderr %q)", r.code, r.stdout, want, r.stderr)
	}
	wantCalls(t, f, "Join 10.0.0.4:7400")

	r = runFake(t, f, "", "join", "n4", "-o", "json")
	var resp nornv1.JoinResponse
	if err := protojson.Unmarshal([]byte(r.stdout), &resp); err != nil || !proto.Equal(&resp, f.join) {
		t.Errorf("-o json: %v: %s", err, r.stdout)
	}
}

// TestStatusPlacement: status shows each node's role and replicas, and a
// rebalance's progress while it has moves not done.
func TestStatusPlacement(t *testing.T) {
	f := newFakeAdmin(t)
	nodes := []*nornv1.NodeStatus{
		{Id: "n1", ApiAddress: "10.0.0.1:7400", State: "alive", Role: "member", Replicas: 8},
		{Id: "n2", ApiAddress: "10.0.0.2:7400", State: "alive", Role: "draining", Replicas: 3},
		{Id: "n5", ApiAddress: "10.0.0.5:7400", State: "alive", Role: "not a member"},
	}
	f.statuses = []*nornv1.StatusResponse{{NodeId: "n1", Healthy: true, Nodes: nodes,
		Moves: []*nornv1.MoveStatus{move(3, "n2", "n1", "done", ""), move(4, "n2", "n1", "filling", "")}}}
	r := runFake(t, f, "", "status")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	mustContain(t, "status", r.stdout,
		"NODE  ADDRESS        STATE  ROLE          REPLICAS  CLOCK OFFSET  FROM MEDIAN\n",
		"n2    10.0.0.2:7400  alive  draining      3         -             -\n",
		"n5    10.0.0.5:7400  alive  not a member  0 ",
		"\nrebalance: 1 of 2 moves done (see `nornctl rebalance status`)\n")

	f.setStatuses(&nornv1.StatusResponse{NodeId: "n1", Healthy: true, Nodes: nodes,
		Moves: []*nornv1.MoveStatus{move(3, "n2", "n1", "done", "")}})
	mustNotContain(t, "status with every move done", runFake(t, f, "", "status").stdout, "rebalance:")
}

// TestRebalanceCancel cancels the moves and watches the rolled back one
// end; the promoted one finishes.
func TestRebalanceCancel(t *testing.T) {
	f := newFakeAdmin(t)
	f.plan = &nornv1.Plan{RingEpoch: 14, Moves: []*nornv1.MoveStatus{
		move(3, "n1", "n4", "rolling-back", "rolling back: cancelled"),
		move(7, "n3", "n4", "promoted", ""),
		move(12, "n2", "n4", "failed", "cancelled"),
	}}
	f.statuses = []*nornv1.StatusResponse{
		statusWith(move(3, "n1", "n4", "rolling-back", "rolling back: cancelled"), move(7, "n3", "n4", "done", ""), move(12, "n2", "n4", "failed", "cancelled")),
		statusWith(move(3, "n1", "n4", "failed", "rolled back: cancelled"), move(7, "n3", "n4", "done", ""), move(12, "n2", "n4", "failed", "cancelled")),
	}
	r := runFake(t, f, "", "rebalance", "cancel")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	mustContain(t, "stdout", r.stdout,
		"rolling-back", // the table
		"p7 n3 -> n4: done\n",
		"p3 n1 -> n4: failed (rolled back: cancelled)\n",
		"no move under way: 1 of 3 moves done, 2 failed")
	wantCalls(t, f, "Rebalance cancel apply=false", "Status", "Status")

	f = newFakeAdmin(t)
	f.plan = &nornv1.Plan{Moves: []*nornv1.MoveStatus{move(3, "n1", "n4", "rolling-back", "")}}
	r = runFake(t, f, "", "rebalance", "cancel", "--watch=false")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	wantCalls(t, f, "Rebalance cancel apply=false")
	if r := runFake(t, f, "", "rebalance", "cancel", "--dry-run"); r.code != 2 {
		t.Fatalf("cancel --dry-run: exit %d, want 2 (usage)", r.code)
	}
}
