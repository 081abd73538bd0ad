package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/server"
)

// fakeClock is the node's wall clock in tests, moved by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// harness is one node on a real data dir, served over real HTTP/2 on
// 127.0.0.1, with a connect client.
type harness struct {
	t     testing.TB
	dir   string
	clock *fakeClock
	node  *Node
	srv   *httptest.Server
	api   nornv1connect.TaskServiceClient
	admin nornv1connect.AdminServiceClient
	hc    *http.Client // HTTP/2 (h2c) client of srv
}

const testSkew = 2 * time.Second

func newHarness(t testing.TB, dir string, clock *fakeClock) *harness {
	t.Helper()
	return newHarnessWith(t, dir, clock, nil)
}

// newHarnessWith is newHarness with tune (if not nil) changing the node's
// config before it starts.
func newHarnessWith(t testing.TB, dir string, clock *fakeClock, tune func(*Config)) *harness {
	t.Helper()
	if clock == nil {
		clock = &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	}
	partitions := 8
	if _, bench := t.(*testing.B); bench {
		partitions = 64 // the production default
	}
	cfg := Config{
		DataDir: dir, Partitions: partitions, Clock: clock,
		SkewBuffer: testSkew, LeaseGrace: 5 * time.Second,
		MonitorInterval: time.Hour, // tests run monitor passes themselves
		RaftTimeout:     50 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		RaftLogger:      hclog.NewNullLogger(),
	}
	if tune != nil {
		tune(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.WaitReady(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(n.Handler())
	srv.Config.Protocols = serverProtocols()
	srv.Start()
	h := &harness{t: t, dir: dir, clock: clock, node: n, srv: srv}
	hc := h2cClient()
	h.hc = hc
	h.api = nornv1connect.NewTaskServiceClient(hc, srv.URL, connect.WithGRPC())
	h.admin = nornv1connect.NewAdminServiceClient(hc, srv.URL)
	n.dispatch.MonitorOnce() // the leaderships' first pass: extend live claims
	t.Cleanup(h.close)
	return h
}

// serverProtocols are what nornd serves: HTTP/1.1 and h2c.
func serverProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// h2cClient speaks HTTP/2 with prior knowledge (h2c), as the client
// library does.
func h2cClient() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}}
}

func (h *harness) close() {
	if h.node == nil {
		return
	}
	h.srv.Close()
	if err := h.node.Close(); err != nil {
		h.t.Error(err)
	}
	h.node = nil
}

func (h *harness) enqueue(spec *nornv1.TaskSpec) uint64 {
	h.t.Helper()
	r, err := h.api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{Task: spec}))
	if err != nil {
		h.t.Fatal(err)
	}
	return r.Msg.Id
}

func (h *harness) claim(queue string, max uint32, lease time.Duration) []*nornv1.ClaimedTask {
	h.t.Helper()
	r, err := h.api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{
		Queue: queue, Worker: "w1", Max: max, Lease: durationpb.New(lease)}))
	if err != nil {
		h.t.Fatal(err)
	}
	return r.Msg.Tasks
}

func (h *harness) get(id uint64) *nornv1.Task {
	h.t.Helper()
	r, err := h.api.GetTask(context.Background(), connect.NewRequest(&nornv1.GetTaskRequest{Id: id}))
	if err != nil {
		h.t.Fatal(err)
	}
	return r.Msg.Task
}

func wantCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("err = %v, want code %v", err, code)
	}
}

