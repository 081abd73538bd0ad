package client_test

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
)

// fastRetry keeps the default attempt count but backs off for
// milliseconds, so retry tests run fast.
var fastRetry = client.WithRetry(client.RetryPolicy{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})

func newFakeT(t *testing.T) *fakeServer {
	t.Helper()
	f := newFake()
	t.Cleanup(f.Close)
	return f
}

func newClient(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(addr, append([]client.Option{fastRetry}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func spec(payload string) *nornv1.TaskSpec {
	return &nornv1.TaskSpec{Queue: "q", Payload: []byte(payload)}
}

// failFirst returns an inject hook failing the first n calls of method
// with err.
func failFirst(method string, n int, err error) func(string, proto.Message) error {
	var seen atomic.Int32
	return func(m string, _ proto.Message) error {
		if m == method && int(seen.Add(1)) <= n {
			return err
		}
		return nil
	}
}

var errUnavailable = connect.NewError(connect.CodeUnavailable, errors.New("no leader"))

func TestNewAddress(t *testing.T) {
	for _, tc := range []struct {
		addr, want string
		ok         bool
	}{
		{"127.0.0.1:7400", "http://127.0.0.1:7400", true},
		{"localhost:7400", "http://localhost:7400", true},
		{"http://10.0.0.1:7400", "http://10.0.0.1:7400", true},
		{"http://10.0.0.1:7400/", "http://10.0.0.1:7400", true},
		{"https://norn.example:443", "https://norn.example:443", true},
		{"http://proxy:80/norn", "http://proxy:80/norn", true},
		{"", "", false},
		{"ftp://host:21", "", false},
		{"http://", "", false},
		{"http://host:1?x=y", "", false},
		{"http://user@host:1", "", false},
		{"http://[::1", "", false},
		{"127.0.0.1:7400,127.0.0.1:7410", "http://127.0.0.1:7400", true},
		{"127.0.0.1:7400,", "", false},
		{"127.0.0.1:7400,https://127.0.0.1:7410", "", false},
	} {
		c, err := client.New(tc.addr)
		if (err == nil) != tc.ok {
			t.Errorf("New(%q) error = %v, want ok=%v", tc.addr, err, tc.ok)
			continue
		}
		if err == nil {
			if c.Addr() != tc.want {
				t.Errorf("New(%q).Addr() = %q, want %q", tc.addr, c.Addr(), tc.want)
			}
			c.Close()
		}
	}
}

func TestNewOptionsValidated(t *testing.T) {
	for name, opt := range map[string]client.Option{
		"zero attempts":            client.WithRetry(client.RetryPolicy{MaxAttempts: -1}),
		"max below base":           client.WithRetry(client.RetryPolicy{BaseBackoff: time.Second, MaxBackoff: time.Millisecond}),
		"negative timeout":         client.WithTimeout(-time.Second),
		"negative interval":        client.WithDiscovery(-time.Second),
		"batch negative linger":    client.WithEnqueueBatching(-time.Millisecond, 10),
		"batch zero max":           client.WithEnqueueBatching(time.Millisecond, 0),
		"batch over 10,000":        client.WithEnqueueBatching(time.Millisecond, 10_001),
		"complete batch zero max":  client.WithCompleteBatching(0, 0),
		"complete negative linger": client.WithCompleteBatching(-1, 100),
	} {
		if c, err := client.New("127.0.0.1:1", opt); err == nil {
			c.Close()
			t.Errorf("%s: New accepted it", name)
		}
	}
}

// TestH2C: the default transport speaks HTTP/2 cleartext, and every call
// reaches its handler.
func TestH2C(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	ctx := t.Context()
	st, err := c.Status(ctx)
	if err != nil || st.GetNodeId() != "fake-1" {
		t.Fatalf("Status = %v, %v", st, err)
	}
	ids, err := c.EnqueueBatch(ctx, []*nornv1.TaskSpec{spec("a"), spec("b")})
	if err != nil || len(ids) != 2 {
		t.Fatalf("EnqueueBatch = %v, %v", ids, err)
	}
	if n, err := c.CountTasks(ctx, "q"); err != nil || n.GetTotal() != 2 || n.GetByStatus()["READY"] != 2 {
		t.Fatalf("CountTasks = %v, %v", n, err)
	}
	f.mu.Lock()
	notH2 := f.notH2
	f.mu.Unlock()
	if notH2 != 0 {
		t.Fatalf("%d requests were not HTTP/2", notH2)
	}
}

// TestNoGzipByDefault: the client does not ask for gzipped answers
// (compressing claims and lists costs more CPU than it saves on a LAN),
// and WithConnectOptions brings gzip back.
func TestNoGzipByDefault(t *testing.T) {
	f, g := newFakeT(t), newFakeT(t)
	ctx := t.Context()
	plain := newClient(t, f.addr)
	if _, err := plain.EnqueueBatch(ctx, []*nornv1.TaskSpec{spec("a")}); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Claim(ctx, client.ClaimRequest{Queue: "q", Worker: "w", Max: 1}); err != nil {
		t.Fatal(err)
	}
	gz := newClient(t, g.addr, client.WithConnectOptions(connect.WithAcceptCompression("gzip",
		func() connect.Decompressor { return &gzip.Reader{} },
		func() connect.Compressor { return gzip.NewWriter(nil) })))
	if _, err := gz.CountTasks(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		fake *fakeServer
		gzip bool
	}{{f, false}, {g, true}} {
		c.fake.mu.Lock()
		encs := slices.Clone(c.fake.acceptEnc)
		c.fake.mu.Unlock()
		if len(encs) == 0 {
			t.Fatal("no request seen")
		}
		for i, enc := range encs {
			if strings.Contains(enc, "gzip") != c.gzip {
				t.Errorf("request %d: Grpc-Accept-Encoding %q, want gzip %v", i, enc, c.gzip)
			}
		}
	}
}

// TestEnqueueRetryReusesID: an enqueue that stored the task but missed its
// quorum answers UNAVAILABLE with a WriteFailure; the retry carries the id
// it names, so the task is stored once.
func TestEnqueueRetryReusesID(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	var fails atomic.Int32
	f.setFailWrite(func(string) bool { return fails.Add(1) <= 2 })

	id, err := c.Enqueue(t.Context(), spec("x"))
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if want := [][]uint64{{0}, {id}, {id}}; !slices.EqualFunc(f.reqIDs, want, slices.Equal) {
		t.Fatalf("request ids = %v, want %v", f.reqIDs, want)
	}
	if len(f.tasks) != 1 {
		t.Fatalf("%d tasks stored, want 1", len(f.tasks))
	}
}

// TestEnqueueUnknownOutcomeNotRetried: an UNAVAILABLE without a
// WriteFailure says nothing about the id, so an id-less enqueue is not
// resent (it could store a second task).
func TestEnqueueUnknownOutcomeNotRetried(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	f.setInject(failFirst("Enqueue", 1, errUnavailable))
	id, err := c.Enqueue(t.Context(), spec("x"))
	if id != 0 || !client.IsUnavailable(err) || !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Enqueue = %d, %v; want 0, UNAVAILABLE", id, err)
	}
	if n := f.count("Enqueue"); n != 1 {
		t.Fatalf("%d Enqueue calls, want 1", n)
	}
}

// TestEnqueueWithIDRetried: with a caller's id any UNAVAILABLE is retried.
func TestEnqueueWithIDRetried(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	f.setInject(failFirst("Enqueue", 2, errUnavailable))
	id, err := c.Enqueue(t.Context(), spec("x"), client.WithID(42))
	if id != 42 || err != nil {
		t.Fatalf("Enqueue = %d, %v; want 42, nil", id, err)
	}
	if n := f.count("Enqueue"); n != 3 {
		t.Fatalf("%d Enqueue calls, want 3", n)
	}
}

// TestEnqueueGivesUpWithID: when every attempt misses the quorum, Enqueue
// returns the id with the error, for a later retry.
func TestEnqueueGivesUpWithID(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	f.setFailWrite(func(string) bool { return true })
	id, err := c.Enqueue(t.Context(), spec("x"))
	if id == 0 || !client.IsUnavailable(err) {
		t.Fatalf("Enqueue = %d, %v; want an id and UNAVAILABLE", id, err)
	}
	wf, ok := client.WriteFailureOf(err)
	if !ok || !slices.Equal(wf.GetIds(), []uint64{id}) {
		t.Fatalf("WriteFailureOf = %v, %v", wf, ok)
	}
	if n := f.count("Enqueue"); n != client.DefaultMaxAttempts {
		t.Fatalf("%d Enqueue calls, want %d", n, client.DefaultMaxAttempts)
	}

	// The batch call behaves the same.
	ids, err := c.EnqueueBatch(t.Context(), []*nornv1.TaskSpec{spec("a"), spec("b")}, client.WithIDs(0, 77))
	if len(ids) != 2 || ids[1] != 77 || ids[0] == 0 || !client.IsUnavailable(err) {
		t.Fatalf("EnqueueBatch = %v, %v", ids, err)
	}
	f.mu.Lock()
	last := f.reqIDs[len(f.reqIDs)-1]
	f.mu.Unlock()
	if !slices.Equal(last, ids) {
		t.Fatalf("last batch request ids = %v, want %v", last, ids)
	}
}

func TestEnqueueBadOptions(t *testing.T) {
	c := newClient(t, "127.0.0.1:1")
	ctx := t.Context()
	if _, err := c.Enqueue(ctx, spec("x"), client.WithIDs(1, 2)); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("Enqueue with two ids: %v", err)
	}
	if _, err := c.Enqueue(ctx, nil); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("Enqueue nil: %v", err)
	}
	if _, err := c.EnqueueBatch(ctx, []*nornv1.TaskSpec{spec("x")}, client.WithIDs(1, 2)); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("EnqueueBatch with ids not parallel: %v", err)
	}
	if _, err := c.EnqueueBatch(ctx, nil); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("EnqueueBatch empty: %v", err)
	}
}

