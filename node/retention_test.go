package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// Per-queue retention: each queue's finished tasks are deleted at its
// own retention (an hour, 30 days), the others' at the node's (7 days);
// the shortest retention in force bounds how long a node may be out of
// the cluster; clearing a queue's retention gives it the node's again.
func TestQueueRetention(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	queues := nornv1connect.NewQueueServiceClient(h.hc, h.srv.URL)
	set := func(q string, r time.Duration) {
		t.Helper()
		resp, err := queues.SetQueue(ctx, connect.NewRequest(&nornv1.SetQueueRequest{Queue: q,
			Settings: &nornv1.QueueSettings{Retention: durationpb.New(r)}}))
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Msg.GetQueue().GetSettings().GetRetention().AsDuration(); got != r {
			t.Fatalf("SetQueue answered retention %v, want %v", got, r)
		}
	}
	if got := h.node.rejoin.limit(); got != rejoinLimit(7*24*time.Hour) {
		t.Fatalf("rejoin limit %v without queue retentions, want the node's %v", got, rejoinLimit(7*24*time.Hour))
	}
	set("short", time.Hour)
	set("long", 30*24*time.Hour)
	if got := h.node.rejoin.limit(); got != rejoinLimit(time.Hour) {
		t.Fatalf("rejoin limit %v with an hour's retention on a queue, want %v", got, rejoinLimit(time.Hour))
	}
	ended := map[string]uint64{}
	for _, q := range []string{"short", "long", "q"} {
		id := h.enqueue(&nornv1.TaskSpec{Queue: q})
		if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: id})); err != nil {
			t.Fatal(err)
		}
		ended[q] = id
	}
	live := h.enqueue(&nornv1.TaskSpec{Queue: "short"})
	gone := func(q string, want bool) {
		t.Helper()
		_, err := h.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: ended[q]}))
		if want {
			wantCode(t, err, connect.CodeNotFound)
		} else if err != nil {
			t.Fatalf("task of %s read: %v, want it kept", q, err)
		}
	}
	h.clock.advance(time.Hour - time.Minute)
	h.node.dispatch.MonitorOnce()
	gone("short", false)
	h.clock.advance(2 * time.Minute)
	h.node.dispatch.MonitorOnce()
	gone("short", true)
	gone("long", false)
	gone("q", false)
	if got := h.get(live); got.Status != nornv1.TaskStatus_TASK_STATUS_READY {
		t.Fatalf("a live task of the short queue: %v", got.Status)
	}
	h.clock.advance(7 * 24 * time.Hour)
	h.node.dispatch.MonitorOnce()
	gone("q", true)
	gone("long", false)
	// Cleared: long's tasks are at the node's 7 days again (past).
	if _, err := queues.SetQueue(ctx, connect.NewRequest(&nornv1.SetQueueRequest{Queue: "long", Clear: []string{"retention"}})); err != nil {
		t.Fatal(err)
	}
	h.node.dispatch.MonitorOnce()
	gone("long", true)
	// Bad values name the field.
	for _, r := range []time.Duration{0, -time.Hour, 59 * time.Minute, 367 * 24 * time.Hour, time.Hour + time.Microsecond} {
		_, err := queues.SetQueue(ctx, connect.NewRequest(&nornv1.SetQueueRequest{Queue: "short",
			Settings: &nornv1.QueueSettings{Retention: durationpb.New(r)}}))
		wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.Contains(err.Error(), "settings.retention") {
			t.Fatalf("retention %v: %v does not name the field", r, err)
		}
	}
}