func TestLifecycle(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	id := h.enqueue(&nornv1.TaskSpec{Queue: "emails", Payload: []byte("hi")})
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_READY || string(got.Spec.Payload) != "hi" {
		t.Fatalf("after enqueue: %v", got)
	}
	c := h.claim("emails", 1, 30*time.Second)
	if len(c) != 1 || c[0].Task.Id != id || c[0].ClaimId == 0 {
		t.Fatalf("claim = %v", c)
	}
	claimID := c[0].ClaimId
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_CLAIMED || got.CurrentClaim.GetClaimId() != claimID {
		t.Fatalf("after claim: %v", got)
	}
	if more := h.claim("emails", 1, time.Second); len(more) != 0 {
		t.Fatalf("second claim of the only task: %v", more)
	}
	if _, err := h.api.Update(ctx, connect.NewRequest(&nornv1.UpdateRequest{Id: id, ClaimId: claimID, Seq: 1, Progress: 0.5, Message: "half"})); err != nil {
		t.Fatal(err)
	}
	h.clock.advance(10 * time.Second)
	r, err := h.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: id, ClaimId: claimID, Lease: durationpb.New(time.Minute)}))
	if err != nil || !r.Msg.Expiry.AsTime().Equal(h.clock.Now().Add(time.Minute)) {
		t.Fatalf("renew: %v, %v", r, err)
	}
	if got := h.get(id); got.Progress != 0.5 || len(got.Updates) != 1 {
		t.Fatalf("progress %v, updates %v", got.Progress, got.Updates)
	}
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: claimID, Result: []byte("done")})); err != nil {
		t.Fatal(err)
	}
	// A retried complete succeeds.
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: claimID, Result: []byte("done")})); err != nil {
		t.Fatalf("retried complete: %v", err)
	}
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED || string(got.Result) != "done" || got.Progress != 1 ||
		got.CurrentClaim != nil || len(got.Claims) != 1 || got.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_COMPLETED {
		t.Fatalf("after complete: %v", got)
	}
	if c := h.claim("emails", 1, time.Second); len(c) != 0 {
		t.Fatalf("completed task claimed again: %v", c)
	}
}

func TestPriorityThenFIFO(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	low1 := h.enqueue(&nornv1.TaskSpec{Queue: "q", Priority: 0})
	high := h.enqueue(&nornv1.TaskSpec{Queue: "q", Priority: 5})
	low2 := h.enqueue(&nornv1.TaskSpec{Queue: "q", Priority: 0})
	neg := h.enqueue(&nornv1.TaskSpec{Queue: "q", Priority: -3})
	var order []uint64
	for range 4 {
		c := h.claim("q", 1, time.Minute)
		if len(c) != 1 {
			t.Fatalf("claim returned %d tasks", len(c))
		}
		order = append(order, c[0].Task.Id)
	}
	want := []uint64{high, low1, low2, neg}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("claim order %v, want %v", order, want)
		}
	}
	// A batch claim returns in the same order.
	h2 := newHarness(t, t.TempDir(), nil)
	a := h2.enqueue(&nornv1.TaskSpec{Queue: "q"})
	b := h2.enqueue(&nornv1.TaskSpec{Queue: "q", Priority: 1})
	c := h2.claim("q", 10, time.Minute)
	if len(c) != 2 || c[0].Task.Id != b || c[1].Task.Id != a {
		t.Fatalf("batch claim %v", c)
	}
}