// claimOne enqueues a task and claims it.
func claimOne(t *testing.T, c *client.Client) *nornv1.ClaimedTask {
	t.Helper()
	if _, err := c.Enqueue(t.Context(), spec("x")); err != nil {
		t.Fatal(err)
	}
	got, err := c.Claim(t.Context(), client.ClaimRequest{Queue: "q", Lease: time.Minute})
	if err != nil || len(got) != 1 {
		t.Fatalf("Claim = %v, %v", got, err)
	}
	return got[0]
}

// TestIdempotentCallsRetry: every idempotent call retries UNAVAILABLE and
// DEADLINE_EXCEEDED and then succeeds.
func TestIdempotentCallsRetry(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	ct := claimOne(t, c)
	id, claim := ct.GetTask().GetId(), ct.GetClaimId()
	ctx := t.Context()

	for _, tc := range []struct {
		method string
		call   func() error
	}{
		{"GetTask", func() error { _, err := c.GetTask(ctx, id); return err }},
		{"ListTasks", func() error { _, err := c.ListTasks(ctx, &nornv1.ListTasksRequest{}); return err }},
		{"CountTasks", func() error { _, err := c.CountTasks(ctx, ""); return err }},
		{"Status", func() error { _, err := c.Status(ctx); return err }},
		{"Renew", func() error { _, err := c.Renew(ctx, id, claim, time.Minute); return err }},
		{"Update", func() error {
			return c.Update(ctx, &nornv1.UpdateRequest{Id: id, ClaimId: claim, Seq: 1, Progress: 0.5})
		}},
		{"Complete", func() error { return c.Complete(ctx, id, claim, []byte("r")) }},
		{"Cancel", func() error {
			id, err := c.Enqueue(ctx, spec("y"))
			if err != nil {
				return err
			}
			return c.Cancel(ctx, id)
		}},
	} {
		errDeadline := connect.NewError(connect.CodeDeadlineExceeded, errors.New("server deadline"))
		var n atomic.Int32
		f.setInject(func(m string, _ proto.Message) error {
			if m != tc.method {
				return nil
			}
			switch n.Add(1) {
			case 1:
				return errUnavailable
			case 2:
				return errDeadline
			}
			return nil
		})
		if err := tc.call(); err != nil {
			t.Errorf("%s: %v", tc.method, err)
		}
		if got := n.Load(); got != 3 {
			t.Errorf("%s: %d calls, want 3", tc.method, got)
		}
	}
	if got := f.task(id); got.GetStatus() != nornv1.TaskStatus_TASK_STATUS_COMPLETED || string(got.GetResult()) != "r" {
		t.Fatalf("task = %v", got)
	}
}

