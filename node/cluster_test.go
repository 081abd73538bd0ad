package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/transport"
)

func TestClusterForms(t *testing.T) {
	ms := testCluster(t, 3)
	id := ms[0].node.ClusterID()
	if id == "" {
		t.Fatal("no cluster id")
	}
	for _, m := range ms {
		r := m.node.host.Ring()
		if r.ClusterID != id || len(r.Nodes) != 3 || r.Replication != 3 {
			t.Fatalf("%s has ring %+v", m.cfg.NodeID, r)
		}
		// The ring is kept in the data dir for restarts.
		kept, err := cluster.LoadRing(m.cfg.DataDir)
		if err != nil || kept == nil || kept.Epoch != r.Epoch || kept.ClusterID != id {
			t.Fatalf("%s kept ring %+v, %v", m.cfg.NodeID, kept, err)
		}
		// Every node replicates every partition (N=3 on 3 nodes), and
		// the groups agree on one leader each.
		for p, g := range m.node.groupList() {
			if g == nil {
				t.Fatalf("%s does not replicate partition %d", m.cfg.NodeID, p)
			}
			if got, want := g.Leader(), ms[0].node.group(uint16(p)).Leader(); got != want {
				t.Fatalf("partition %d: %s sees leader %q, n1 sees %q", p, m.cfg.NodeID, got, want)
			}
		}
	}
}

// offsetClock is the system clock shifted by a fixed offset.
type offsetClock time.Duration

func (c offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c)) }

// TestClusterStatusNodes: Status lists every node with its liveness and
// its clock offset as measured by gossip probes; a stopped node turns
// left (Close says goodbye) or dead, and its offset unknown.
func TestClusterStatusNodes(t *testing.T) {
	const skew = 1500 * time.Millisecond
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		if i == 2 {
			cfg.Clock = offsetClock(skew)
		}
	})
	byID := func() map[string]*nornv1.NodeStatus {
		out := map[string]*nornv1.NodeStatus{}
		for _, st := range ms[0].node.server.NodeStatuses() {
			out[st.Id] = st
		}
		return out
	}
	near := func(st *nornv1.NodeStatus, want time.Duration) bool {
		if st == nil || st.ClockOffset == nil {
			return false
		}
		d := st.ClockOffset.AsDuration() - want
		return d > -200*time.Millisecond && d < 200*time.Millisecond
	}
	waitFor(t, 20*time.Second, "n1 to measure every clock offset", func() bool {
		s := byID()
		for _, m := range ms {
			if st := s[m.cfg.NodeID]; st == nil || st.State != "alive" || st.ApiAddress != m.cfg.APIAddr {
				return false
			}
		}
		return near(s["n1"], 0) && near(s["n2"], 0) && near(s["n3"], skew)
	})
	ms[2].stop()
	var last *nornv1.NodeStatus
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("n1 saw n3 last as %v", last)
		}
	})
	waitFor(t, 30*time.Second, "n1 to see n3 gone", func() bool {
		st := byID()["n3"]
		last = st
		// Left, or dead when its goodbye did not get out in time (Leave
		// waits a second for the broadcast; a loaded machine can miss it).
		return st != nil && (st.State == "left" || st.State == "dead") && st.ClockOffset == nil
	})
	if st := byID()["n2"]; st.State != "alive" {
		t.Fatalf("n2 is %s", st.State)
	}
}

func TestClusterQuorumWrites(t *testing.T) {
	ms := testCluster(t, 3)
	ctx := context.Background()
	for w := uint32(1); w <= 3; w++ {
		coord := ms[int(w)%3]
		resp, err := coord.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
			Task: &nornv1.TaskSpec{Queue: "q", Payload: []byte(fmt.Sprint(w))}, W: w}))
		if err != nil {
			t.Fatalf("w=%d: %v", w, err)
		}
		if resp.Msg.Acks < w {
			t.Fatalf("w=%d: %d acks", w, resp.Msg.Acks)
		}
		id := resp.Msg.Id
		// Every replica stores it (the coordinator sends to all N and
		// answers after w; the rest follow).
		for _, m := range ms {
			waitFor(t, 5*time.Second, fmt.Sprintf("task %d on %s", id, m.cfg.NodeID), func() bool {
				_, err := m.node.store.TaskState(m.node.partition(id), id)
				return err == nil
			})
		}
	}
	_, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
		Task: &nornv1.TaskSpec{Queue: "q"}, W: 4}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("w=4: %v", err)
	}
}

