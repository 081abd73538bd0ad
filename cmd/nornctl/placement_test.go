package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

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

// TestStatusPlacement: status shows each node's role, replicas, leader
// count and fair share of leaderships, and a rebalance's progress while
// it has moves not done.
func TestStatusPlacement(t *testing.T) {
	f := newFakeAdmin(t)
	nodes := []*nornv1.NodeStatus{
		{Id: "n1", ApiAddress: "10.0.0.1:7400", State: "alive", Role: "member", Replicas: 8, Leaders: 5, LeaderShare: 11.0 / 3},
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
		"NODE  ADDRESS        STATE  ROLE          REPLICAS  LEADS  FAIR SHARE  CLOCK OFFSET  FROM MEDIAN  ACCESS\n",
		"n1    10.0.0.1:7400  alive  member        8         5      3.7         -             -            ?\n",
		"n2    10.0.0.2:7400  alive  draining      3         0      0.0         -             -            ?\n",
		"n5    10.0.0.5:7400  alive  not a member  0 ",
		"\nrebalance: 1 of 2 moves done (see `nornctl rebalance status`)\n")

	f.setStatuses(&nornv1.StatusResponse{NodeId: "n1", Healthy: true, Nodes: nodes,
		Moves: []*nornv1.MoveStatus{move(3, "n2", "n1", "done", "")}})
	mustNotContain(t, "status with every move done", runFake(t, f, "", "status").stdout, "rebalance:")
}
