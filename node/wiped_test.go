package node

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cluster"
)

// TestDataDirIncarnation: a new data dir gets an incarnation, kept across
// reopens; a norn.json from before incarnations gets one written (and
// keeps it); a data dir whose store is gone gets a new one; P is still
// checked.
func TestDataDirIncarnation(t *testing.T) {
	dir := t.TempDir()
	read := func() dataDirMeta {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, "norn.json"))
		if err != nil {
			t.Fatal(err)
		}
		var m dataDirMeta
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	first, err := openDataDirMeta(dir, 8, false)
	if err != nil || len(first) != 16 {
		t.Fatalf("a new data dir: incarnation %q, %v", first, err)
	}
	if m := read(); m.Incarnation != first || m.Partitions != 8 {
		t.Fatalf("norn.json %+v, want incarnation %s and 8 partitions", m, first)
	}
	if again, err := openDataDirMeta(dir, 8, true); err != nil || again != first {
		t.Fatalf("reopened: incarnation %q (%v), want %s kept", again, err, first)
	}
	if _, err := openDataDirMeta(dir, 16, true); err == nil || !strings.Contains(err.Error(), "created with 8 partitions") {
		t.Fatalf("reopened with another P: %v", err)
	}

	// A norn.json from before incarnations: trusted, given one, kept.
	if err := os.WriteFile(filepath.Join(dir, "norn.json"), []byte(`{"partitions":8}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	upgraded, err := openDataDirMeta(dir, 8, true)
	if err != nil || upgraded == "" || upgraded == first {
		t.Fatalf("an old norn.json: incarnation %q (%v), want a new one", upgraded, err)
	}
	if again, err := openDataDirMeta(dir, 8, true); err != nil || again != upgraded || read().Incarnation != upgraded {
		t.Fatalf("reopened after the upgrade: %q (%v), want %s", again, err, upgraded)
	}

	// The store is gone (DataDir/db deleted, norn.json kept): its Raft
	// state went with it, so the data dir is another incarnation.
	lost, err := openDataDirMeta(dir, 8, false)
	if err != nil || lost == upgraded || read().Incarnation != lost {
		t.Fatalf("store lost: incarnation %q (%v), want a new one written", lost, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "norn.json.tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a temporary file is left: %v", err)
	}
}

// TestWipedDataDirRefused is issue 41's item 7: a member's data dir is
// wiped and it is started again under its id. It must not take part
// (its Raft replicas would vote again in terms they voted in, and count
// toward majorities without the entries they acknowledged): New refuses
// it, naming the fix, and the cluster keeps serving; started with no
// seed, it learns the ring later and stops (Failed) without its meta
// replica having taken a single request. The fix works: removed, then
// started with an empty data dir under its id, it joins as a new member
// (a new incarnation in the ring) and takes replicas. A node that lost
// only its ring.json (it crashed before keeping the ring it was added
// in) restarts as before.
func TestWipedDataDirRefused(t *testing.T) {
	ms := testClusterWith(t, 4, rebalanceTune)
	ctx := context.Background()
	r := metaLeader(t, ms).node.host.Meta().Ring()
	for _, m := range ms {
		if nd, _ := r.Node(m.cfg.NodeID); nd.Incarnation == "" || nd.Incarnation != m.node.incarnation {
			t.Fatalf("the ring records %s with incarnation %q, its data dir has %q", m.cfg.NodeID, nd.Incarnation, m.node.incarnation)
		}
	}
	ids := enqueueN(t, ms, 20)

	// n2 loses only its ring.json: it learns the ring from the others at
	// start, finds its own incarnation there, and takes part.
	cfg2 := ms[1].cfg
	cfg2.RaftAddr, cfg2.GossipAddr = ms[1].node.RaftAddr(), ms[1].node.GossipAddr()
	ms[1].stop()
	if err := os.Remove(filepath.Join(cfg2.DataDir, "ring.json")); err != nil {
		t.Fatal(err)
	}
	ms[1] = startMember(t, cfg2)
	waitFor(t, 30*time.Second, "n2 ready again without its ring.json", ms[1].node.Ready)

	// n3's data dir is wiped; under its id it is refused at once.
	n3 := ms[2]
	oldInc := n3.node.incarnation
	cfg3 := n3.cfg
	cfg3.RaftAddr, cfg3.GossipAddr = n3.node.RaftAddr(), n3.node.GossipAddr()
	n3.stop()
	wipe := func() {
		t.Helper()
		if err := os.RemoveAll(cfg3.DataDir); err != nil {
			t.Fatal(err)
		}
	}
	wipe()
	n, err := New(cfg3)
	if err == nil {
		n.Close()
		t.Fatal("n3 started on a wiped data dir under its old id")
	}
	var re *cluster.ReplacedDataDirError
	if !errors.Is(err, cluster.ErrDataDirReplaced) || !errors.As(err, &re) || re.Known != oldInc {
		t.Fatalf("New on the wiped data dir: %v; want a refusal naming incarnation %s", err, oldInc)
	}
	for _, s := range []string{"node n3: its data dir is not the one the cluster knows as n3", "nornctl remove n3 --dead", "empty data dir", "new -node-id"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the refusal does not say %q: %v", s, err)
		}
	}

	// The others serve without it.
	live := []*member{ms[0], ms[1], ms[3]}
	resp, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "after"}, W: 2}))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a claim of the task enqueued without n3", func() bool {
		c, err := ms[3].api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "after", Worker: "w", Max: 1,
			Lease: durationpb.New(time.Minute)}))
		return err == nil && len(c.Msg.GetTasks()) == 1 && c.Msg.GetTasks()[0].GetTask().GetId() == resp.Msg.GetId()
	})

	// Started with no seed it knows nothing at first (New succeeds); the
	// others gossip with it again (they re-join ring nodes they see
	// down), it pulls the ring and stops. Its meta replica, which the
	// meta leader kept sending to, took nothing meanwhile.
	wipe()
	alone := cfg3
	alone.Join = nil
	n, err = New(alone)
	if err != nil {
		t.Fatalf("n3 with no seed: %v", err)
	}
	select {
	case err := <-n.Failed():
		if !errors.Is(err, cluster.ErrDataDirReplaced) {
			t.Errorf("Failed delivered %v, want the refusal", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("n3 with no seed never learned that the cluster knows its id with another data dir")
	}
	if st := n.host.Meta().Stats(); st["term"] != "0" || st["last_log_index"] != "0" {
		t.Errorf("the refused node's meta replica took requests: term %s, last log index %s", st["term"], st["last_log_index"])
	}
	if n.host.Ring() != nil || n.groupList() != nil {
		t.Error("the refused node adopted the ring or opened partition groups")
	}
	if err := n.Close(); err != nil {
		t.Error(err)
	}

	// The fix: remove n3 (its replicas are made again from the others),
	// then start it with an empty data dir under its id.
	admin := adminClient(ms[0])
	waitFor(t, 20*time.Second, "remove n3 accepted (gossip sees it gone)", func() bool {
		_, err := admin.Remove(ctx, connect.NewRequest(&nornv1.RemoveRequest{Node: "n3", Dead: true, Apply: true}))
		switch connect.CodeOf(err) {
		case connect.CodeFailedPrecondition, connect.CodeUnavailable: // seen alive yet; an election
			t.Logf("remove n3: %v; again", err)
		default:
			if err != nil {
				t.Fatal(err)
			}
		}
		return err == nil
	})
	// Every member's ring: n3 pulls one of them at start, and one that
	// still lists n3 (dead) refuses it again (the error says to wait).
	waitFor(t, time.Minute, "n3 removed from every member's ring", func() bool {
		for _, m := range live {
			if _, ok := m.node.host.Ring().Node("n3"); ok {
				return false
			}
		}
		return true
	})
	checkAllReadable(t, ms[3], ids)
	wipe()
	ms[2] = startMember(t, cfg3)
	waitFor(t, 20*time.Second, "n3 has the ring", func() bool { return ms[2].node.host.Ring() != nil })
	waitFor(t, 20*time.Second, "every member to see n3 in gossip", func() bool {
		for _, m := range live {
			if !m.node.host.Alive()["n3"] {
				return false
			}
		}
		return true
	})
	joinAndRebalance(t, admin, "n3")
	r = waitMovesDone(t, metaLeader(t, ms), 2*time.Minute)
	nd, ok := r.Node("n3")
	if !ok || nd.Incarnation != ms[2].node.incarnation || nd.Incarnation == oldInc {
		t.Fatalf("n3 in the ring: %+v (present %v); want its new incarnation %s", nd, ok, ms[2].node.incarnation)
	}
	if r.Holds("n3") == 0 {
		t.Fatal("n3 holds nothing after the rebalance")
	}
	checkPlacement(t, ms, r)
	waitFor(t, 30*time.Second, "every node ready", func() bool {
		for _, m := range ms {
			if !m.node.Ready() {
				return false
			}
		}
		return true
	})
	checkAllReadable(t, ms[2], ids)
}
