package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TaskService.BulkAction retries or cancels a queue's matching tasks a
// page at a time, safe to run twice; it is for admins of the queue only,
// and names its bad fields.
func TestBulkAction(t *testing.T) {
	h, tok, admTok := aliceAndRoot(t)
	ctx := context.Background()
	as := func(token string, m *nornv1.BulkActionRequest) (*nornv1.BulkActionResponse, error) {
		req := connect.NewRequest(m)
		req.Header().Set("Authorization", "Bearer "+token)
		r, err := h.api.BulkAction(ctx, req)
		if err != nil {
			return nil, err
		}
		return r.Msg, nil
	}
	// Six tasks: three aborted (two with a timeout), three ready.
	for i := range 6 {
		if err := call(h.api.Enqueue, ctx, tok, &nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "mine"}}); err != nil {
			t.Fatal(err)
		}
		if i >= 3 {
			continue
		}
		req := connect.NewRequest(&nornv1.ClaimRequest{Queue: "mine", Worker: "w", Max: 1})
		req.Header().Set("Authorization", "Bearer "+tok)
		c, err := h.api.Claim(ctx, req)
		if err != nil || len(c.Msg.Tasks) != 1 {
			t.Fatalf("claim: %v, %v", c, err)
		}
		code := []string{"timeout", "timeout", "boom"}[i]
		if err := call(h.api.Abort, ctx, tok, &nornv1.AbortRequest{Id: c.Msg.Tasks[0].Task.Id, ClaimId: c.Msg.Tasks[0].ClaimId,
			Errors: []*nornv1.TaskError{{Code: code}}}); err != nil {
			t.Fatal(err)
		}
	}
	retry := &nornv1.BulkActionRequest{Action: nornv1.BulkActionRequest_ACTION_RETRY, Queue: "mine",
		Status: nornv1.TaskStatus_TASK_STATUS_ABORTED, ErrorContains: "timeout", PageSize: 1}
	_, err := as(tok, retry)
	wantCode(t, err, connect.CodePermissionDenied)

	run := func(m *nornv1.BulkActionRequest) (matched, done, skipped uint32) {
		t.Helper()
		m.PageToken = ""
		for pages := 0; ; pages++ {
			r, err := as(admTok, m)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Failures) > 0 || pages > 20 {
				t.Fatalf("bulk %v: failures %v after %d pages", m.Action, r.Failures, pages)
			}
			matched, done, skipped = matched+r.Matched, done+r.Done, skipped+r.Skipped
			if m.PageToken = r.NextPageToken; m.PageToken == "" {
				return
			}
		}
	}
	if matched, done, _ := run(retry); matched != 2 || done != 2 {
		t.Fatalf("bulk retry of the timeouts: %d matched, %d done; want 2, 2", matched, done)
	}
	if matched, _, _ := run(retry); matched != 0 {
		t.Fatalf("bulk retry again: %d matched, want 0", matched)
	}
	cancel := &nornv1.BulkActionRequest{Action: nornv1.BulkActionRequest_ACTION_CANCEL, Queue: "mine", PageSize: 4}
	if matched, done, skipped := run(cancel); matched != 6 || done != 5 || skipped != 1 {
		t.Fatalf("bulk cancel of every task: %d matched, %d done, %d skipped; want 6, 5 (the ready and retried), 1 (the aborted)", matched, done, skipped)
	}
	counts, err := h.api.CountTasks(ctx, func() *connect.Request[nornv1.CountTasksRequest] {
		r := connect.NewRequest(&nornv1.CountTasksRequest{Queue: "mine"})
		r.Header().Set("Authorization", "Bearer "+admTok)
		return r
	}())
	if err != nil || counts.Msg.ByStatus["CANCELLED"] != 5 || counts.Msg.ByStatus["ABORTED"] != 1 {
		t.Fatalf("counts after the bulk cancel: %v, %v", counts, err)
	}

	now := time.Now()
	for field, m := range map[string]*nornv1.BulkActionRequest{
		"action": {Queue: "mine"},
		"queue":  {Action: nornv1.BulkActionRequest_ACTION_CANCEL},
		"createdBefore": {Action: nornv1.BulkActionRequest_ACTION_CANCEL, Queue: "mine",
			CreatedAfter: timestamppb.New(now), CreatedBefore: timestamppb.New(now.Add(-time.Hour))},
		"errorContains": {Action: nornv1.BulkActionRequest_ACTION_CANCEL, Queue: "mine", ErrorContains: strings.Repeat("x", 1025)},
		"pageSize":      {Action: nornv1.BulkActionRequest_ACTION_CANCEL, Queue: "mine", PageSize: 1001},
	} {
		_, err := as(admTok, m)
		wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.Contains(err.Error(), field) {
			t.Errorf("bad %s: the error does not name it: %v", field, err)
		}
	}
}