// Claims walk the heads of every partition in one order: with many tasks
// per partition (so each partition's head is read further several times)
// and claims of assorted sizes, the claimed sequence is exactly priority
// descending, then id ascending.
// TestClaimOrderAcrossPartitions checks the claim order against a
// reference model (see headMerger): every claim starts with the best head
// of all (priority, then age); it then stays in that head's partition
// while the partition's next head has the best priority left anywhere,
// and otherwise moves to the best head of all again.
func TestClaimOrderAcrossPartitions(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	rng := rand.New(rand.NewPCG(1, 2))
	specs := make([]*nornv1.TaskSpec, 400)
	for i := range specs {
		specs[i] = &nornv1.TaskSpec{Queue: "q", Priority: rng.Int32N(5) - 2}
	}
	r, err := h.api.EnqueueBatch(context.Background(), connect.NewRequest(&nornv1.EnqueueBatchRequest{Tasks: specs}))
	if err != nil {
		t.Fatal(err)
	}
	type head struct {
		prio int32
		id   uint64
	}
	better := func(a, b head) int { return cmp.Or(cmp.Compare(b.prio, a.prio), cmp.Compare(a.id, b.id)) }
	// The model: each partition's heads in order.
	parts := map[uint16][]head{}
	for i, id := range r.Msg.Ids {
		p := h.node.partition(id)
		parts[p] = append(parts[p], head{specs[i].Priority, id})
	}
	for _, hs := range parts {
		slices.SortFunc(hs, better)
	}
	best := func() (uint16, bool) {
		var bp uint16
		found := false
		for p, hs := range parts {
			if len(hs) > 0 && (!found || better(hs[0], parts[bp][0]) < 0) {
				bp, found = p, true
			}
		}
		return bp, found
	}
	modelClaim := func(size int) []head {
		var out []head
		sticky, ok := best()
		for ok && len(out) < size {
			b, _ := best()
			if hs := parts[sticky]; len(hs) == 0 || hs[0].prio != parts[b][0].prio {
				sticky = b
			}
			out = append(out, parts[sticky][0])
			parts[sticky] = parts[sticky][1:]
			_, ok = best()
		}
		slices.SortFunc(out, better) // Claim answers in claim order
		return out
	}
	claimed, single := 0, 0
	for size := uint32(1); claimed < len(specs); size = size%37 + 3 {
		want := modelClaim(int(size))
		c := h.claim("q", size, time.Minute)
		got := make([]head, len(c))
		inParts := map[uint16]bool{}
		for i, ct := range c {
			got[i] = head{ct.Task.Spec.Priority, ct.Task.Id}
			inParts[h.node.partition(ct.Task.Id)] = true
		}
		if !slices.Equal(got, want) {
			t.Fatalf("claim of %d after %d claimed: got %v, want %v", size, claimed, got, want)
		}
		if len(c) > 1 && len(inParts) == 1 {
			single++
		}
		claimed += len(c)
	}
	// The point of the order: batches come from one partition (one Raft
	// entry) when its priorities allow.
	if single == 0 {
		t.Fatal("no multi-task claim came from a single partition")
	}
}

func TestDelayedAndDependencies(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	later := h.enqueue(&nornv1.TaskSpec{Queue: "q", NotBefore: timestamppb.New(h.clock.Now().Add(time.Minute))})
	if got := h.get(later); got.Status != nornv1.TaskStatus_TASK_STATUS_DELAYED {
		t.Fatalf("status %v", got.Status)
	}
	dep := h.enqueue(&nornv1.TaskSpec{Queue: "deps"})
	child := h.enqueue(&nornv1.TaskSpec{Queue: "deps", Priority: 9, DependsOn: []uint64{dep}})
	if got := h.get(child); got.Status != nornv1.TaskStatus_TASK_STATUS_DELAYED {
		t.Fatalf("child of an unfinished dependency: %v", got.Status)
	}
	if c := h.claim("q", 1, time.Minute); len(c) != 0 {
		t.Fatalf("delayed task claimed early: %v", c)
	}
	c := h.claim("deps", 5, time.Minute)
	if len(c) != 1 || c[0].Task.Id != dep {
		t.Fatalf("claim with an unfinished dependency: %v", c)
	}
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: dep, ClaimId: c[0].ClaimId})); err != nil {
		t.Fatal(err)
	}
	if c := h.claim("deps", 5, time.Minute); len(c) != 1 || c[0].Task.Id != child {
		t.Fatalf("child after its dependency completed: %v", c)
	}
	h.clock.advance(time.Minute)
	h.node.dispatch.MonitorOnce()
	if c := h.claim("q", 1, time.Minute); len(c) != 1 || c[0].Task.Id != later {
		t.Fatalf("delayed task after its time: %v", c)
	}
	// A dependency must exist.
	_, err := h.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q", DependsOn: []uint64{12345}}}))
	wantCode(t, err, connect.CodeInvalidArgument)
	if !strings.Contains(err.Error(), "task.dependsOn[0]") {
		t.Fatalf("error does not name the field: %v", err)
	}
}