// With two of three nodes down, a write with w=1 succeeds at the third and
// w=2 fails with UNAVAILABLE carrying the id to retry with.
func TestClusterQuorumNotReached(t *testing.T) {
	ms := testCluster(t, 3)
	ms[1].stop()
	ms[2].stop()
	ctx := context.Background()
	resp, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
		Task: &nornv1.TaskSpec{Queue: "q"}, W: 1}))
	if err != nil || resp.Msg.Acks != 1 {
		t.Fatalf("w=1: %v", err)
	}
	_, err = ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
		Task: &nornv1.TaskSpec{Queue: "q"}, W: 2}))
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable {
		t.Fatalf("w=2 with one node: %v", err)
	}
	wf, ok := coord.WriteFailure(ce)
	if !ok || len(wf.Ids) != 1 || wf.Ids[0] == 0 || wf.W != 2 || wf.Acks != 1 {
		t.Fatalf("write failure detail %+v", wf)
	}
	// n1 replicates every partition: lists and counts ask no peer, so
	// they answer with the others down.
	list, err := ms[0].api.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{}))
	if err != nil || !slices.ContainsFunc(list.Msg.Tasks, func(t *nornv1.Task) bool { return t.Id == resp.Msg.Id }) {
		t.Fatalf("list with the others down: %v, %v", list, err)
	}
	if cnt, err := ms[0].api.CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{})); err != nil || cnt.Msg.Total == 0 {
		t.Fatalf("count with the others down: %v, %v", cnt, err)
	}
}

// A claim long-polling at a node that does not lead the task's partition
// wakes when the task becomes ready on the leader: a yield there (applied
// by the claim FSM on every replica) and a delayed task's time coming.
// The safety-net recheck is off, so only wake-ups can end the waits early.
func TestClusterLongPollWakesAcrossNodes(t *testing.T) {
	ms := testClusterWith(t, 3, func(_ int, cfg *Config) { cfg.ClaimRecheck = time.Hour })
	ctx := context.Background()
	enqueue := func(spec *nornv1.TaskSpec) uint64 {
		resp, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: spec, W: 3}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Id
	}
	// roles returns the member leading id's partition and one that does not.
	roles := func(id uint64) (leader, other *member) {
		leader, others := partitionRoles(t, ms, ms[0].node.partition(id))
		return leader, others[len(others)-1]
	}
	const longWait = 30 * time.Second
	waitingClaim := func(m *member, queue string) <-chan []*nornv1.ClaimedTask {
		return startWaitingClaim(t, m, queue, longWait)
	}
	woken := func(got <-chan []*nornv1.ClaimedTask, id uint64) {
		t.Helper()
		wantWoken(t, got, id, longWait)
	}

	id := enqueue(&nornv1.TaskSpec{Queue: "yielded"})
	leader, other := roles(id)
	c, err := leader.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{
		Queue: "yielded", Worker: "first", Max: 1, Lease: durationpb.New(time.Minute)}))
	if err != nil || len(c.Msg.Tasks) != 1 {
		t.Fatalf("first claim: %v %v", c, err)
	}
	got := waitingClaim(other, "yielded")
	// Yield through any node (it is forwarded to the leader), retried on
	// UNAVAILABLE like the client does: on a loaded machine leadership
	// can move in between.
	waitFor(t, 10*time.Second, "the yield", func() bool {
		_, err := ms[0].api.Yield(ctx, connect.NewRequest(&nornv1.YieldRequest{Id: id, ClaimId: c.Msg.Tasks[0].ClaimId}))
		if err != nil && connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatal(err)
		}
		return err == nil
	})
	woken(got, id)

	// Due well after the claim waits (a claim that starts after its own
	// node promoted the task but before the leader did is found by the
	// recheck, not a wake-up).
	later := enqueue(&nornv1.TaskSpec{Queue: "delayed", NotBefore: timestamppb.New(time.Now().Add(3 * time.Second))})
	_, other = roles(later)
	woken(waitingClaim(other, "delayed"), later)
}

// startWaitingClaim starts a claim of one task of queue at m that waits
// up to wait, returns once the claim waits (or answered), and delivers
// what it got (nil after an error, which fails t).
func startWaitingClaim(t *testing.T, m *member, queue string, wait time.Duration) <-chan []*nornv1.ClaimedTask {
	t.Helper()
	got := make(chan []*nornv1.ClaimedTask, 1)
	go func() {
		resp, err := m.api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{
			Queue: queue, Worker: "waiter", Max: 1, Lease: durationpb.New(time.Minute), Wait: durationpb.New(wait)}))
		if err != nil {
			t.Error(err)
			got <- nil
			return
		}
		got <- resp.Msg.Tasks
	}()
	waitFor(t, 10*time.Second, "the claim to wait", func() bool {
		waiting := m.node.waiters.Waiting(queue)
		return waiting || len(got) > 0
	})
	return got
}

