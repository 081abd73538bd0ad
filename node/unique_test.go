package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/client"
	"github.com/norn-dev/norn/dispatch"
	"github.com/norn-dev/norn/storage"
)

// enqueueUnique enqueues a task of queue with a unique key (and a window
// when forD > 0) and a payload, and returns the answer.
func (h *harness) enqueueUnique(queue, key, payload string, forD time.Duration) *nornv1.EnqueueResponse {
	h.t.Helper()
	spec := &nornv1.TaskSpec{Queue: queue, UniqueKey: key, Payload: []byte(payload)}
	if forD > 0 {
		spec.UniqueFor = durationpb.New(forD)
	}
	r, err := h.api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{Task: spec}))
	if err != nil {
		h.t.Fatal(err)
	}
	return r.Msg
}

func (h *harness) complete(id, claimID uint64) {
	h.t.Helper()
	if _, err := h.api.Complete(context.Background(), connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: claimID})); err != nil {
		h.t.Fatal(err)
	}
}

func wantAnswer(t *testing.T, what string, got *nornv1.EnqueueResponse, id uint64, dup bool) {
	t.Helper()
	if got.Id != id || got.Duplicate != dup || (dup && got.Acks != 0) || (!dup && got.Acks == 0) {
		t.Fatalf("%s: %v, want id %d duplicate %v", what, got, id, dup)
	}
}

// A key is held while its task is not finished, per queue; a finished
// holder gives it up to the next enqueue; the view shows the key.
func TestUniqueUntilFinished(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	first := h.enqueueUnique("q", "report:42", "a", 0)
	if first.Duplicate || first.Acks != 1 {
		t.Fatalf("first enqueue: %v", first)
	}
	a := first.Id
	wantAnswer(t, "second enqueue, another payload", h.enqueueUnique("q", "report:42", "b", 0), a, true)
	wantAnswer(t, "a retry of the first", h.enqueueUnique("q", "report:42", "a", 0), a, true)
	other := h.enqueueUnique("other", "report:42", "a", 0)
	if other.Duplicate || other.Id == a {
		t.Fatalf("the same key in another queue: %v", other)
	}
	if got := h.get(a).Spec; got.UniqueKey != "report:42" || got.UniqueFor != nil {
		t.Fatalf("the task's spec: %v", got)
	}
	// Claimed is not finished.
	c := h.claim("q", 10, time.Minute)
	if len(c) != 1 || c[0].Task.Id != a {
		t.Fatalf("claim: %v (a duplicate was created?)", c)
	}
	wantAnswer(t, "enqueue while claimed", h.enqueueUnique("q", "report:42", "c", 0), a, true)
	h.complete(a, c[0].ClaimId)
	next := h.enqueueUnique("q", "report:42", "d", 0)
	if next.Duplicate || next.Id == a {
		t.Fatalf("enqueue after the holder completed: %v", next)
	}
	wantAnswer(t, "and again", h.enqueueUnique("q", "report:42", "e", 0), next.Id, true)
	// An enqueue naming the id of the holder is a retry of it.
	r, err := h.api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{Id: next.Id,
		Task: &nornv1.TaskSpec{Queue: "q", UniqueKey: "report:42", Payload: []byte("d")}}))
	if err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, "a retry with the holder's id", r.Msg, next.Id, false)
}

// With unique_for the key stays held for the window after the enqueue,
// finished or not, and is free after it.
func TestUniqueWindow(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	a := h.enqueueUnique("q", "hourly", "a", time.Hour)
	c := h.claim("q", 1, time.Minute)
	h.complete(a.Id, c[0].ClaimId)
	h.clock.advance(time.Hour - time.Millisecond)
	wantAnswer(t, "completed, within the window", h.enqueueUnique("q", "hourly", "b", time.Hour), a.Id, true)
	h.clock.advance(time.Millisecond)
	b := h.enqueueUnique("q", "hourly", "b", time.Hour)
	if b.Duplicate || b.Id == a.Id {
		t.Fatalf("after the window: %v", b)
	}
	if got := h.get(b.Id).Spec.UniqueFor.AsDuration(); got != time.Hour {
		t.Fatalf("uniqueFor reads %v", got)
	}
	// Past the window a task not finished still holds its key.
	h.clock.advance(2 * time.Hour)
	wantAnswer(t, "not finished, past the window", h.enqueueUnique("q", "hourly", "c", time.Hour), b.Id, true)
}