// TestAbortAndYieldRetry covers the two claim-ending calls left.
func TestAbortAndYieldRetry(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	ctx := t.Context()

	ct := claimOne(t, c)
	f.setInject(failFirst("Yield", 1, errUnavailable))
	if err := c.Yield(ctx, ct.GetTask().GetId(), ct.GetClaimId(), 0.25); err != nil {
		t.Fatal(err)
	}
	got, err := c.Claim(ctx, client.ClaimRequest{Queue: "q"})
	if err != nil || len(got) != 1 {
		t.Fatalf("Claim = %v, %v", got, err)
	}
	f.setInject(failFirst("Abort", 1, errUnavailable))
	te := &nornv1.TaskError{Code: "bad", Description: "bad input", Args: []string{"x"}}
	if err := c.Abort(ctx, got[0].GetTask().GetId(), got[0].GetClaimId(), te); err != nil {
		t.Fatal(err)
	}
	task := f.task(got[0].GetTask().GetId())
	if task.GetStatus() != nornv1.TaskStatus_TASK_STATUS_ABORTED || !proto.Equal(task.GetErrors()[0], te) {
		t.Fatalf("task = %v", task)
	}
	if f.count("Yield") != 2 || f.count("Abort") != 2 {
		t.Fatalf("Yield %d, Abort %d calls; want 2 each", f.count("Yield"), f.count("Abort"))
	}
}