// wantWoken checks that a claim started with startWaitingClaim and wait
// got task id well before its wait ran out (a claim that is never woken
// gets it only at the end, by its last look).
func wantWoken(t *testing.T, got <-chan []*nornv1.ClaimedTask, id uint64, wait time.Duration) {
	t.Helper()
	select {
	case c := <-got:
		if len(c) != 1 || c[0].Task.Id != id {
			t.Fatalf("the waiting claim got %v, want task %d", c, id)
		}
	case <-time.After(wait / 2):
		t.Fatal("the waiting claim was not woken")
	}
}

// A claim long-polling while the task's partition has no leader (its
// leader just stopped) wakes when the survivors elect a new one, not when
// its wait runs out (the safety-net recheck is off).
func TestClusterLongPollWakesOnNewLeader(t *testing.T) {
	ms := testClusterWith(t, 3, func(_ int, cfg *Config) { cfg.ClaimRecheck = time.Hour })
	resp, err := ms[0].api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{
		Task: &nornv1.TaskSpec{Queue: "orphaned"}, W: 3}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.Id
	p := ms[0].node.partition(id)
	leader, survivors := partitionRoles(t, ms, p)
	leader.stop()
	// The survivors elect a leader a Raft timeout (300 ms) or more after
	// the last heartbeat: the claim looks first while there is none.
	const wait = 20 * time.Second
	got := startWaitingClaim(t, survivors[0], "orphaned", wait)
	wantWoken(t, got, id, wait)
}

// Claims go through each partition's leader whichever node is asked;
// completes and renews are forwarded to it; no task is claimed twice.
func TestClusterClaimRouting(t *testing.T) {
	ms := testCluster(t, 3)
	ctx := context.Background()
	const tasks = 40
	want := map[uint64]bool{}
	for i := range tasks {
		resp, err := ms[i%3].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
			Task: &nornv1.TaskSpec{Queue: "q", Payload: []byte(fmt.Sprint(i))}}))
		if err != nil {
			t.Fatal(err)
		}
		want[resp.Msg.Id] = true
	}
	got := map[uint64]uint64{}
	for round := 0; len(got) < tasks && round < 50; round++ {
		m := ms[round%3]
		resp, err := m.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{
			Queue: "q", Worker: "w", Max: 7, Lease: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatal(err)
		}
		for _, ct := range resp.Msg.Tasks {
			if _, dup := got[ct.Task.Id]; dup {
				t.Fatalf("task %d claimed twice", ct.Task.Id)
			}
			if !want[ct.Task.Id] {
				t.Fatalf("claimed unknown task %d", ct.Task.Id)
			}
			// The claim names the node that leads the task's partition.
			p := m.node.partition(ct.Task.Id)
			if l := ms[0].node.group(p).Leader(); ct.Leader == "" || string(l) != nodeIDAt(ms, ct.Leader) {
				t.Fatalf("task %d: claim names leader %q, partition %d is led by %s", ct.Task.Id, ct.Leader, p, l)
			}
			got[ct.Task.Id] = ct.ClaimId
		}
	}
	if len(got) != tasks {
		t.Fatalf("claimed %d of %d tasks", len(got), tasks)
	}
	// Renew and complete each through a node picked round robin: the
	// calls reach the leaders. A leadership may move meanwhile (the
	// leader balancer, an election on a loaded machine): UNAVAILABLE is
	// retried, as a worker does.
	i := 0
	for id, claim := range got {
		m := ms[i%3]
		i++
		var err error
		waitFor(t, 10*time.Second, "a renew through the partition's leader", func() bool {
			_, err = m.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: id, ClaimId: claim,
				Lease: durationpb.New(time.Minute)}))
			return connect.CodeOf(err) != connect.CodeUnavailable
		})
		if err != nil {
			t.Fatalf("renew %d via %s: %v", id, m.cfg.NodeID, err)
		}
		waitFor(t, 10*time.Second, "a complete through the partition's leader", func() bool {
			_, err = m.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: claim}))
			return connect.CodeOf(err) != connect.CodeUnavailable
		})
		if err != nil {
			t.Fatalf("complete %d via %s: %v", id, m.cfg.NodeID, err)
		}
	}
	for id := range got {
		resp, err := ms[1].api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id}))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Msg.Task.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED {
			t.Fatalf("task %d is %v", id, resp.Msg.Task.Status)
		}
	}
	// Nothing is left to claim anywhere.
	for _, m := range ms {
		resp, err := m.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "q", Worker: "w", Max: 10}))
		if err != nil || len(resp.Msg.Tasks) != 0 {
			t.Fatalf("claim after completing all via %s: %v %v", m.cfg.NodeID, resp, err)
		}
	}
}

