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
