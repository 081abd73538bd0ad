package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
)

// failover is how many attempts of a call on a claim the tests answer
// UNAVAILABLE: more than RetryPolicy's default attempts (5), as a
// partition's failover does for its one to three seconds.
const failover = 3 * client.DefaultMaxAttempts

// TestClaimCallsOutlastAFailover: every call on a claim (Renew, Update,
// Complete, Abort, Yield) goes on retrying UNAVAILABLE past the policy's
// attempts while the claim's lease lasts, and then takes effect: a
// result is not thrown away because the task's partition was between
// leaders. (Before, each gave up after 5 attempts.)
func TestClaimCallsOutlastAFailover(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	ctx := t.Context()
	for _, tc := range []struct {
		method string
		call   func(ct *nornv1.ClaimedTask) error
		want   nornv1.TaskStatus
	}{
		{"Renew", func(ct *nornv1.ClaimedTask) error {
			_, err := c.Renew(ctx, ct.GetTask().GetId(), ct.GetClaimId(), time.Minute)
			return err
		}, nornv1.TaskStatus_TASK_STATUS_CLAIMED},
		{"Update", func(ct *nornv1.ClaimedTask) error {
			return c.Update(ctx, &nornv1.UpdateRequest{Id: ct.GetTask().GetId(), ClaimId: ct.GetClaimId(), Seq: 1, Progress: 0.5})
		}, nornv1.TaskStatus_TASK_STATUS_CLAIMED},
		{"Complete", func(ct *nornv1.ClaimedTask) error {
			return c.Complete(ctx, ct.GetTask().GetId(), ct.GetClaimId(), []byte("r"))
		}, nornv1.TaskStatus_TASK_STATUS_COMPLETED},
		{"Abort", func(ct *nornv1.ClaimedTask) error {
			return c.Abort(ctx, ct.GetTask().GetId(), ct.GetClaimId(), &nornv1.TaskError{Code: "x"})
		}, nornv1.TaskStatus_TASK_STATUS_ABORTED},
		{"Yield", func(ct *nornv1.ClaimedTask) error {
			return c.Yield(ctx, ct.GetTask().GetId(), ct.GetClaimId(), 0.5)
		}, nornv1.TaskStatus_TASK_STATUS_READY},
	} {
		ct := claimOne(t, c)
		f.setInject(failFirst(tc.method, failover, errUnavailable))
		before := f.count(tc.method)
		if err := tc.call(ct); err != nil {
			t.Errorf("%s through a failover: %v", tc.method, err)
		}
		if n := f.count(tc.method) - before; n != failover+1 {
			t.Errorf("%s: %d attempts, want %d", tc.method, n, failover+1)
		}
		if got := f.task(ct.GetTask().GetId()).GetStatus(); got != tc.want {
			t.Errorf("%s: task %v, want %v", tc.method, got, tc.want)
		}
		f.setInject(nil)
		if tc.want == nornv1.TaskStatus_TASK_STATUS_CLAIMED {
			if err := c.Yield(ctx, ct.GetTask().GetId(), ct.GetClaimId(), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestClaimCallsStopWithTheLease: the retries of a call on a claim end
// with the claim's lease as the client last learned it (from the claim,
// then each renew), not with the call's deadline; once the lease has run
// out, the policy's attempts alone bound them.
func TestClaimCallsStopWithTheLease(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	f.setInject(func(m string, _ proto.Message) error {
		if m == "Complete" {
			return errUnavailable
		}
		return nil
	})
	claim := func(lease time.Duration) *nornv1.ClaimedTask {
		if _, err := c.Enqueue(ctx, spec("x")); err != nil {
			t.Fatal(err)
		}
		got, err := c.Claim(ctx, client.ClaimRequest{Queue: "q", Lease: lease})
		if err != nil || len(got) != 1 {
			t.Fatalf("Claim = %v, %v", got, err)
		}
		return got[0]
	}

	// A lease running out within the call's deadline: many attempts, then
	// the server's answer (not the deadline's).
	ct := claim(300 * time.Millisecond)
	before := f.count("Complete")
	err := c.Complete(ctx, ct.GetTask().GetId(), ct.GetClaimId(), nil)
	if connect.CodeOf(err) != connect.CodeUnavailable || ctx.Err() != nil {
		t.Fatalf("Complete while the server has no leader: %v (context %v), want UNAVAILABLE before the deadline", err, ctx.Err())
	}
	if n := f.count("Complete") - before; n <= client.DefaultMaxAttempts {
		t.Fatalf("%d attempts within the lease, want more than %d", n, client.DefaultMaxAttempts)
	}

	// A lease already over: the policy's attempts.
	ct = claim(time.Millisecond)
	expiry := ct.GetExpiry().AsTime()
	waitFor(t, "the lease to run out", func() bool { return time.Now().After(expiry) })
	before = f.count("Complete")
	if err := c.Complete(ctx, ct.GetTask().GetId(), ct.GetClaimId(), nil); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("Complete after the lease: %v", err)
	}
	if n := f.count("Complete") - before; n != client.DefaultMaxAttempts {
		t.Fatalf("%d attempts after the lease, want %d", n, client.DefaultMaxAttempts)
	}
}

// TestBatchedCompleteOutlastsAFailover: a completion that its batch's node
// answers UNAVAILABLE on its own (its partition had no leader) is retried
// alone until it takes effect; the others of the batch are not repeated.
func TestBatchedCompleteOutlastsAFailover(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithCompleteBatching(20*time.Millisecond, 1000))
	ctx := t.Context()
	const n = 8
	for i := range n {
		if _, err := c.Enqueue(ctx, spec(fmt.Sprint("p", i))); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.Claim(ctx, client.ClaimRequest{Queue: "q", Max: n, Lease: time.Minute})
	if err != nil || len(got) != n {
		t.Fatalf("Claim = %d tasks, %v", len(got), err)
	}
	unlucky := got[3].GetTask().GetId()
	var refused atomic.Int32
	f.setInject(func(m string, req proto.Message) error {
		switch {
		case m == "CompleteBatch.item" && req.(*nornv1.CompleteRequest).GetId() == unlucky && refused.Add(1) <= 1:
			return errUnavailable
		case m == "Complete" && refused.Add(1) <= failover:
			return errUnavailable
		}
		return nil
	})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, ct := range got {
		wg.Go(func() { errs[i] = c.Complete(ctx, ct.GetTask().GetId(), ct.GetClaimId(), []byte(fmt.Sprint("r", i))) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("complete %d: %v", i, err)
		}
		if task := f.task(got[i].GetTask().GetId()); task.GetStatus() != nornv1.TaskStatus_TASK_STATUS_COMPLETED || string(task.GetResult()) != fmt.Sprint("r", i) {
			t.Errorf("task %d: %v", i, task)
		}
	}
	if errors.Join(errs...) == nil && f.count("Complete") != failover {
		t.Errorf("the unlucky completion alone: %d Complete calls, want %d", f.count("Complete"), failover)
	}
}

// TestOverBudgetRetried: a node's refusal of a request it had no room to
// hold (RESOURCE_EXHAUSTED, "retry later") proves the call did not run, so
// every call retries it, a claim included; a RESOURCE_EXHAUSTED without it
// (a request larger than any budget) is final.
func TestOverBudgetRetried(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	ctx := t.Context()
	if _, err := c.Enqueue(ctx, spec("x")); err != nil {
		t.Fatal(err)
	}
	full := connect.NewError(connect.CodeResourceExhausted, errors.New("transport: too many request bytes in flight: the node holds 67108864 bytes of client requests (at most 67108864), and 4096 more did not fit; retry later"))
	f.setInject(failFirst("Claim", 2, full))
	got, err := c.Claim(ctx, client.ClaimRequest{Queue: "q", Lease: time.Minute})
	if err != nil || len(got) != 1 || f.count("Claim") != 3 {
		t.Fatalf("Claim after two over-budget refusals: %v, %v, %d calls", got, err, f.count("Claim"))
	}
	// Told by its google.rpc.RetryInfo detail, whatever the message says.
	later := connect.NewError(connect.CodeResourceExhausted, errors.New("the node is busy"))
	if d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Millisecond)}); err == nil {
		later.AddDetail(d)
	}
	f.setInject(failFirst("Claim", 1, later))
	if got, err := c.Claim(ctx, client.ClaimRequest{Queue: "q", Lease: time.Minute}); err != nil || len(got) != 0 || f.count("Claim") != 5 {
		t.Fatalf("Claim after a refusal with RetryInfo: %v, %v, %d calls", got, err, f.count("Claim"))
	}
	huge := connect.NewError(connect.CodeResourceExhausted, errors.New("transport: too many request bytes in flight: a client request of 99999999 bytes exceeds the node's 67108864"))
	f.setInject(failFirst("Claim", 1, huge))
	if _, err := c.Claim(ctx, client.ClaimRequest{Queue: "q"}); connect.CodeOf(err) != connect.CodeResourceExhausted || f.count("Claim") != 6 {
		t.Fatalf("Claim too large for any budget: %v, %d calls, want one", err, f.count("Claim"))
	}
}
