package node

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// queues is m's QueueService client.
func (m *member) queues() nornv1connect.QueueServiceClient {
	return nornv1connect.NewQueueServiceClient(http.DefaultClient, "http://"+m.cfg.APIAddr)
}

func setQueue(t *testing.T, m *member, req *nornv1.SetQueueRequest) *nornv1.SetQueueResponse {
	t.Helper()
	resp, err := m.queues().SetQueue(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("SetQueue %v via %s: %v", req, m.cfg.NodeID, err)
	}
	return resp.Msg
}

// A paused queue: claims through every node get nothing and a long poll
// waits, enqueues succeed, and a task claimed before the pause is renewed
// and completed; once resumed (through another node), the waiting long
// poll gets a task. The pause holds across a restart: the node applies
// it before it hears from anyone.
func TestQueuePauseAndResume(t *testing.T) {
	ms := testCluster(t, 3)
	enqueueAll(t, ms[0], "mail", 0)
	held := claimN(t, ms[1], "mail", 1)
	if len(held) != 1 {
		t.Fatalf("claim before the pause: %v", held)
	}
	resp := setQueue(t, ms[2], &nornv1.SetQueueRequest{Queue: "mail", Settings: &nornv1.QueueSettings{Paused: new(true)}})
	if !resp.GetQueue().GetSettings().GetPaused() || len(resp.GetPendingNodes()) != 0 {
		t.Fatalf("SetQueue answered %v", resp)
	}
	for _, m := range ms {
		if !m.node.host.Queues().Get("mail").Paused {
			t.Fatalf("%s has not applied the pause when SetQueue answered", m.cfg.NodeID)
		}
	}
	ids := map[uint64]bool{}
	for range 4 {
		ids[enqueueAll(t, ms[0], "mail", 0)] = true
	}
	for _, m := range ms {
		if got := claimN(t, m, "mail", 10); len(got) != 0 {
			t.Fatalf("a claim of a paused queue via %s got %d tasks", m.cfg.NodeID, len(got))
		}
	}
	// The queue's oldest ready task, across the partitions of every node.
	oldest := uint64(0)
	for id := range ids {
		if oldest == 0 || id < oldest {
			oldest = id
		}
	}
	// Counts come from one replica per partition: a follower that has
	// not applied the first task's claim yet still holds it ready.
	for _, m := range ms {
		var q *nornv1.Queue
		waitFor(t, 10*time.Second, "GetQueue via "+m.cfg.NodeID+" to show the oldest ready task", func() bool {
			resp, err := m.queues().GetQueue(context.Background(), connect.NewRequest(&nornv1.GetQueueRequest{Queue: "mail"}))
			if err != nil {
				t.Fatal(err)
			}
			q = resp.Msg.Queue
			return q.GetOldestReadyId() == oldest
		})
		if q.GetOldestReadyAge() == nil || q.GetOldestReadyAge().AsDuration() > time.Minute {
			t.Fatalf("GetQueue via %s: oldest ready %d waited %v", m.cfg.NodeID, q.GetOldestReadyId(), q.GetOldestReadyAge())
		}
	}
	// The task claimed before the pause: renewed and completed.
	ct := held[0]
	if _, err := ms[0].api.Renew(context.Background(), connect.NewRequest(&nornv1.RenewRequest{Id: ct.Task.Id, ClaimId: ct.ClaimId})); err != nil {
		t.Fatalf("renew while paused: %v", err)
	}
	if _, err := ms[0].api.Complete(context.Background(), connect.NewRequest(&nornv1.CompleteRequest{Id: ct.Task.Id, ClaimId: ct.ClaimId})); err != nil {
		t.Fatalf("complete while paused: %v", err)
	}

	// A long poll waits through the pause and gets a task once resumed.
	polled := make(chan []*nornv1.ClaimedTask, 1)
	errs := make(chan error, 1)
	go func() {
		resp, err := ms[1].api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{
			Queue: "mail", Worker: "w", Wait: durationpb.New(20 * time.Second)}))
		if err != nil {
			errs <- err
			return
		}
		polled <- resp.Msg.Tasks
	}()
	waitFor(t, 10*time.Second, "the long poll waiting", func() bool { return ms[1].node.waiters.Waiting("mail") })
	select {
	case got := <-polled:
		t.Fatalf("the long poll of a paused queue returned %v", got)
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(300 * time.Millisecond):
	}
	setQueue(t, ms[0], &nornv1.SetQueueRequest{Queue: "mail", Clear: []string{"paused"}})
	select {
	case got := <-polled:
		if len(got) != 1 || !ids[got[0].Task.Id] {
			t.Fatalf("the long poll got %v after the resume", got)
		}
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(15 * time.Second):
		t.Fatal("the long poll did not return after the resume")
	}

	// Paused again, across a restart of a node.
	setQueue(t, ms[1], &nornv1.SetQueueRequest{Queue: "mail", Settings: &nornv1.QueueSettings{Paused: new(true)}})
	ms[2] = restartMember(t, ms[2])
	if !ms[2].node.host.Queues().Get("mail").Paused {
		t.Fatal("a restarted node lost the pause")
	}
	waitFor(t, 30*time.Second, "the restarted node ready", ms[2].node.Ready)
	for _, m := range ms {
		if got := claimN(t, m, "mail", 10); len(got) != 0 {
			t.Fatalf("after a restart, a claim of a paused queue via %s got %d tasks", m.cfg.NodeID, len(got))
		}
	}
}

