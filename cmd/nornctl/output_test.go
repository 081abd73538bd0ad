package main

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestWriteTaskClaimStateUnknown: `nornctl get` of a task read without its
// partition's leader marks the status as uncertain and says why; a task
// read with it shows the status plainly.
func TestWriteTaskClaimStateUnknown(t *testing.T) {
	for _, unknown := range []bool{false, true} {
		var b bytes.Buffer
		writeTask(&b, &nornv1.Task{Id: 7, Spec: &nornv1.TaskSpec{Queue: "q"}, Status: nornv1.TaskStatus_TASK_STATUS_READY, ClaimStateUnknown: unknown})
		line := ""
		for l := range strings.Lines(b.String()) {
			if strings.HasPrefix(l, "STATUS:") {
				line = strings.TrimSpace(l)
			}
		}
		want := "STATUS:\tREADY"
		if unknown {
			want = "STATUS:\tREADY? (claim state unknown: no leader of its partition answered; read again)"
		}
		if line != want {
			t.Errorf("unknown=%v: %q, want %q", unknown, line, want)
		}
	}
}

// TestWriteStatusShowsWhatIsKnown: with a node dead, its gossiped
// leaderships are not shown as current (they would add up past the
// partitions), replicas that answered and agree read as agreeing with
// the dead one unknown (not DIFFER), and the counts have a total row
// that says when it covers only some partitions.
func TestWriteStatusShowsWhatIsKnown(t *testing.T) {
	root := func(node string, r uint64, err string) *nornv1.ReplicaRoot {
		return &nornv1.ReplicaRoot{NodeId: node, Root: r, Error: err}
	}
	st := &nornv1.StatusResponse{NodeId: "n1", PartitionCount: 3,
		Security: &nornv1.SecurityStatus{Tls: true, AccessControl: true, AccessDigest: "3f2a9c1b0d4e"},
		Nodes: []*nornv1.NodeStatus{
			{Id: "n1", State: "alive", Role: "member", Leaders: 2, Replicas: 2},
			{Id: "n2", State: "alive", Role: "member", Leaders: 1, Replicas: 2, Security: &nornv1.SecurityStatus{Tls: true}},
			{Id: "n3", State: "dead", Role: "member", Leaders: 3, Replicas: 2},
		},
		Partitions: []*nornv1.PartitionStatus{
			{Id: 0, Leader: "n1", Counts: map[string]uint64{"READY": 2},
				ReplicaRoots: []*nornv1.ReplicaRoot{root("n1", 0xabcdef0123456789, ""), root("n2", 0xabcdef0123456789, ""), root("n3", 0, "unreachable")}},
			{Id: 1, Leader: "n1", Counts: map[string]uint64{"READY": 3, "COMPLETED": 1},
				ReplicaRoots: []*nornv1.ReplicaRoot{root("n1", 0x1111111111111111, ""), root("n2", 0x2222222222222222, ""), root("n3", 0, "unreachable")}},
		},
	}
	var b bytes.Buffer
	tw := newTabWriter(&b)
	writeStatus(tw, st)
	tw.Flush()
	out := b.String()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^n1 .* alive +member +2 +2 .* tls, rules 3f2a9c1b0d4e$`),
		regexp.MustCompile(`(?m)^n2 .* tls, open$`),
		regexp.MustCompile(`(?m)^n3 .* dead +member +2 +- +- .* \?$`),
		regexp.MustCompile(`(?m)^WARNING: the nodes' security settings differ \(n2: tls, open; n1: tls, rules 3f2a9c1b0d4e\)`),
		regexp.MustCompile(`(?m)^0 .*agree abcdef01 \(n3 unknown\)`),
		regexp.MustCompile(`(?m)^1 .*DIFFER n1:11111111,n2:22222222,n3:\?`),
		regexp.MustCompile(`(?m)^TOTAL \(2 of 3 partitions\) +.* 5 `),
	} {
		if !want.MatchString(out) {
			t.Errorf("status lacks %s:\n%s", want, out)
		}
	}
}

// TestCommandErrorSaysItsPrefixOnce: "nornctl: renew: " is not followed by
// the client's own "norn: renew: ".
func TestCommandErrorSaysItsPrefixOnce(t *testing.T) {
	err := fmt.Errorf("norn: renew: %w", connect.NewError(connect.CodeFailedPrecondition, errors.New("claimId: 4 is not the live claim")))
	if got := commandError("renew", err); got != "FAILED_PRECONDITION: claimId: 4 is not the live claim" {
		t.Fatalf("commandError = %q", got)
	}
	if got := commandError("get", errors.New("norn: dial: refused")); got != "dial: refused" {
		t.Fatalf("commandError = %q", got)
	}
}
