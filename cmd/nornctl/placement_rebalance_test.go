package main

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

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
