package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/storage"
)

func TestOutTooLong(t *testing.T) {
	const limit = 45 * time.Minute
	ms := func(d time.Duration) int64 { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(d).UnixMilli() }
	for _, tc := range []struct {
		name       string
		mine, peer int64
		out        bool
	}{
		{"equal", ms(0), ms(0), false},
		{"peer ahead within the limit", ms(0), ms(limit), false},
		{"peer ahead beyond the limit", ms(0), ms(limit + time.Millisecond), true},
		{"peer behind", ms(2 * limit), ms(0), false},
		{"no mark of mine (a new node)", 0, ms(0), false},
		{"no mark of the peer's", ms(0), 0, false},
	} {
		if got := outTooLong(tc.mine, tc.peer, limit); got != tc.out {
			t.Errorf("%s: outTooLong = %v, want %v", tc.name, got, tc.out)
		}
	}
	if got := rejoinLimit(time.Hour); got != limit {
		t.Errorf("rejoin limit of a 1 h retention: %s, want %s", got, limit)
	}
}

// TestRetentionNoResurrection: n3 is down while two tasks end (one
// cancelled, one completed) and stays down past the retention, so n1 and
// n2 delete them for good. Back, n3 still holds both READY; it must not
// bring them back (anti-entropy, reads), nor hand them out: it was out of
// the cluster longer than the retention allows, so it exchanges no task
// states, leads nothing, and says so in Status.
func TestRetentionNoResurrection(t *testing.T) {
	// A running clock the test shifts (a frozen one looks to the clock
	// guard like a clock that keeps stepping back).
	clock := &shiftClock{}
	ms := testClusterWith(t, 3, func(_ int, cfg *Config) {
		cfg.Clock = clock
		cfg.Retention = time.Hour
		cfg.AntiEntropyInterval = 200 * time.Millisecond
		cfg.AntiEntropySettle = 20 * time.Millisecond
	})
	n1, n2, n3 := ms[0], ms[1], ms[2]
	ctx := context.Background()
	var ids []uint64
	for range 2 {
		resp, err := n1.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
			Task: &nornv1.TaskSpec{Queue: "gone"}, W: 3}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Msg.GetId())
	}
	// Every node has been in the cluster: each keeps a mark.
	waitFor(t, 10*time.Second, "every node's in-cluster mark", func() bool {
		for _, m := range ms {
			if m.node.rejoin.mark.Load() == 0 {
				return false
			}
		}
		return true
	})

	cfg3 := n3.cfg
	cfg3.RaftAddr, cfg3.GossipAddr = n3.node.RaftAddr(), n3.node.GossipAddr()
	n3.stop()
	if _, err := n1.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: ids[0], W: 2})); err != nil {
		t.Fatal(err)
	}
	var claimed []*nornv1.ClaimedTask
	waitFor(t, 10*time.Second, "a claim of the second task", func() bool {
		resp, err := n1.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "gone", Worker: "w", Max: 1,
			Lease: durationpb.New(time.Minute)}))
		if err == nil {
			claimed = resp.Msg.GetTasks()
		}
		return len(claimed) == 1
	})
	if claimed[0].GetTask().GetId() != ids[1] {
		t.Fatalf("claimed %d, want %d", claimed[0].GetTask().GetId(), ids[1])
	}
	if _, err := n1.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: ids[1], ClaimId: claimed[0].GetClaimId()})); err != nil {
		t.Fatal(err)
	}

	// Past the retention: n1 and n2 delete both.
	clock.off.Add(int64(2 * time.Hour))
	gone := func(m *member) bool {
		for _, id := range ids {
			if _, err := m.node.store.TaskState(m.node.partition(id), id); !errors.Is(err, storage.ErrNotFound) {
				return false
			}
		}
		return true
	}
	waitFor(t, 20*time.Second, "n1 and n2 to delete the ended tasks", func() bool { return gone(n1) && gone(n2) })

	// n3 back, with the cancelled task READY in its replica. (The
	// completed one may be too, or not: its completion is an entry of the
	// partition's Raft group, which n3 may replay, with the forget, before
	// it is judged.)
	n3 = startMember(t, cfg3)
	for _, id := range ids[:1] {
		ts, err := n3.node.store.TaskState(n3.node.partition(id), id)
		if err != nil || ts.Terminals != nil {
			t.Fatalf("n3 restarted without task %d non-terminal: %v, %+v", id, err, ts)
		}
	}
	// n3 judges itself out too long, and the others judge it so.
	waitFor(t, 20*time.Second, "n3 out too long, as n1 and n2 see it", func() bool {
		return n3.node.rejoin.Out() != "" && n1.node.rejoin.peerOut("n3") != nil && n2.node.rejoin.peerOut("n3") != nil
	})
	st, err := adminClient(n3).Status(ctx, connect.NewRequest(&nornv1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.GetHealthy() {
		t.Errorf("n3 reports healthy: %v", st.Msg.GetProblems())
	}
	// What could bring the tasks back: anti-entropy rounds (several
	// intervals), a read through n3 (read repair from its replica), a
	// read through n1 (which would repair from n3's), a claim anywhere.
	for _, id := range ids {
		for _, m := range []*member{n3, n1} {
			if _, err := m.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id})); err == nil && m == n1 {
				t.Errorf("GetTask(%d) through n1 found the deleted task", id)
			}
		}
	}
	rounds := func(m *member) uint64 { return m.node.ae.Counters().Exchanges }
	r1, r2 := rounds(n1), rounds(n2)
	waitFor(t, 20*time.Second, "n1 and n2 to run a few anti-entropy rounds", func() bool {
		return rounds(n1) >= r1+3 && rounds(n2) >= r2+3
	})
	for _, m := range []*member{n1, n2} {
		if !gone(m) {
			t.Errorf("%s holds a task deleted by retention again", m.cfg.NodeID)
		}
	}
	for _, m := range ms[:2] {
		resp, err := m.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "gone", Worker: "w2", Max: 10,
			Lease: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Msg.GetTasks()) != 0 {
			t.Errorf("a claim through %s got %d deleted tasks", m.cfg.NodeID, len(resp.Msg.GetTasks()))
		}
	}
}