// TestSupersededNotRetried: FAILED_PRECONDITION is final, inspectable as
// a connect error, a sentinel and with IsSuperseded.
func TestSupersededNotRetried(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	ct := claimOne(t, c)
	err := c.Complete(t.Context(), ct.GetTask().GetId(), ct.GetClaimId()+1, nil)
	if !client.IsSuperseded(err) || !errors.Is(err, client.ErrSuperseded) || errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Complete with a stale claim: %v", err)
	}
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("code = %v", connect.CodeOf(err))
	}
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Message() == "" {
		t.Fatalf("errors.As(*connect.Error) failed on %v", err)
	}
	if n := f.count("Complete"); n != 1 {
		t.Fatalf("%d Complete calls, want 1", n)
	}
	if _, err := c.GetTask(t.Context(), 999); !errors.Is(err, client.ErrNotFound) || !client.IsNotFound(err) {
		t.Fatalf("GetTask(999): %v", err)
	}
}

// TestClaimNotRetriedOnUnavailable: an UNAVAILABLE claim may have taken
// effect on the server, so it is not repeated.
func TestClaimNotRetriedOnUnavailable(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	f.setInject(failFirst("Claim", 1, errUnavailable))
	if _, err := c.Claim(t.Context(), client.ClaimRequest{Queue: "q"}); !client.IsUnavailable(err) {
		t.Fatalf("Claim: %v", err)
	}
	if n := f.count("Claim"); n != 1 {
		t.Fatalf("%d Claim calls, want 1", n)
	}
}

// refusingTransport refuses the first n requests as a dial would, then
// sends through next.
type refusingTransport struct {
	n    atomic.Int32
	next http.RoundTripper
}

func (rt *refusingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if rt.n.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: &syscallErr{syscall.ECONNREFUSED}}
	}
	return rt.next.RoundTrip(r)
}

type syscallErr struct{ errno syscall.Errno }

func (e *syscallErr) Error() string { return "connect: " + e.errno.Error() }
func (e *syscallErr) Unwrap() error { return e.errno }

func h2cTransport() *http.Transport {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Transport{Protocols: &p}
}