func TestRetentionDeletesTerminalTasks(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	done := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	c := h.claim("q", 1, time.Minute)
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: done, ClaimId: c[0].ClaimId})); err != nil {
		t.Fatal(err)
	}
	h.clock.advance(24 * time.Hour)
	cancelled := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: cancelled})); err != nil {
		t.Fatal(err)
	}
	live := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	h.clock.advance(6*24*time.Hour + time.Minute) // the first is past 7 days, the second not
	h.node.dispatch.MonitorOnce()
	_, err := h.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: done}))
	wantCode(t, err, connect.CodeNotFound)
	if rec, err := h.node.store.ClaimFSMRecord(h.node.partition(done), done); err == nil {
		t.Fatalf("claim record of a deleted task left: %x", rec)
	}
	if got := h.get(cancelled); got.Status != nornv1.TaskStatus_TASK_STATUS_CANCELLED {
		t.Fatalf("task within retention: %v", got.Status)
	}
	if got := h.get(live); got.Status != nornv1.TaskStatus_TASK_STATUS_READY {
		t.Fatalf("live task: %v", got.Status)
	}
}

func TestFailedDependencyAbortsDependant(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	dep := h.enqueue(&nornv1.TaskSpec{Queue: "parent"})
	child := h.enqueue(&nornv1.TaskSpec{Queue: "child", DependsOn: []uint64{dep}})
	if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: dep})); err != nil {
		t.Fatal(err)
	}
	if c := h.claim("child", 1, time.Minute); len(c) != 0 {
		t.Fatalf("dependant of a cancelled task claimed: %v", c)
	}
	got := h.get(child)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_ABORTED || got.Errors[0].Code != "dependency_failed" ||
		got.Errors[0].Args[0] != fmt.Sprint(dep) {
		t.Fatalf("dependant of a cancelled task: %v", got)
	}
}

func TestLeaseExpiryWaitsForSkewBuffer(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	c := h.claim("q", 1, 10*time.Second)
	h.clock.advance(10*time.Second + testSkew) // expiry + skew: not yet past it
	h.node.dispatch.MonitorOnce()
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_CLAIMED {
		t.Fatalf("expired at expiry + skew buffer: %v", got.Status)
	}
	if again := h.claim("q", 1, time.Second); len(again) != 0 {
		t.Fatalf("claimable before lease + skew: %v", again)
	}
	h.clock.advance(time.Millisecond)
	h.node.dispatch.MonitorOnce()
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_READY || got.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_EXPIRED {
		t.Fatalf("after lease + skew: %v", got)
	}
	c2 := h.claim("q", 1, 10*time.Second)
	if len(c2) != 1 || c2[0].ClaimId <= c[0].ClaimId || c2[0].Task.CurrentClaim.Seq != 2 {
		t.Fatalf("reclaim: %v", c2)
	}
	_, err := h.api.Renew(context.Background(), connect.NewRequest(&nornv1.RenewRequest{Id: id, ClaimId: c[0].ClaimId}))
	wantCode(t, err, connect.CodeFailedPrecondition)
}

func TestMaxClaimsAborts(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q", MaxClaims: 2})
	for i := range 2 {
		if c := h.claim("q", 1, time.Second); len(c) != 1 {
			t.Fatalf("claim %d: %v", i, c)
		}
		h.clock.advance(time.Second + testSkew + time.Millisecond)
		h.node.dispatch.MonitorOnce()
	}
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_ABORTED || len(got.Errors) != 1 || got.Errors[0].Code != "max_claims_exceeded" {
		t.Fatalf("after max_claims expiries: %v", got)
	}
	if c := h.claim("q", 1, time.Second); len(c) != 0 {
		t.Fatalf("dead task claimed: %v", c)
	}
}

