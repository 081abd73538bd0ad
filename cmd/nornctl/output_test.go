package main

import (
	"bytes"
	"strings"
	"testing"

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