// A replica that missed a write gets it from the next read that sees the
// difference (read repair).
func TestClusterReadRepair(t *testing.T) {
	ms := testCluster(t, 3)
	id := uint64(424242)
	task := &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: "q", CreatedAt: ms[0].node.hlc.Now()}}
	// Only n1's replica has the task.
	if err := ms[0].node.coord.MergeLocal([]*crdt.Task{task}); err != nil {
		t.Fatal(err)
	}
	p := ms[0].node.partition(id)
	if _, err := ms[2].node.store.TaskState(p, id); err == nil {
		t.Fatal("n3 has the task before any repair")
	}
	resp, err := ms[1].api.GetTask(context.Background(), connect.NewRequest(&nornv1.GetTaskRequest{Id: id, R: 3}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.Task.Id != id {
		t.Fatalf("read %v", resp.Msg.Task)
	}
	for _, m := range ms[1:] {
		waitFor(t, 5*time.Second, "read repair of "+m.cfg.NodeID, func() bool {
			_, err := m.node.store.TaskState(p, id)
			return err == nil
		})
	}
}

// A node's own abort (max_claims reached, a dependency failed) carries no
// claim; every replica takes it. Replicas once refused it ("claimId:
// required"), so it never left the aborting node and anti-entropy failed
// on its partition every round.
func TestClusterNodeAbortReplicates(t *testing.T) {
	ms := testCluster(t, 3)
	ctx := context.Background()
	resp, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q"}, W: 3}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.Id
	ev := crdt.Terminal{At: ms[0].node.hlc.Now(), Kind: crdt.Aborted, Errors: []crdt.TaskError{{Code: "max_claims_exceeded"}}}
	if _, err := ms[0].node.coord.Write(ctx, []*crdt.Task{{ID: id, Terminals: []crdt.Terminal{ev}}}, 3, []uint64{id}); err != nil {
		t.Fatalf("a node's abort did not reach every replica: %v", err)
	}
	for _, m := range ms {
		task, err := m.node.store.TaskState(m.node.partition(id), id)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := task.Terminal(); !ok || got.Kind != crdt.Aborted {
			t.Fatalf("%s holds %+v, want the abort", m.cfg.NodeID, task.Terminals)
		}
	}
}

// When a partition's leader stops, the others elect a new one and claims
// and writes go on.
func TestClusterLeaderFailover(t *testing.T) {
	ms := testCluster(t, 3)
	ctx := context.Background()
	// Stop the node that leads partition 0. (Node.Ready can hold while
	// the groups are still opening: wait for n1's group of partition 0.)
	var leader string
	waitFor(t, 10*time.Second, "n1's group of partition 0 to know its leader", func() bool {
		g := ms[0].node.group(0)
		if g == nil {
			return false
		}
		leader = string(g.Leader())
		return leader != ""
	})
	var survivors []*member
	for _, m := range ms {
		if m.cfg.NodeID == leader {
			m.stop()
		} else {
			survivors = append(survivors, m)
		}
	}
	waitFor(t, 10*time.Second, "new leaders", func() bool {
		for _, m := range survivors {
			for _, g := range m.node.groupList() {
				if g == nil {
					return false // not open yet (every node replicates every partition here)
				}
				if l := string(g.Leader()); l == "" || l == leader {
					return false
				}
			}
		}
		return true
	})
	var ids []uint64
	for i := range 10 {
		resp, err := survivors[i%2].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
			Task: &nornv1.TaskSpec{Queue: "f"}, W: 2}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Msg.Id)
	}
	// A partition can lose its new leader again (a survivor that stalls
	// past the leader lease steps down): long-poll until a deadline.
	claimed := 0
	deadline := time.Now().Add(10 * time.Second)
	for round := 0; claimed < len(ids) && time.Now().Before(deadline); round++ {
		resp, err := survivors[round%2].api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{
			Queue: "f", Worker: "w", Max: 10, Wait: durationpb.New(time.Second)}))
		if err != nil {
			t.Fatal(err)
		}
		claimed += len(resp.Msg.Tasks)
	}
	if claimed != len(ids) {
		t.Fatalf("claimed %d of %d after failover", claimed, len(ids))
	}
}