func TestCancelWhileClaimed(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	c := h.claim("q", 1, time.Minute)
	if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: id})); err != nil {
		t.Fatal(err)
	}
	_, err := h.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: id, ClaimId: c[0].ClaimId}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	_, err = h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: c[0].ClaimId}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_CANCELLED || got.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_CANCELLED {
		t.Fatalf("after cancel and complete: %v", got)
	}
	// Cancel is idempotent.
	if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: id})); err != nil {
		t.Fatalf("second cancel: %v", err)
	}
}

func TestYieldAndAbort(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	c := h.claim("q", 1, time.Minute)
	if _, err := h.api.Yield(ctx, connect.NewRequest(&nornv1.YieldRequest{Id: id, ClaimId: c[0].ClaimId, Progress: 0.25})); err != nil {
		t.Fatal(err)
	}
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_READY || got.Progress != 0.25 ||
		got.Claims[0].EndReason != nornv1.ClaimEnd_CLAIM_END_YIELDED {
		t.Fatalf("after yield: %v", got)
	}
	c = h.claim("q", 1, time.Minute)
	_, err := h.api.Abort(ctx, connect.NewRequest(&nornv1.AbortRequest{Id: id, ClaimId: c[0].ClaimId,
		Errors: []*nornv1.TaskError{{Code: "bad_input", Description: "no", Args: []string{"x"}}}}))
	if err != nil {
		t.Fatal(err)
	}
	got := h.get(id)
	if got.Status != nornv1.TaskStatus_TASK_STATUS_ABORTED || got.Errors[0].Code != "bad_input" {
		t.Fatalf("after abort: %v", got)
	}
}

// TestConcurrentClaimsAreExclusive drains a queue with concurrent claimers:
// every task is granted exactly once.
func TestConcurrentClaimsAreExclusive(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	const tasks = 300
	specs := make([]*nornv1.TaskSpec, tasks)
	for i := range specs {
		specs[i] = &nornv1.TaskSpec{Queue: "q", Priority: int32(i % 4)}
	}
	if _, err := h.api.EnqueueBatch(context.Background(), connect.NewRequest(&nornv1.EnqueueBatchRequest{Tasks: specs})); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	granted := map[uint64]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				r, err := h.api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{
					Queue: "q", Worker: "w", Max: 7, Lease: durationpb.New(time.Minute)}))
				if err != nil {
					t.Error(err)
					return
				}
				if len(r.Msg.Tasks) == 0 {
					return
				}
				mu.Lock()
				for _, c := range r.Msg.Tasks {
					granted[c.Task.Id]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(granted) != tasks {
		t.Fatalf("%d tasks claimed, want %d", len(granted), tasks)
	}
	for id, n := range granted {
		if n != 1 {
			t.Fatalf("task %d granted %d times", id, n)
		}
	}
}

func TestLongPollWakesOnEnqueue(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	got := make(chan []*nornv1.ClaimedTask, 1)
	go func() {
		r, err := h.api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{
			Queue: "slow", Worker: "w", Wait: durationpb.New(30 * time.Second)}))
		if err != nil {
			t.Error(err)
		}
		got <- r.Msg.GetTasks()
	}()
	// Enqueue once the claim is waiting (it registered on the queue).
	for {
		waiting := h.node.waiters.Waiting("slow")
		if waiting {
			break
		}
		time.Sleep(time.Millisecond)
	}
	id := h.enqueue(&nornv1.TaskSpec{Queue: "slow"})
	select {
	case c := <-got:
		if len(c) != 1 || c[0].Task.Id != id {
			t.Fatalf("long poll returned %v", c)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("long poll did not wake on enqueue")
	}
}

