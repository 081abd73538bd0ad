package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/server"
)

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
		}, connect.CodeInvalidArgument, "task.payload"},
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
		{"lease past the maximum, in the API's own units", func() error {
			_, err := h.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "q", Worker: "w", Lease: durationpb.New(25 * time.Hour)}))
			if err != nil && !strings.Contains(err.Error(), "got 90000s") {
				return errors.New(err.Error() + " (want the lease as 90000s)") // no code: the test fails
			}
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
			if tt.code == connect.CodeInvalidArgument && tt.field != "" && !slices.Contains(badRequestFields(err), tt.field) {
				t.Fatalf("error %q: its google.rpc.BadRequest names %q, want %q", err, badRequestFields(err), tt.field)
			}
		})
	}
	// JSON over plain HTTP: wrong types and malformed bodies.
	for _, body := range []string{`{"task": {"queue": "q", "priority": "high"}}`, `{"task": `, `[]`,
		`{"task": {"queue": "q", "priority": 1.5}}`, `{"task": {"queue": "q", "priority": 1e10}}`} {
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
	// An integer written with an exponent is the integer (docs/API.md).
	resp, err := http.Post(h.srv.URL+"/norn.v1.TaskService/Enqueue", "application/json", strings.NewReader(`{"task": {"queue": "q", "priority": 1e3}}`))
	if err != nil {
		t.Fatal(err)
	}
	var enq struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&enq)
	resp.Body.Close()
	if n, _ := strconv.ParseUint(enq.ID, 10, 64); resp.StatusCode != http.StatusOK || h.get(n).Spec.Priority != 1000 {
		t.Fatalf("priority 1e3: status %d, id %q", resp.StatusCode, enq.ID)
	}
	// A request over the size limit.
	huge := `{"task": {"queue": "q", "payload": "` + strings.Repeat("A", 5<<20) + `"}}`
	resp, err = http.Post(h.srv.URL+"/norn.v1.TaskService/Enqueue", "application/json", strings.NewReader(huge))
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

// CountTasks reads counters, yet counts a delayed task and one whose
// dependency is running as DELAYED and the dependant as READY once the
// dependency completed, as GetTask shows them; a terminal task as its
// terminal status.
func TestCountDelaysAndDependencies(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	count := func(queue string, want map[string]uint64) {
		t.Helper()
		cnt, err := h.api.CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{Queue: queue}))
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(cnt.Msg.ByStatus, want) {
			t.Fatalf("count of %q: %v, want %v", queue, cnt.Msg.ByStatus, want)
		}
	}
	dep := h.enqueue(&nornv1.TaskSpec{Queue: "parent"})
	child := h.enqueue(&nornv1.TaskSpec{Queue: "child", DependsOn: []uint64{dep}})
	h.enqueue(&nornv1.TaskSpec{Queue: "child", NotBefore: timestamppb.New(time.Now().Add(time.Hour))})
	h.enqueue(&nornv1.TaskSpec{Queue: "child"})
	count("child", map[string]uint64{"DELAYED": 2, "READY": 1})
	if s := h.get(child).Status; s != nornv1.TaskStatus_TASK_STATUS_DELAYED {
		t.Fatalf("dependant of a ready task is %v", s)
	}
	got := h.claim("parent", 1, time.Minute)
	if len(got) != 1 {
		t.Fatalf("claimed %v", got)
	}
	count("", map[string]uint64{"DELAYED": 2, "READY": 1, "CLAIMED": 1})
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: dep, ClaimId: got[0].ClaimId})); err != nil {
		t.Fatal(err)
	}
	count("parent", map[string]uint64{"COMPLETED": 1})
	waitFor(t, 5*time.Second, "the dependant counted ready", func() bool {
		cnt, err := h.api.CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{Queue: "child"}))
		return err == nil && maps.Equal(cnt.Msg.ByStatus, map[string]uint64{"DELAYED": 1, "READY": 2})
	})
	if s := h.get(child).Status; s != nornv1.TaskStatus_TASK_STATUS_READY {
		t.Fatalf("dependant of a completed task is %v", s)
	}
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

// badRequestFields are the fields err's google.rpc.BadRequest details
// name.
func badRequestFields(err error) []string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	var out []string
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if br, ok := v.(*errdetails.BadRequest); ok {
				for _, fv := range br.GetFieldViolations() {
					out = append(out, fv.GetField())
				}
			}
		}
	}
	return out
}