// A queue's default lease and retry policy apply to the claims and
// enqueues that name none; GetQueue and ListQueues show the settings and
// the counts; bad settings are refused naming the field.
func TestQueueDefaultsAndValidation(t *testing.T) {
	ms := testCluster(t, 3)
	setQueue(t, ms[0], &nornv1.SetQueueRequest{Queue: "fragile", Settings: &nornv1.QueueSettings{
		DefaultLease: durationpb.New(7 * time.Second),
		DefaultRetry: &nornv1.RetryPolicy{MaxAttempts: 4, InitialBackoff: durationpb.New(time.Second), MaxBackoff: durationpb.New(time.Minute), Multiplier: 3}}})
	id := enqueueAll(t, ms[1], "fragile", 0)
	other := enqueueAll(t, ms[1], "plain", 0)
	for _, x := range []struct {
		id   uint64
		want uint32
	}{{id, 4}, {other, 0}} {
		got, err := ms[2].api.GetTask(context.Background(), connect.NewRequest(&nornv1.GetTaskRequest{Id: x.id}))
		if err != nil {
			t.Fatal(err)
		}
		if p := got.Msg.GetTask().GetSpec().GetRetry(); p.GetMaxAttempts() != x.want || (x.want != 0 && p.GetMultiplier() != 3) {
			t.Fatalf("task %d's retry policy: %v, want max attempts %d", x.id, p, x.want)
		}
	}
	before := time.Now()
	resp, err := ms[2].api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{Queue: "fragile", Worker: "w"}))
	if err != nil || len(resp.Msg.Tasks) != 1 {
		t.Fatalf("claim: %v %v", resp, err)
	}
	if lease := resp.Msg.Tasks[0].Expiry.AsTime().Sub(before); lease < 6*time.Second || lease > 9*time.Second {
		t.Fatalf("a claim naming no lease got %s, want the queue's 7s", lease)
	}

	// Counts come from one replica per partition: the claim reaches a
	// follower's counters once it applies it.
	var q *nornv1.Queue
	waitFor(t, 10*time.Second, "GetQueue to count the claim", func() bool {
		resp, err := ms[1].queues().GetQueue(context.Background(), connect.NewRequest(&nornv1.GetQueueRequest{Queue: "fragile"}))
		if err != nil {
			t.Fatal(err)
		}
		q = resp.Msg.Queue
		return q.GetByStatus()["CLAIMED"] == 1
	})
	if s := q.GetSettings(); s.GetDefaultLease().AsDuration() != 7*time.Second || s.GetDefaultRetry().GetMaxAttempts() != 4 ||
		q.GetTotal() != 1 || q.GetSettingsVersion() == 0 {
		t.Fatalf("GetQueue: %v", q)
	}
	setQueue(t, ms[2], &nornv1.SetQueueRequest{Queue: "idle", Settings: &nornv1.QueueSettings{Paused: new(true)}})
	list, err := ms[0].queues().ListQueues(context.Background(), connect.NewRequest(&nornv1.ListQueuesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, q := range list.Msg.Queues {
		names = append(names, q.Name)
		if q.Name == "plain" && (q.GetByStatus()["READY"] != 1 || q.GetSettings().GetPaused()) {
			t.Fatalf("ListQueues' plain: %v", q)
		}
		if q.Name == "idle" && (!q.GetSettings().GetPaused() || q.GetTotal() != 0) {
			t.Fatalf("ListQueues' idle: %v", q)
		}
	}
	if strings.Join(names, ",") != "fragile,idle,plain" {
		t.Fatalf("ListQueues: %v", names)
	}

	for _, c := range []struct {
		req   *nornv1.SetQueueRequest
		field string
	}{
		{&nornv1.SetQueueRequest{Queue: "q", Clear: []string{"speed"}}, "clear[0]"},
		{&nornv1.SetQueueRequest{Queue: "q", Settings: &nornv1.QueueSettings{Paused: new(true)}, Clear: []string{"paused"}}, "clear[0]"},
		{&nornv1.SetQueueRequest{Queue: "q"}, "settings"},
		{&nornv1.SetQueueRequest{Queue: "bad queue", Settings: &nornv1.QueueSettings{Paused: new(true)}}, "queue"},
		{&nornv1.SetQueueRequest{Queue: "q", Settings: &nornv1.QueueSettings{DefaultLease: durationpb.New(-time.Second)}}, "settings.defaultLease"},
		{&nornv1.SetQueueRequest{Queue: "q", Settings: &nornv1.QueueSettings{DefaultRetry: &nornv1.RetryPolicy{Multiplier: 0.5}}}, "settings.defaultRetry.multiplier"},
		{&nornv1.SetQueueRequest{Queue: "q", Settings: &nornv1.QueueSettings{DefaultRetry: &nornv1.RetryPolicy{
			InitialBackoff: durationpb.New(time.Minute), MaxBackoff: durationpb.New(time.Second)}}}, "settings.defaultRetry.maxBackoff"},
	} {
		_, err := ms[0].queues().SetQueue(context.Background(), connect.NewRequest(c.req))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), c.field+":") {
			t.Errorf("SetQueue %v: %v, want INVALID_ARGUMENT naming %s", c.req, err, c.field)
		}
	}
}