func TestRestartKeepsTasksAndClaims(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, nil)
	ctx := context.Background()
	a := h.enqueue(&nornv1.TaskSpec{Queue: "q", Priority: 1})
	b := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	c := h.claim("q", 1, time.Hour)
	done := h.enqueue(&nornv1.TaskSpec{Queue: "other"})
	dc := h.claim("other", 1, time.Minute)
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: done, ClaimId: dc[0].ClaimId})); err != nil {
		t.Fatal(err)
	}
	clock := h.clock
	h.close()

	h = newHarness(t, dir, clock)
	if got := h.get(a); got.Status != nornv1.TaskStatus_TASK_STATUS_CLAIMED || got.CurrentClaim.ClaimId != c[0].ClaimId {
		t.Fatalf("claimed task after restart: %v", got)
	}
	if got := h.get(done); got.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED {
		t.Fatalf("completed task after restart: %v", got)
	}
	if c2 := h.claim("q", 5, time.Minute); len(c2) != 1 || c2[0].Task.Id != b {
		t.Fatalf("claim after restart: %v", c2)
	}
	if _, err := h.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: a, ClaimId: c[0].ClaimId})); err != nil {
		t.Fatalf("renew of a claim from before the restart: %v", err)
	}
}

func TestSecondNodeOnSameDataDirFails(t *testing.T) {
	dir := t.TempDir()
	newHarness(t, dir, nil)
	_, err := New(Config{DataDir: dir, Partitions: 8, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("err = %v, want ErrDataDirInUse", err)
	}
}

func TestPartitionCountIsFixedPerDataDir(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, nil)
	h.close()
	_, err := New(Config{DataDir: dir, Partitions: 16, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), "created with 8 partitions") {
		t.Fatalf("reopen with another P: %v", err)
	}
}

// TestBadInputs sends malformed and invalid requests: each gets its own
// code naming the field, and the node keeps serving.
func TestBadInputs(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	id := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	c := h.claim("q", 1, time.Minute)
	big := make([]byte, 1<<20+1)
	tests := []struct {
		name  string
		call  func() error
		code  connect.Code
		field string
	}{
		{"empty queue", func() error {
			_, err := h.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{}}))
			return err
		}, connect.CodeInvalidArgument, "task.queue"},
		{"bad queue", func() error {
			_, err := h.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "a b"}}))
			return err
		}, connect.CodeInvalidArgument, "task.queue"},
		{"no task", func() error {
			_, err := h.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{}))
			return err
		}, connect.CodeInvalidArgument, "task"},
		{"payload too large", func() error {
			_, err := h.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q", Payload: big}}))
			return err
		}, connect.CodeResourceExhausted, "task.payload"},
		{"w above N", func() error {
			_, err := h.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q"}, W: 3}))
			return err
		}, connect.CodeInvalidArgument, "w"},
		{"unknown id", func() error {
			_, err := h.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: 42}))
			return err
		}, connect.CodeNotFound, ""},
		{"zero id", func() error {
			_, err := h.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{}))
			return err
		}, connect.CodeInvalidArgument, "id"},
		{"stale claim id", func() error {
			_, err := h.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: id, ClaimId: c[0].ClaimId + 1000}))
			return err
		}, connect.CodeFailedPrecondition, ""},
		{"negative lease", func() error {
			_, err := h.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "q", Worker: "w", Lease: durationpb.New(-time.Second)}))
			return err
		}, connect.CodeInvalidArgument, "lease"},
		{"no worker", func() error {
			_, err := h.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "q"}))
			return err
		}, connect.CodeInvalidArgument, "worker"},
		{"huge page size", func() error {
			_, err := h.api.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{PageSize: 1 << 30}))
			return err
		}, connect.CodeInvalidArgument, "pageSize"},
		{"bad page token", func() error {
			_, err := h.api.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{PageToken: "!!"}))
			return err
		}, connect.CodeInvalidArgument, "pageToken"},
		{"progress out of range", func() error {
			_, err := h.api.Update(ctx, connect.NewRequest(&nornv1.UpdateRequest{Id: id, ClaimId: c[0].ClaimId, Seq: 1, Progress: 2}))
			return err
		}, connect.CodeInvalidArgument, "progress"},
		{"repeated id in a batch", func() error {
			_, err := h.api.EnqueueBatch(ctx, connect.NewRequest(&nornv1.EnqueueBatchRequest{
				Tasks: []*nornv1.TaskSpec{{Queue: "q"}, {Queue: "r"}}, Ids: []uint64{777, 777}}))
			return err
		}, connect.CodeInvalidArgument, "ids[1]"},
		{"different spec for an id", func() error {
			_, err := h.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Id: id, Task: &nornv1.TaskSpec{Queue: "other"}}))
			return err
		}, connect.CodeAlreadyExists, "id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			wantCode(t, err, tt.code)
			if tt.field != "" && !strings.Contains(err.Error(), tt.field+":") {
				t.Fatalf("error %q does not name field %q", err, tt.field)
			}
		})
	}
	// JSON over plain HTTP: wrong types and malformed bodies.
	for _, body := range []string{`{"task": {"queue": "q", "priority": "high"}}`, `{"task": `, `[]`} {
		resp, err := http.Post(h.srv.URL+"/norn.v1.TaskService/Enqueue", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "invalid_argument") {
			t.Fatalf("body %q: status %d, %s", body, resp.StatusCode, b)
		}
	}
	// A request over the size limit.
	huge := `{"task": {"queue": "q", "payload": "` + strings.Repeat("A", 5<<20) + `"}}`
	resp, err := http.Post(h.srv.URL+"/norn.v1.TaskService/Enqueue", "application/json", strings.NewReader(huge))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatal("a 5 MiB request was accepted")
	}
	// Still serving, and nothing was lost.
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_CLAIMED || got.Spec.Queue != "q" {
		t.Fatalf("task after bad inputs: %v", got)
	}
	h.enqueue(&nornv1.TaskSpec{Queue: "q"})
}