// A Retry takes its task's key back; it is refused while another task
// holds it, and taken once that one is finished.
func TestUniqueRetry(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	d := h.enqueueUnique("q", "k", "d", 0).Id
	c := h.claim("q", 1, time.Minute)
	if _, err := h.api.Abort(ctx, connect.NewRequest(&nornv1.AbortRequest{Id: d, ClaimId: c[0].ClaimId})); err != nil {
		t.Fatal(err)
	}
	e := h.enqueueUnique("q", "k", "e", 0)
	if e.Duplicate {
		t.Fatalf("enqueue after the holder was aborted: %v", e)
	}
	retry := func() error {
		_, err := h.api.Retry(ctx, connect.NewRequest(&nornv1.RetryRequest{Id: d}))
		return err
	}
	err := retry()
	wantCode(t, err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), fmt.Sprint(e.Id)) {
		t.Fatalf("the refusal does not name the holder: %v", err)
	}
	if got := h.get(d).Status; got != nornv1.TaskStatus_TASK_STATUS_ABORTED {
		t.Fatalf("the refused retry revived the task: %v", got)
	}
	if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: e.Id})); err != nil {
		t.Fatal(err)
	}
	if err := retry(); err != nil {
		t.Fatalf("retry once the holder is cancelled: %v", err)
	}
	wantAnswer(t, "enqueue after the retry", h.enqueueUnique("q", "k", "f", 0), d, true)
	if c := h.claim("q", 10, time.Minute); len(c) != 1 || c[0].Task.Id != d {
		t.Fatalf("claims after the retry: %v", c)
	}
}

func TestUniqueBadInput(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	for _, c := range []struct {
		spec  *nornv1.TaskSpec
		field string
	}{
		{&nornv1.TaskSpec{Queue: "q", UniqueFor: durationpb.New(time.Hour)}, "task.uniqueFor"},
		{&nornv1.TaskSpec{Queue: "q", UniqueKey: "k", UniqueFor: durationpb.New(time.Second / 2)}, "task.uniqueFor"},
		{&nornv1.TaskSpec{Queue: "q", UniqueKey: "k", UniqueFor: durationpb.New(367 * 24 * time.Hour)}, "task.uniqueFor"},
		{&nornv1.TaskSpec{Queue: "q", UniqueKey: "a\x00b"}, "task.uniqueKey"},
		{&nornv1.TaskSpec{Queue: "q", UniqueKey: strings.Repeat("k", 257)}, "task.uniqueKey"},
	} {
		_, err := h.api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{Task: c.spec}))
		wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("%v: %v does not name %s", c.spec, err, c.field)
		}
	}
	_, err := h.api.EnqueueBatch(context.Background(), connect.NewRequest(&nornv1.EnqueueBatchRequest{
		Tasks: []*nornv1.TaskSpec{{Queue: "q"}, {Queue: "q", UniqueFor: durationpb.New(time.Hour)}}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "tasks[1].uniqueFor") {
		t.Fatalf("batch: %v", err)
	}
}

// A batch takes the keys of its tasks that have one: a key held answers
// the holder, two tasks of the batch with one key make one task.
func TestUniqueBatch(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	held := h.enqueueUnique("q", "held", "x", 0).Id
	r, err := h.api.EnqueueBatch(context.Background(), connect.NewRequest(&nornv1.EnqueueBatchRequest{
		Tasks: []*nornv1.TaskSpec{
			{Queue: "q", UniqueKey: "held", Payload: []byte("1")},
			{Queue: "q", UniqueKey: "new", Payload: []byte("2")},
			{Queue: "q", Payload: []byte("3")},
			{Queue: "q", UniqueKey: "new", Payload: []byte("4")},
		}}))
	if err != nil {
		t.Fatal(err)
	}
	ids, dups := r.Msg.Ids, r.Msg.Duplicates
	if len(ids) != 4 || len(dups) != 4 || ids[0] != held || !dups[0] || dups[2] || ids[1] != ids[3] || dups[1] == dups[3] {
		t.Fatalf("batch: ids %v duplicates %v (held %d)", ids, dups, held)
	}
	c := h.claim("q", 10, time.Minute)
	if len(c) != 3 {
		t.Fatalf("the queue holds %d tasks, want 3 (held, new, plain): %v", len(c), c)
	}
	r, err = h.api.EnqueueBatch(context.Background(), connect.NewRequest(&nornv1.EnqueueBatchRequest{
		Tasks: []*nornv1.TaskSpec{{Queue: "q"}}}))
	if err != nil || r.Msg.Duplicates != nil {
		t.Fatalf("a batch without keys: %v, %v", r, err)
	}
}

// Across nodes: enqueues of one key from every node at once make one
// task, whichever node leads the key's partition.
func TestClusterUniqueConcurrent(t *testing.T) {
	ms := testCluster(t, 3)
	for k := range 4 {
		key := fmt.Sprintf("key-%d", k)
		answers := make([]*nornv1.EnqueueResponse, 6)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() {
				r, err := ms[i%3].api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{
					Task: &nornv1.TaskSpec{Queue: "q", UniqueKey: key, Payload: []byte(fmt.Sprint(i))}}))
				if err != nil {
					t.Error(err)
					return
				}
				answers[i] = r.Msg
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		created := 0
		for _, a := range answers {
			if a.Id != answers[0].Id {
				t.Fatalf("%s: answers name different tasks: %v", key, answers)
			}
			if !a.Duplicate {
				created++
			}
		}
		if created != 1 {
			t.Fatalf("%s: %d answers say they created the task: %v", key, created, answers)
		}
	}
	r, err := ms[0].api.CountTasks(context.Background(), connect.NewRequest(&nornv1.CountTasksRequest{Queue: "q"}))
	if err != nil {
		t.Fatal(err)
	}
	if r.Msg.GetTotal() != 4 {
		t.Fatalf("the queue holds %d tasks, want 4: %v", r.Msg.GetTotal(), r.Msg)
	}
}