// TestClaimRetriedWhenRefused: a refused connection proves the claim never
// reached a node, so it is retried.
func TestClaimRetriedWhenRefused(t *testing.T) {
	f := newFakeT(t)
	rt := &refusingTransport{next: h2cTransport()}
	rt.n.Store(2)
	c := newClient(t, f.addr, client.WithHTTPClient(&http.Client{Transport: rt}))
	if _, err := c.Enqueue(t.Context(), spec("x")); err != nil { // retried through both refusals
		t.Fatal(err)
	}
	rt.n.Store(2)
	got, err := c.Claim(t.Context(), client.ClaimRequest{Queue: "q"})
	if err != nil || len(got) != 1 {
		t.Fatalf("Claim = %v, %v", got, err)
	}
	if n := f.count("Claim"); n != 1 {
		t.Fatalf("%d Claim calls reached the server, want 1", n)
	}
}

// TestRefusedIsDetected: a real refused connection (a closed port) keeps
// ECONNREFUSED in the error chain, which is what the no-effect retry rule
// relies on; the call is retried and finally reports UNAVAILABLE.
func TestRefusedIsDetected(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c := newClient(t, addr)
	_, err = c.Claim(t.Context(), client.ClaimRequest{Queue: "q"})
	if !errors.Is(err, syscall.ECONNREFUSED) || !client.IsUnavailable(err) {
		t.Fatalf("Claim on a closed port: %v", err)
	}
}

// TestTimeout: WithTimeout bounds a call whose context has no deadline,
// retries included; the context's own deadline wins when it has one.
func TestTimeout(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithTimeout(100*time.Millisecond))
	f.setInject(func(m string, _ proto.Message) error {
		if m == "GetTask" {
			time.Sleep(400 * time.Millisecond)
		}
		return nil
	})
	start := time.Now()
	_, err := c.GetTask(t.Context(), 1)
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("GetTask: %v, want DEADLINE_EXCEEDED", err)
	}
	if d := time.Since(start); d > 350*time.Millisecond {
		t.Fatalf("GetTask took %v", d)
	}

	// A claim's deadline is the timeout plus its long-poll wait.
	start = time.Now()
	got, err := c.Claim(t.Context(), client.ClaimRequest{Queue: "q", Wait: 200 * time.Millisecond})
	if err != nil || len(got) != 0 || time.Since(start) < 200*time.Millisecond {
		t.Fatalf("long-poll Claim = %v, %v after %v", got, err, time.Since(start))
	}
}

// TestCancelledWhileBackingOff: a call that gives up between attempts
// reports the last error and the context's.
func TestCancelledWhileBackingOff(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr, client.WithRetry(client.RetryPolicy{MaxAttempts: 100, BaseBackoff: 50 * time.Millisecond}))
	f.setInject(failFirst("Cancel", 1000, errUnavailable))
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Millisecond)
	defer cancel()
	err := c.Cancel(ctx, 1)
	// Usually the deadline passes during a backoff (the last error is
	// UNAVAILABLE), rarely during an attempt (it is the deadline itself).
	code := connect.CodeOf(err)
	if !errors.Is(err, context.DeadlineExceeded) || code != connect.CodeUnavailable && code != connect.CodeDeadlineExceeded {
		t.Fatalf("Cancel: %v", err)
	}
}

func TestTasksIterator(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	specs := make([]*nornv1.TaskSpec, 2500)
	for i := range specs {
		specs[i] = spec(fmt.Sprint(i))
	}
	ids, err := c.EnqueueBatch(t.Context(), specs)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for task, err := range c.Tasks(t.Context(), "q", nornv1.TaskStatus_TASK_STATUS_READY) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, task.GetId())
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("Tasks yielded %d ids, want the %d enqueued in order", len(got), len(ids))
	}
	if n := f.count("ListTasks"); n != 3 {
		t.Fatalf("%d ListTasks pages, want 3", n)
	}
}

func TestClosed(t *testing.T) {
	f := newFakeT(t)
	c := newClient(t, f.addr)
	c.Close()
	if _, err := c.Enqueue(t.Context(), spec("x")); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Enqueue after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