func TestCountListStatus(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	for range 25 {
		h.enqueue(&nornv1.TaskSpec{Queue: "a"})
	}
	h.enqueue(&nornv1.TaskSpec{Queue: "b"})
	h.claim("a", 5, time.Minute)
	cnt, err := h.api.CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{Queue: "a"}))
	if err != nil || cnt.Msg.Total != 25 || cnt.Msg.ByStatus["CLAIMED"] != 5 || cnt.Msg.ByStatus["READY"] != 20 {
		t.Fatalf("count: %v, %v", cnt.Msg, err)
	}
	seen := map[uint64]bool{}
	tok := ""
	for pages := 0; ; pages++ {
		r, err := h.api.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{Queue: "a", PageSize: 10, PageToken: tok}))
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range r.Msg.Tasks {
			if seen[task.Id] || task.Spec.Queue != "a" {
				t.Fatalf("listed %v twice or from the wrong queue", task.Id)
			}
			seen[task.Id] = true
		}
		if tok = r.Msg.NextPageToken; tok == "" {
			break
		}
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
	}
	if len(seen) != 25 {
		t.Fatalf("listed %d tasks, want 25", len(seen))
	}
	r, _ := h.api.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{Status: nornv1.TaskStatus_TASK_STATUS_CLAIMED}))
	if len(r.Msg.Tasks) != 5 {
		t.Fatalf("listed %d claimed tasks, want 5", len(r.Msg.Tasks))
	}
	st, err := h.admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{}))
	if err != nil || len(st.Msg.Partitions) != 8 || st.Msg.Partitions[0].Leader != "n1" || st.Msg.Partitions[0].RaftTerm == 0 {
		t.Fatalf("status: %v, %v", st.Msg, err)
	}
	var total uint64
	for _, p := range st.Msg.Partitions {
		for _, v := range p.Counts {
			total += v
		}
	}
	if total != 26 {
		t.Fatalf("status counts %d tasks, want 26", total)
	}
	st, err = h.admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{SkipCounts: true}))
	if err != nil || len(st.Msg.Partitions) != 8 {
		t.Fatalf("status without counts: %v, %v", st.Msg, err)
	}
	for _, p := range st.Msg.Partitions {
		if len(p.Counts) != 0 {
			t.Fatalf("status with skip_counts counted partition %d: %v", p.Id, p.Counts)
		}
	}
}