// PeerService refuses callers that are not members of the cluster, and bad
// input from members.
func TestPeerServiceRefusesStrangers(t *testing.T) {
	ms := testCluster(t, 3)
	ctx := context.Background()
	state := (&crdt.Task{ID: 7, Spec: &crdt.Spec{Queue: "q"}}).Encode()
	// No identity at all.
	_, err := ms[0].peer.Replicate(ctx, connect.NewRequest(&nornv1.ReplicateRequest{Tasks: [][]byte{state}}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("anonymous replicate: %v", err)
	}
	// Someone else's node id with another cluster id.
	req := connect.NewRequest(&nornv1.ReplicateRequest{Tasks: [][]byte{state}})
	req.Header().Set(transport.HeaderNode, "n2")
	req.Header().Set(transport.HeaderCluster, "0123")
	if _, err := ms[0].peer.Replicate(ctx, req); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("other cluster: %v", err)
	}
	// A member's identity but garbage: refused, nothing stored, node fine.
	req = transport.Request(ms[1].node.peers, &nornv1.ReplicateRequest{Tasks: [][]byte{{0xff, 0x01, 0x02}}})
	if _, err := ms[0].peer.Replicate(ctx, req); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("garbage state: %v", err)
	}
	if _, err := ms[0].node.store.TaskState(ms[0].node.partition(7), 7); err == nil {
		t.Fatal("a refused replicate stored a task")
	}
	req2 := transport.Request(ms[1].node.peers, &nornv1.ReadRequest{})
	if _, err := ms[0].peer.Read(ctx, req2); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("empty read: %v", err)
	}
}

// /metrics exports every group's Raft stats with its own labels (the
// library's global metrics would collide across groups).
func TestMetricsLabelledPerGroup(t *testing.T) {
	ms := testCluster(t, 3)
	resp, err := http.Get("http://" + ms[0].cfg.APIAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for p := range 8 {
		want := fmt.Sprintf(`norn_raft_term{group="partition",partition="%d"} `, p)
		if !strings.Contains(text, want) {
			t.Fatalf("no %s in\n%s", want, text)
		}
	}
	leaders := 0
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, `norn_raft_state{group="partition"`) && strings.HasSuffix(line, " 2") {
			leaders++
		}
	}
	led := 0
	for _, g := range ms[0].node.groupList() {
		if g.IsLeader() {
			led++
		}
	}
	if leaders != led {
		t.Fatalf("metrics show %d led partitions, the node leads %d", leaders, led)
	}
	for _, want := range []string{`norn_raft_term{group="meta"}`, "norn_ring_epoch 1", `norn_members{state="alive"} 3`} {
		if !strings.Contains(text, want) {
			t.Fatalf("no %s in\n%s", want, text)
		}
	}
}

// The framed Replicate on the Raft port checks its caller as PeerService
// does, and a member's write through it is stored.
func TestFramedReplicateRefusesStrangers(t *testing.T) {
	ms := testCluster(t, 3)
	ctx := context.Background()
	c := transport.NewRPCClient(ms[0].node.RaftAddr(), nil, nil)
	defer c.Close()
	body := func(tasks ...[]byte) []byte {
		b, err := proto.Marshal(&nornv1.ReplicateRequest{Tasks: tasks})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	state := (&crdt.Task{ID: 7, Spec: &crdt.Spec{Queue: "q"}}).Encode()
	if _, err := c.Call(ctx, transport.MethodReplicate, transport.RPCMeta{}, body(state)); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("anonymous replicate: %v", err)
	}
	if _, err := c.Call(ctx, transport.MethodReplicate, transport.RPCMeta{Node: "n2", Cluster: "0123"}, body(state)); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("other cluster: %v", err)
	}
	member := ms[1].node.peers.Meta()
	if _, err := c.Call(ctx, transport.MethodReplicate, member, body([]byte{0xff, 0x01, 0x02})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("garbage state: %v", err)
	}
	if _, err := c.Call(ctx, transport.MethodReplicate, member, []byte{0xff, 0xff}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("undecodable request: %v", err)
	}
	if _, err := ms[0].node.store.TaskState(ms[0].node.partition(7), 7); err == nil {
		t.Fatal("a refused replicate stored a task")
	}
	if _, err := c.Call(ctx, transport.MethodReplicate, member, body(state)); err != nil {
		t.Fatalf("a member's replicate: %v", err)
	}
	if _, err := ms[0].node.store.TaskState(ms[0].node.partition(7), 7); err != nil {
		t.Fatalf("a member's replicate was not stored: %v", err)
	}
}
