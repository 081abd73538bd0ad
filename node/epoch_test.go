package node

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/testhooks"
	"github.com/norn-dev/norn/transport"
)

// TestStaleRingCoordinatorAfterMove: a coordinator whose ring predates a
// finished move must not count the acks of the cohort that no longer
// owns the partition. n1 is down while its replica of partition p moves
// to n4, then restarts from its old ring.json and is held there (as if
// cut off from gossip and the meta group), and n3 is down: n1 writes to
// its old cohort (n1, n2, n3), acks itself, and n2 acks too. That is 2
// acks, yet only one replica of p's cohort now (n2, n3, n4) holds the
// task, and n1 drops its replica once it learns the ring. n2 must refuse
// the write as one from a ring older than p's cohort, naming both
// epochs; n1 then pulls n2's ring and writes to the new cohort.
func TestStaleRingCoordinatorAfterMove(t *testing.T) {
	if !testhooks.Built {
		t.Skip("holds a node on an old ring: needs -tags testhooks")
	}
	var hold atomic.Bool
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		// The moves' fills need no periodic rounds (the driver starts
		// them); without rounds nothing but the write itself reaches n4.
		cfg.AntiEntropySettle = 50 * time.Millisecond
		if i == 0 {
			cfg.HoldRing = hold.Load
		}
	})
	n1, n2, n3 := ms[0], ms[1], ms[2]
	n4 := startJoiner(t, ms, 4)
	before := n1.node.host.Ring()

	// n1 goes down with the ring of before the move in its data dir.
	cfg1 := n1.cfg
	cfg1.RaftAddr, cfg1.GossipAddr = n1.node.RaftAddr(), n1.node.GossipAddr()
	n1.stop()
	live := []*member{n2, n3, n4}
	joinAndRebalance(t, adminClient(n2), "n4")
	after := waitMovesDone(t, metaLeader(t, live), 2*time.Minute)
	p := -1
	for _, mv := range after.Moves {
		if mv.From == "n1" && mv.To == "n4" {
			p = mv.Partition
			break
		}
	}
	if p < 0 {
		t.Fatalf("no partition moved from n1 to n4: %+v", after.Moves)
	}
	waitFor(t, 20*time.Second, "n2, n3 and n4 on the ring of the finished move", func() bool {
		for _, m := range live {
			if r := m.node.host.Ring(); r == nil || r.Epoch < after.Epoch {
				return false
			}
		}
		return true
	})

	// n1 back, held on its old ring; n3 down.
	hold.Store(true)
	n1 = startMember(t, cfg1)
	if r := n1.node.host.Ring(); r.Epoch != before.Epoch || !r.Hosts(p, "n1") {
		t.Fatalf("n1 restarted on epoch %d (want %d, holding partition %d)", r.Epoch, before.Epoch, p)
	}
	n3.stop()

	// The refusal names the reason: p's cohort changed after the
	// writer's ring.
	next := uint64(1 << 40)
	idIn := func() uint64 {
		for ; ring.Partition(next, after.Partitions) != p; next++ {
		}
		next++
		return next - 1
	}
	state := (&crdt.Task{ID: idIn(), Spec: &crdt.Spec{Queue: "q", CreatedAt: crdt.Timestamp{WallMs: 1, Node: 1}}}).Encode()
	replicate := func(epoch uint64) error {
		req := connect.NewRequest(&nornv1.ReplicateRequest{Tasks: [][]byte{state}})
		req.Header().Set(transport.HeaderNode, "n1")
		req.Header().Set(transport.HeaderCluster, after.ClusterID)
		req.Header().Set(transport.HeaderEpoch, strconv.FormatUint(epoch, 10))
		_, err := n2.peer.Replicate(context.Background(), req)
		return err
	}
	err := replicate(before.Epoch)
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "cohort") ||
		!strings.Contains(err.Error(), fmt.Sprintf("epoch %d", before.Epoch)) {
		t.Errorf("n2 took (or refused for another reason) a write of partition %d from ring epoch %d: %v", p, before.Epoch, err)
	}

	// A write through n1 with w=2 is acked only once two members of p's
	// cohort now hold it.
	resp, err := n1.api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{
		Id: idIn(), Task: &nornv1.TaskSpec{Queue: "q"}, W: 2}))
	if err != nil {
		t.Fatalf("enqueue through n1: %v", err)
	}
	got := resp.Msg.GetId()
	for _, m := range []*member{n2, n4} {
		if _, err := m.node.store.TaskState(uint16(p), got); err != nil {
			t.Errorf("%s, in partition %d's cohort, lacks task %d acked with w=2 by n1 (ring epoch %d): %v",
				m.cfg.NodeID, p, got, n1.node.host.Ring().Epoch, err)
		}
	}
	if r := n1.node.host.Ring(); r.Epoch < after.Epoch {
		t.Errorf("n1 is still on ring epoch %d after the refusal (want %d or later)", r.Epoch, after.Epoch)
	}
	// The same write from the current ring is taken.
	if err := replicate(after.Epoch); err != nil {
		t.Fatalf("n2 refused a write from the current ring: %v", err)
	}
}