// TestCompleteBatch: one CompleteBatch completes many tasks; each
// completion succeeds or fails on its own with the code Complete would
// give, named by its index; a repeat of a completion that took effect
// succeeds.
func TestCompleteBatch(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	for range 4 {
		h.enqueue(&nornv1.TaskSpec{Queue: "q"})
	}
	c := h.claim("q", 4, time.Minute)
	if len(c) != 4 {
		t.Fatalf("claimed %d", len(c))
	}
	done := func(i int) *nornv1.CompleteRequest {
		return &nornv1.CompleteRequest{Id: c[i].Task.Id, ClaimId: c[i].ClaimId, Result: []byte{byte(i)}}
	}
	batch := []*nornv1.CompleteRequest{
		done(0),
		{Id: c[1].Task.Id, ClaimId: c[1].ClaimId + 1}, // stale claim
		done(2),
		{Id: 12345, ClaimId: 1}, // unknown task
		done(2),                 // twice in one batch
		{Id: c[3].Task.Id, ClaimId: c[3].ClaimId, W: 1}, // per-item w
	}
	r, err := h.api.CompleteBatch(ctx, connect.NewRequest(&nornv1.CompleteBatchRequest{Completions: batch}))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"", "failed_precondition", "", "not_found", "invalid_argument", "invalid_argument"}
	if len(r.Msg.Results) != len(want) {
		t.Fatalf("%d results for %d completions", len(r.Msg.Results), len(want))
	}
	for i, res := range r.Msg.Results {
		if res.Code != want[i] {
			t.Errorf("completion %d: code %q (%s), want %q", i, res.Code, res.Message, want[i])
		}
		if want[i] != "" && !strings.HasPrefix(res.Message, fmt.Sprintf("completions[%d]: ", i)) {
			t.Errorf("completion %d: message %q does not name it", i, res.Message)
		}
		if (want[i] == "") != (res.Acks == 1) {
			t.Errorf("completion %d: %d acks", i, res.Acks)
		}
	}
	for i, st := range []nornv1.TaskStatus{
		nornv1.TaskStatus_TASK_STATUS_COMPLETED, nornv1.TaskStatus_TASK_STATUS_CLAIMED,
		nornv1.TaskStatus_TASK_STATUS_COMPLETED, nornv1.TaskStatus_TASK_STATUS_CLAIMED,
	} {
		got := h.get(c[i].Task.Id)
		if got.Status != st {
			t.Errorf("task %d: %v, want %v", i, got.Status, st)
		}
		if st == nornv1.TaskStatus_TASK_STATUS_COMPLETED && (len(got.Result) != 1 || got.Result[0] != byte(i)) {
			t.Errorf("task %d: result %v", i, got.Result)
		}
	}
	// A retry of the batch's successes succeeds; the rest still fail.
	r, err = h.api.CompleteBatch(ctx, connect.NewRequest(&nornv1.CompleteBatchRequest{
		Completions: []*nornv1.CompleteRequest{done(0), done(1), done(3)}}))
	if err != nil {
		t.Fatal(err)
	}
	for i, res := range r.Msg.Results {
		if res.Code != "" {
			t.Errorf("second batch, completion %d: %s %s", i, res.Code, res.Message)
		}
	}
	if got := h.get(c[1].Task.Id); got.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED {
		t.Errorf("task 1 after its own complete: %v", got.Status)
	}
	// Whole-request errors.
	_, err = h.api.CompleteBatch(ctx, connect.NewRequest(&nornv1.CompleteBatchRequest{}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = h.api.CompleteBatch(ctx, connect.NewRequest(&nornv1.CompleteBatchRequest{
		Completions: make([]*nornv1.CompleteRequest, server.MaxCompleteBatch+1)}))
	wantCode(t, err, connect.CodeInvalidArgument)
}