// The seeded bug unique-after-write makes a second task with a held
// key: what the Jepsen checker must catch.
func TestSeededBugUniqueAfterWrite(t *testing.T) {
	h := newHarnessWith(t, t.TempDir(), nil, func(cfg *Config) { cfg.TestBugs.UniqueAfterWrite = true })
	a := h.enqueueUnique("q", "k", "a", 0)
	wantAnswer(t, "second enqueue", h.enqueueUnique("q", "k", "b", 0), a.Id, true)
	if c := h.claim("q", 10, time.Minute); len(c) != 2 {
		t.Fatalf("with the bug the queue holds %d tasks, want 2", len(c))
	}
}

// The sweep forgets the records of keys whose holder is finished (past
// its window) or gone past the phantom limit, and keeps the others.
func TestUniqueSweep(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	st := h.node.store
	record := func(queue, key string) bool {
		t.Helper()
		_, err := st.ClaimFSMUnique(h.node.host.KeyPartition(queue, key), queue, key)
		if err != nil && !errors.Is(err, storage.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	done := h.enqueueUnique("q", "done", "a", 0).Id
	h.enqueueUnique("q", "live", "b", 0)
	windowed := h.enqueueUnique("w", "window", "c", 2*time.Hour).Id
	// A phantom: a key taken for a task that was never written.
	p := h.node.host.KeyPartition("q", "phantom")
	if _, err := h.node.dispatch.Unique(p, []claims.UniqueOp{{Kind: claims.UniqueTake, Queue: "q", Key: "phantom", ID: 12345}}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"q", "w"} {
		for {
			c := h.claim(q, 10, time.Hour)
			if len(c) == 0 {
				break
			}
			for _, ct := range c {
				if ct.Task.Id == done || ct.Task.Id == windowed {
					h.complete(ct.Task.Id, ct.ClaimId)
				}
			}
		}
	}
	h.node.dispatch.SweepUniquesOnce()
	if !record("q", "done") {
		t.Fatal("a record forgotten within the settle time")
	}
	h.clock.advance(dispatch.UniqueSettle)
	h.node.dispatch.SweepUniquesOnce()
	if record("q", "done") || !record("q", "live") || !record("w", "window") || !record("q", "phantom") {
		t.Fatalf("after a sweep: done %v live %v window %v phantom %v; want only done forgotten",
			record("q", "done"), record("q", "live"), record("w", "window"), record("q", "phantom"))
	}
	h.clock.advance(2 * time.Hour)
	h.node.dispatch.SweepUniquesOnce()
	if record("w", "window") || !record("q", "phantom") || !record("q", "live") {
		t.Fatalf("past the window: window %v phantom %v live %v", record("w", "window"), record("q", "phantom"), record("q", "live"))
	}
	// The phantom limit is the rejoin limit: no replica away longer
	// comes back with the task.
	h.clock.advance(h.node.rejoin.limit())
	h.node.dispatch.SweepUniquesOnce()
	if record("q", "phantom") || !record("q", "live") {
		t.Fatalf("past the window and the phantom limit: window %v phantom %v live %v", record("w", "window"), record("q", "phantom"), record("q", "live"))
	}
	// A key forgotten is free.
	if a := h.enqueueUnique("q", "phantom", "d", 0); a.Duplicate {
		t.Fatalf("the phantom's key after the sweep: %v", a)
	}
}

// The Go client says which enqueues were duplicates, one by one and in
// a batch, and runs the schedule calls.
func TestClientUniqueAndSchedules(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	c, err := client.New(h.srv.URL, client.WithHTTPClient(h.hc))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	var dup bool
	first, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "q", UniqueKey: "k"}, client.WithDuplicate(&dup))
	if err != nil || dup {
		t.Fatalf("first: %d, %v, duplicate %v", first, err, dup)
	}
	again, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "q", UniqueKey: "k", Payload: []byte("x")}, client.WithDuplicate(&dup))
	if err != nil || !dup || again != first {
		t.Fatalf("again: %d, %v, duplicate %v (first %d)", again, err, dup, first)
	}
	var dups []bool
	ids, err := c.EnqueueBatch(ctx, []*nornv1.TaskSpec{{Queue: "q", UniqueKey: "k"}, {Queue: "q"}}, client.WithDuplicates(&dups))
	if err != nil || len(ids) != 2 || ids[0] != first || len(dups) != 2 || !dups[0] || dups[1] {
		t.Fatalf("batch: %v, %v, %v", ids, dups, err)
	}
	ids, err = c.EnqueueBatch(ctx, []*nornv1.TaskSpec{{Queue: "q"}}, client.WithDuplicates(&dups))
	if err != nil || len(dups) != 1 || dups[0] {
		t.Fatalf("a batch without keys: %v, %v, %v", ids, dups, err)
	}

	s, err := c.CreateSchedule(ctx, &nornv1.Schedule{Name: "s", Interval: durationpb.New(time.Minute), Template: &nornv1.TaskSpec{Queue: "sq"}})
	if err != nil || s.GetName() != "s" || s.GetNextTick() == nil {
		t.Fatalf("create: %v, %v", s, err)
	}
	if _, err := c.CreateSchedule(ctx, s); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("a second create: %v", err)
	}
	if s, err = c.PauseSchedule(ctx, "s", true); err != nil || !s.GetPaused() {
		t.Fatalf("pause: %v, %v", s, err)
	}
	if s, err = c.UpdateSchedule(ctx, &nornv1.Schedule{Name: "s", Cron: "@daily", Template: &nornv1.TaskSpec{Queue: "sq"}}); err != nil || s.GetCron() != "@daily" {
		t.Fatalf("update: %v, %v", s, err)
	}
	id, err := c.TriggerSchedule(ctx, "s")
	if err != nil || h.get(id).Spec.Queue != "sq" {
		t.Fatalf("trigger: %d, %v", id, err)
	}
	if all, err := c.ListSchedules(ctx); err != nil || len(all) != 1 {
		t.Fatalf("list: %v, %v", all, err)
	}
	if err := c.DeleteSchedule(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSchedule(ctx, "s"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("get after delete: %v", err)
	}
}
