package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestClusterNodeBackAtNewAddress stops n3 of a 3-node cluster (cleanly,
// as nornd does on SIGTERM) and starts it again with its data dir and id
// but every address elsewhere (127.0.0.2, new ports), as a Kubernetes pod
// rescheduled with a new IP. Then: every node's ring has n3's new
// addresses; every Raft configuration that has n3 (each partition group
// on every replica, and the meta group) has it at its new Raft address,
// still a voter where it was one; n3 is ready; writes with W=3 through
// n1 reach n3 (n1's replication dials the new address); tasks are
// claimed and completed through n3; n3's replicas apply what the leaders
// commit (they dial its new Raft address); and n3 leads partitions again.
// Before addresses followed nodes, the ring and the configurations kept
// the old addresses and n3 never caught up.
func TestClusterNodeBackAtNewAddress(t *testing.T) {
	if raceDetector {
		// hashicorp/raft v1.8.0 logs a follower's peer in pipelineSend
		// while startStopReplication rewrites it on an address change:
		// a data race in the library (hashicorp/raft#681, fix in #682),
		// which the race detector reported in 1 of 6 stressed runs and
		// 1 of 3 CI runs (session 22). Run it without -race:
		// go test -tags testhooks -run TestClusterNodeBackAtNewAddress ./node
		t.Skip("hashicorp/raft#681: a data race in the library on an address change")
	}
	ms := testCluster(t, 3)
	ctx := context.Background()
	before := enqueueN(t, ms, 12)

	cfg := ms[2].cfg
	oldRaft := ms[2].node.RaftAddr()
	ms[2].stop()
	cfg.APIAddr, cfg.RaftAddr, cfg.GossipAddr = "127.0.0.2:0", "127.0.0.2:0", "127.0.0.2:0"
	cfg.Join = []string{ms[0].node.GossipAddr()}
	back := startMember(t, cfg)
	ms[2] = back
	newRaft, newAPI, newGossip := back.node.RaftAddr(), back.cfg.APIAddr, back.node.GossipAddr()
	t.Logf("n3 back at raft %s (was %s), api %s, gossip %s", newRaft, oldRaft, newAPI, newGossip)

	waitFor(t, 20*time.Second, "every node's ring to have n3's new addresses", func() bool {
		for _, m := range ms {
			r := m.node.host.Ring()
			nd, ok := r.Node("n3")
			if !ok || nd.RaftAddr != newRaft || nd.APIAddr != newAPI || nd.GossipAddr != newGossip {
				return false
			}
		}
		return true
	})
	var stale string
	waitFor(t, 20*time.Second, "every Raft configuration to have n3 at its new address", func() bool {
		stale = configsWithStaleAddress(t, ms, "n3", newRaft)
		return stale == ""
	})
	waitFor(t, 20*time.Second, "n3 ready", back.node.Ready)

	// n1 replicates to n3's new address: W=3 needs its ack.
	var after []uint64
	for i := range 6 {
		r, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
			Task: &nornv1.TaskSpec{Queue: "q", Payload: fmt.Appendf(nil, "after %d", i)}, W: 3}))
		if err != nil {
			t.Fatalf("enqueue W=3 after n3 came back: %v", err)
		}
		after = append(after, r.Msg.Id)
	}

	// Claim and complete everything through n3.
	want := map[uint64]bool{}
	for _, id := range append(before, after...) {
		want[id] = true
	}
	deadline := time.Now().Add(15 * time.Second)
	for len(want) > 0 && time.Now().Before(deadline) {
		r, err := back.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "q", Worker: "w", Max: 8,
			Lease: durationpb.New(time.Minute), Wait: durationpb.New(time.Second)}))
		if err != nil {
			t.Fatalf("claim through n3: %v", err)
		}
		for _, c := range r.Msg.Tasks {
			if !want[c.Task.Id] {
				t.Fatalf("task %d claimed twice or unknown", c.Task.Id)
			}
			if _, err := back.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: c.Task.Id, ClaimId: c.ClaimId})); err != nil {
				t.Fatalf("complete %d through n3: %v", c.Task.Id, err)
			}
			delete(want, c.Task.Id)
		}
	}
	if len(want) > 0 {
		t.Fatalf("%d tasks not claimed through n3 in 15 s", len(want))
	}

	// n3's replicas apply what their leaders committed since.
	r := back.node.host.Ring()
	for p := range r.Partitions {
		if !r.Hosts(p, "n3") {
			continue
		}
		leader := groupLeader(t, ms, uint16(p))
		target := leader.node.group(uint16(p)).AppliedIndex()
		waitFor(t, 10*time.Second, fmt.Sprintf("n3's replica of partition %d to apply index %d", p, target), func() bool {
			return back.node.group(uint16(p)).AppliedIndex() >= target
		})
	}
	// And n3 leads again (the leader balancer hands it its share).
	waitFor(t, 20*time.Second, "n3 to lead a partition", func() bool {
		for _, g := range back.node.groupList() {
			if g != nil && g.IsLeader() {
				return true
			}
		}
		return false
	})
}

// configsWithStaleAddress returns a description of the first Raft
// configuration (a partition group or the meta group, on any member)
// that has node at another address than addr, or without the vote the
// ring gives it; "" when there is none.
func configsWithStaleAddress(t *testing.T, ms []*member, node, addr string) string {
	t.Helper()
	for _, m := range ms {
		r := m.node.host.Ring()
		for p, g := range m.node.groupList() {
			if g == nil {
				continue
			}
			servers, err := g.Servers()
			if err != nil {
				return fmt.Sprintf("%s p%d: %v", m.cfg.NodeID, p, err)
			}
			for _, s := range servers {
				if s.ID == node && (s.Address != addr || s.Voter != r.Hosts(p, node)) {
					return fmt.Sprintf("%s p%d: %+v", m.cfg.NodeID, p, s)
				}
			}
		}
		servers, err := m.node.host.Meta().Servers()
		if err != nil {
			return fmt.Sprintf("%s meta: %v", m.cfg.NodeID, err)
		}
		for _, s := range servers {
			if string(s.ID) == node && string(s.Address) != addr {
				return fmt.Sprintf("%s meta: %+v", m.cfg.NodeID, s)
			}
		}
	}
	return ""
}
