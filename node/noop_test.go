package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestNoSilentNoOps: a call under a claim that would change what an
// earlier one under the same claim decided is refused (FAILED_PRECONDITION,
// saying why) rather than answered OK with nothing changed, while the same
// call again is a retry, answered as the first; and a claim id that is not
// the live claim says what became of it (expired, ended, never issued).
func TestNoSilentNoOps(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	claim := func(lease time.Duration) *nornv1.ClaimedTask {
		t.Helper()
		h.enqueue(&nornv1.TaskSpec{Queue: "q"})
		got := h.claim("q", 1, lease)
		if len(got) != 1 {
			t.Fatalf("claimed %d tasks", len(got))
		}
		return got[0]
	}
	refused := func(err error, says string) {
		t.Helper()
		wantCode(t, err, connect.CodeFailedPrecondition)
		if !strings.Contains(err.Error(), says) || strings.Count(err.Error(), "failed_precondition") != 1 {
			t.Fatalf("%v: want it to say %q, and its code once", err, says)
		}
	}

	// Complete: the same result again is a retry; another result is refused.
	c := claim(time.Minute)
	complete := func(result string) error {
		_, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: c.Task.Id, ClaimId: c.ClaimId, Result: []byte(result)}))
		return err
	}
	if err := complete("first"); err != nil {
		t.Fatal(err)
	}
	if err := complete("first"); err != nil {
		t.Fatalf("the same complete again: %v", err)
	}
	refused(complete("second"), "with other result")
	if got := h.get(c.Task.Id); string(got.Result) != "first" {
		t.Fatalf("result %q after a refused second complete", got.Result)
	}

	// Abort: other errors are refused.
	c = claim(time.Minute)
	abort := func(code string) error {
		_, err := h.api.Abort(ctx, connect.NewRequest(&nornv1.AbortRequest{Id: c.Task.Id, ClaimId: c.ClaimId, Errors: []*nornv1.TaskError{{Code: code}}}))
		return err
	}
	if err := abort("a"); err != nil {
		t.Fatal(err)
	}
	if err := abort("a"); err != nil {
		t.Fatalf("the same abort again: %v", err)
	}
	refused(abort("b"), "with other errors")

	// Update: the same seq with other content is refused.
	c = claim(time.Minute)
	update := func(seq uint64, progress float64) error {
		_, err := h.api.Update(ctx, connect.NewRequest(&nornv1.UpdateRequest{Id: c.Task.Id, ClaimId: c.ClaimId, Seq: seq, Progress: progress}))
		return err
	}
	if err := update(1, 0.25); err != nil {
		t.Fatal(err)
	}
	if err := update(1, 0.25); err != nil {
		t.Fatalf("the same update again: %v", err)
	}
	refused(update(1, 0.5), "seq: update 1")
	if err := update(2, 0.5); err != nil {
		t.Fatal(err)
	}
	if got := h.get(c.Task.Id); got.Progress != 0.5 || len(got.Updates) != 2 {
		t.Fatalf("progress %v, %d updates", got.Progress, len(got.Updates))
	}

	// A claim id never issued for the task, and one that expired.
	renew := func(claimID uint64) error {
		_, err := h.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: c.Task.Id, ClaimId: claimID, Lease: durationpb.New(time.Minute)}))
		return err
	}
	refused(renew(c.ClaimId+1000), "never issued")
	_, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: c.Task.Id, ClaimId: c.ClaimId + 1000}))
	refused(err, "never issued")
	short := claim(time.Second)
	h.clock.advance(time.Second + testSkew + time.Millisecond)
	h.node.dispatch.MonitorOnce()
	_, err = h.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: short.Task.Id, ClaimId: short.ClaimId}))
	refused(err, "expired")
	_, err = h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: short.Task.Id, ClaimId: short.ClaimId}))
	refused(err, "expired")
}
