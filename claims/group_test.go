package claims

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
)

// testNode is one node's store and a group of partition 3 on it, on a real
// Pebble directory.
type testNode struct {
	dir   string
	store *storage.Store
	group *Group
	trans *raft.InmemTransport
}

// openStores opens a node's store and snapshot store in dir.
func openStores(t *testing.T, dir string) (*storage.Store, raft.SnapshotStore) {
	t.Helper()
	st, err := storage.Open(storage.Config{Dir: dir + "/db"})
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := raft.NewFileSnapshotStore(dir+"/snap", 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return st, snaps
}

func startTestNode(t *testing.T, dir string, snapshotThreshold uint64, tune ...func(*GroupConfig)) *testNode {
	t.Helper()
	st, snaps := openStores(t, dir)
	_, trans := raft.NewInmemTransport("n1")
	rs := st.RaftStore(3)
	cfg := GroupConfig{
		Partition: 3, LocalID: "n1", KV: st, Log: rs, Stable: rs, Snapshots: snaps, Transport: trans,
		Bootstrap:        true,
		HeartbeatTimeout: 50 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond,
		LeaderLeaseTimeout: 50 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
		SnapshotThreshold: snapshotThreshold,
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
		RaftLogger:        hclog.NewNullLogger(),
	}
	for _, f := range tune {
		f(&cfg)
	}
	g, err := StartGroup(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &testNode{dir: dir, store: st, group: g, trans: trans}
	deadline := time.Now().Add(5 * time.Second)
	for !g.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("single voter did not elect itself")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return n
}

func (n *testNode) stop(t *testing.T) {
	t.Helper()
	if err := n.group.Shutdown(); err != nil {
		t.Fatal(err)
	}
	n.trans.Close()
	if err := n.store.Close(); err != nil {
		t.Fatal(err)
	}
}

func (n *testNode) propose(t *testing.T, cmd Command) []Outcome {
	t.Helper()
	outs, err := n.group.Propose(&cmd, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return outs
}

func enqueue(t *testing.T, st *storage.Store, ids ...uint64) {
	t.Helper()
	for _, id := range ids {
		task := &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: "q"}}
		if _, err := st.MergeTask(3, task); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGroupClaimsSurviveRestart claims through a real single-voter Raft
// group on Pebble, restarts it, and checks the FSM state and the claimed
// index are intact and the replayed log was not applied twice.
func TestGroupClaimsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	n := startTestNode(t, dir, 8192)
	enqueue(t, n.store, 1, 2, 3)
	outs := n.propose(t, claimCmd(time.Now().UnixMilli(), 60_000, 1, 2))
	if outs[0].Err != nil || outs[1].Err != nil {
		t.Fatalf("claim: %+v", outs)
	}
	tok := outs[0].Claim.Token
	if o := n.propose(t, Command{Op: OpRenew, NowMs: time.Now().UnixMilli(), ID: 1, Token: tok, LeaseMs: 120_000}); o[0].Err != nil {
		t.Fatalf("renew: %+v", o)
	}
	if o := n.propose(t, Command{Op: OpYield, NowMs: time.Now().UnixMilli(), ID: 2, Token: outs[1].Claim.Token}); o[0].Err != nil {
		t.Fatalf("yield: %+v", o)
	}
	before, _ := n.store.ClaimFSMRecord(3, 1)
	n.stop(t)

	n = startTestNode(t, dir, 8192)
	defer n.stop(t)
	if err := n.group.Barrier(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	after, err := n.store.ClaimFSMRecord(3, 1)
	if err != nil || string(after) != string(before) {
		t.Fatalf("record of task 1 changed across restart (replayed twice?):\n%x\n%x", before, after)
	}
	head, _ := n.store.ReadyHead(3, "q", 10)
	if fmt.Sprint(head) != fmt.Sprint([]storage.ReadyEntry{{ID: 2}, {ID: 3}}) {
		t.Fatalf("ready after restart = %v, want 2 and 3", head)
	}
	// The old claim is still the live one: a second claim is refused, a
	// renew with its token works.
	if o := n.propose(t, claimCmd(time.Now().UnixMilli(), 1000, 1)); !errors.Is(o[0].Err, ErrAlreadyClaimed) {
		t.Fatalf("claim of a claimed task after restart: %+v", o)
	}
	if o := n.propose(t, Command{Op: OpRenew, NowMs: time.Now().UnixMilli(), ID: 1, Token: tok, LeaseMs: 1000}); o[0].Err != nil {
		t.Fatalf("renew after restart: %+v", o)
	}
}

// TestFSMSeededBug checks that the Raft FSM applies with its group's
// seeded bugs: with ClaimNoCheck a second claim of a claimed task is
// granted, without it refused.
func TestFSMSeededBug(t *testing.T) {
	for _, bug := range testhooks.BugCases() {
		st, err := storage.Open(storage.Config{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		f := &fsm{p: 3, kv: st, logger: slog.New(slog.NewTextHandler(io.Discard, nil)), bugs: Bugs{ClaimNoCheck: bug}}
		claim := claimCmd(1000, 100, 7)
		res := f.ApplyBatch([]*raft.Log{
			{Index: 1, Type: raft.LogCommand, Data: claim.Encode()},
			{Index: 2, Type: raft.LogCommand, Data: claim.Encode()},
		})
		st.Close()
		if got := res[1].(*Result).Outcomes[0].Err; (got == nil) != bug {
			t.Fatalf("ClaimNoCheck %v: second claim: %v", bug, got)
		}
	}
}

// TestFSMSkipsReplayedEntries feeds the FSM entries it has applied already
// (what Raft does after a restart with NoSnapshotRestoreOnStart): they must
// get no response and change nothing, even where re-applying would.
func TestFSMSkipsReplayedEntries(t *testing.T) {
	st, err := storage.Open(storage.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f := &fsm{p: 3, kv: st, logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	claim := claimCmd(1000, 100, 7)
	expire := Command{Op: OpExpire, NowMs: 5000, ID: 7, Token: 1}
	logs := []*raft.Log{
		{Index: 1, Type: raft.LogCommand, Data: claim.Encode()},
		{Index: 2, Type: raft.LogCommand, Data: expire.Encode()},
		{Index: 3, Type: raft.LogCommand, Data: claim.Encode()},
	}
	res := f.ApplyBatch(logs)
	if r := res[2].(*Result); r.Err != nil || r.Outcomes[0].Err != nil || r.Outcomes[0].Claim.Seq != 2 {
		t.Fatalf("first application: %+v", r)
	}
	before, _ := st.ClaimFSMRecord(3, 7)
	// Replaying entry 2 would expire the claim granted by entry 3.
	for i, r := range f.ApplyBatch(logs[1:]) {
		if r != nil {
			t.Fatalf("replayed entry %d got response %+v", i+2, r)
		}
	}
	if after, _ := st.ClaimFSMRecord(3, 7); string(after) != string(before) {
		t.Fatal("replay changed the record")
	}
	if a, _ := st.ClaimFSMApplied(3); a != 3 {
		t.Fatalf("applied = %d, want 3", a)
	}
}

// TestFSMStopsOnAnEntryItCannotApply: an entry the FSM cannot decode (or
// apply, or store) stops the replica's FSM for good rather than let it go
// on without what the entry did: the entries before it in the batch are
// stored, it and every later entry fail, the stored applied index stays
// before it, OnFatal is told once; a restarted FSM (a fresh one on the
// same store, as after a node restart) resumes from the stored index.
func TestFSMStopsOnAnEntryItCannotApply(t *testing.T) {
	st, err := storage.Open(storage.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var fatal []error
	f := &fsm{p: 3, kv: st, logger: slog.New(slog.NewTextHandler(io.Discard, nil)), onFatal: func(err error) { fatal = append(fatal, err) }}
	claim7, claim8 := claimCmd(1000, 100, 7), claimCmd(6000, 100, 8)
	res := f.ApplyBatch([]*raft.Log{
		{Index: 1, Type: raft.LogCommand, Data: claim7.Encode()},
		{Index: 2, Type: raft.LogCommand, Data: []byte{1, 99}},
		{Index: 3, Type: raft.LogCommand, Data: claim8.Encode()},
	})
	if r := res[0].(*Result); r.Err != nil || r.Outcomes[0].Err != nil {
		t.Fatalf("entry before the corrupt one: %+v", r)
	}
	for i := 1; i < 3; i++ {
		if r := res[i].(*Result); !errors.Is(r.Err, ErrCorrupt) {
			t.Fatalf("entry %d (the corrupt one or after it): %+v, want ErrCorrupt", i+1, r)
		}
	}
	if len(fatal) != 1 || !errors.Is(fatal[0], ErrCorrupt) {
		t.Fatalf("OnFatal calls: %v", fatal)
	}
	if a, _ := st.ClaimFSMApplied(3); a != 1 {
		t.Fatalf("applied = %d, want 1 (the entry before the corrupt one)", a)
	}
	if _, err := st.ClaimFSMRecord(3, 8); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the entry after the corrupt one was stored: %v", err)
	}
	// A stopped FSM applies nothing more, even a good entry.
	res = f.ApplyBatch([]*raft.Log{{Index: 4, Type: raft.LogCommand, Data: claim8.Encode()}})
	if r := res[0].(*Result); r.Err == nil {
		t.Fatalf("a stopped FSM applied entry 4: %+v", r)
	}
	if a, _ := st.ClaimFSMApplied(3); a != 1 {
		t.Fatalf("applied = %d after the stop, want 1", a)
	}
	// After a restart the log (repaired, say) replays from index 2.
	f = &fsm{p: 3, kv: st, logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	expire := Command{Op: OpExpire, NowMs: 5000, ID: 7, Token: 1}
	res = f.ApplyBatch([]*raft.Log{
		{Index: 1, Type: raft.LogCommand, Data: claim7.Encode()},
		{Index: 2, Type: raft.LogCommand, Data: expire.Encode()},
		{Index: 3, Type: raft.LogCommand, Data: claim8.Encode()},
	})
	if res[0] != nil || res[1].(*Result).Err != nil || res[2].(*Result).Err != nil {
		t.Fatalf("replay after the restart: %+v %+v %+v", res[0], res[1], res[2])
	}
	if a, _ := st.ClaimFSMApplied(3); a != 3 {
		t.Fatalf("applied = %d after the replay, want 3", a)
	}
}

// OnLeaderChange runs when the replica elects itself, and never after
// Shutdown returns.
func TestGroupOnLeaderChange(t *testing.T) {
	var calls atomic.Int32
	n := startTestNode(t, t.TempDir(), 0, func(cfg *GroupConfig) {
		cfg.OnLeaderChange = func() { calls.Add(1) }
	})
	deadline := time.Now().Add(5 * time.Second)
	for calls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no OnLeaderChange call after the replica elected itself")
		}
		time.Sleep(5 * time.Millisecond)
	}
	n.stop(t)
	before := calls.Load()
	time.Sleep(50 * time.Millisecond)
	if after := calls.Load(); after != before {
		t.Fatalf("%d OnLeaderChange calls after Shutdown", after-before)
	}
}

// flakyTransport is an in-memory transport whose outgoing calls can fail:
// with lose set, AppendEntries reaches the peer but its answer is lost
// (the peers store the entries, this leader hears nothing back); with cut
// set, AppendEntries and votes do not leave at all.
type flakyTransport struct {
	*raft.InmemTransport
	lose, cut atomic.Bool
}

var errLost = errors.New("flakyTransport: lost")

// AppendEntriesPipeline makes Raft replicate with AppendEntries.
func (t *flakyTransport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

func (t *flakyTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if t.cut.Load() {
		return errLost
	}
	err := t.InmemTransport.AppendEntries(id, target, args, resp)
	if t.lose.Load() {
		return errLost
	}
	return err
}

func (t *flakyTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if t.cut.Load() {
		return errLost
	}
	return t.InmemTransport.RequestVote(id, target, args, resp)
}

func (t *flakyTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if t.cut.Load() {
		return errLost
	}
	return t.InmemTransport.RequestPreVote(id, target, args, resp)
}

// startCohort starts partition 3's group on three nodes over flaky
// transports.
func startCohort(t *testing.T) ([]*testNode, []*flakyTransport) {
	t.Helper()
	ids := []raft.ServerID{"n1", "n2", "n3"}
	var servers []raft.Server
	trans := make([]*flakyTransport, len(ids))
	for i, id := range ids {
		_, tr := raft.NewInmemTransport(raft.ServerAddress(id))
		trans[i] = &flakyTransport{InmemTransport: tr}
		servers = append(servers, raft.Server{ID: id, Address: raft.ServerAddress(id)})
	}
	for i := range trans {
		for j := range trans {
			if i != j {
				trans[i].Connect(raft.ServerAddress(ids[j]), trans[j].InmemTransport)
			}
		}
	}
	ns := make([]*testNode, len(ids))
	for i, id := range ids {
		dir := t.TempDir()
		st, snaps := openStores(t, dir)
		rs := st.RaftStore(3)
		g, err := StartGroup(GroupConfig{
			Partition: 3, LocalID: id, KV: st, Log: rs, Stable: rs, Snapshots: snaps, Transport: trans[i],
			Bootstrap: i == 0, Servers: servers,
			HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
			LeaderLeaseTimeout: 150 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
			Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
			RaftLogger: hclog.NewNullLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		ns[i] = &testNode{dir: dir, store: st, group: g, trans: trans[i].InmemTransport}
		t.Cleanup(func() { ns[i].stop(t) })
	}
	return ns, trans
}

// settledLeader waits for a leader whose configuration every replica
// applied (so that the others can elect the next one) and returns it.
func settledLeader(t *testing.T, ns []*testNode) int {
	t.Helper()
	for {
		leader := -1
		waitUntil(t, "a leader", func() bool {
			for i, n := range ns {
				if n.group.IsLeader() && n.group.Barrier(time.Second) == nil {
					leader = i
					return true
				}
			}
			return false
		})
		idx := ns[leader].group.Raft().AppliedIndex()
		waitUntil(t, "the replicas to apply the leader's log", func() bool {
			for _, n := range ns {
				if n.group.Raft().AppliedIndex() < idx {
					return false
				}
			}
			return true
		})
		if ns[leader].group.IsLeader() {
			return leader
		}
	}
}

// proposeCut sets mode on the leader's transport and proposes a claim of
// task 7 there until the proposal reaches the leader's log (a loaded
// machine can depose the leader first); with heal, it clears mode once
// the leader stepped down. It returns the former leader and Propose's
// error.
func proposeCut(t *testing.T, ns []*testNode, trans []*flakyTransport, mode func(*flakyTransport) *atomic.Bool, heal bool) (int, error) {
	t.Helper()
	for {
		l := settledLeader(t, ns)
		mode(trans[l]).Store(true)
		done := proposeAsync(ns[l], claimCmd(time.Now().UnixMilli(), 60_000, 7))
		if heal {
			waitUntil(t, "the leader to step down", func() bool { return !ns[l].group.IsLeader() })
			mode(trans[l]).Store(false)
		}
		err := <-done
		if err == nil || !strings.Contains(err.Error(), raft.ErrNotLeader.Error()) { // not deposed meanwhile
			return l, err
		}
		mode(trans[l]).Store(false)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// proposeAsync proposes cmd at n and delivers the answer.
func proposeAsync(n *testNode, cmd Command) <-chan error {
	done := make(chan error, 1)
	go func() {
		outs, err := n.group.Propose(&cmd, 10*time.Second)
		if err == nil && (len(outs) != 1 || outs[0].Err != nil) {
			err = fmt.Errorf("outcomes %+v", outs)
		}
		done <- err
	}()
	return done
}

// claimedOn returns the live claim of task id in n's FSM, nil when none.
func claimedOn(t *testing.T, n *testNode, id uint64) *Claim {
	t.Helper()
	b, err := n.store.ClaimFSMRecord(3, id)
	if errors.Is(err, storage.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	r, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := r.Live()
	return c
}

// A leader deposed before it hears its followers' acks does not know
// whether its claim took effect; the followers have the entry and the
// next leader commits it. Propose learns that and returns the claim:
// before, it failed with ErrNotLeader while the FSM had granted the claim,
// and the task stayed claimed by no one until the lease ran out.
func TestProposeAfterLeadershipLossReturnsCommittedOutcome(t *testing.T) {
	ns, trans := startCohort(t)
	l, err := proposeCut(t, ns, trans, func(t *flakyTransport) *atomic.Bool { return &t.lose }, true)
	if err != nil {
		granted := func() bool { return claimedOn(t, ns[(l+1)%3], 7) != nil }
		time.Sleep(2 * time.Second)
		t.Fatalf("propose: %v (and the claim was granted: %v)", err, granted())
	}
	for _, n := range ns {
		waitUntil(t, "the claim on every replica", func() bool { return claimedOn(t, n, 7) != nil })
	}
}

// An entry that reached no follower is overwritten by the next leader:
// Propose at the deposed leader fails with ErrNotLeader as soon as its
// replica learns that (the next leader's first entry takes the index, and
// is no command), not with ErrOutcomeUnknown at its timeout.
func TestProposeAfterLeadershipLossReportsLostEntry(t *testing.T) {
	ns, trans := startCohort(t)
	_, err := proposeCut(t, ns, trans, func(t *flakyTransport) *atomic.Bool { return &t.cut }, false)
	if !errors.Is(err, ErrNotLeader) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("propose: %v, want ErrNotLeader (the claim did not take effect)", err)
	}
	for _, n := range ns {
		if c := claimedOn(t, n, 7); c != nil {
			t.Fatalf("claim %+v granted", c)
		}
	}
}

// TestGroupMayLead: while MayLead refuses, Propose fails with ErrNotLeader
// wrapping the reason and nothing is applied; once it allows, proposals
// go through again.
func TestGroupMayLead(t *testing.T) {
	var refuse atomic.Bool
	why := errors.New("clock out of bound")
	n := startTestNode(t, t.TempDir(), 8192, func(c *GroupConfig) {
		c.MayLead = func() error {
			if refuse.Load() {
				return why
			}
			return nil
		}
	})
	defer n.stop(t)
	enqueue(t, n.store, 1)
	refuse.Store(true)
	_, err := n.group.Propose(&Command{Op: OpClaim, NowMs: 1000, Worker: "w", LeaseMs: 1000, Candidates: []Candidate{{ID: 1}}}, time.Second)
	if !errors.Is(err, ErrNotLeader) || !errors.Is(err, why) {
		t.Fatalf("refused proposal: %v", err)
	}
	if rec, _ := n.store.ClaimFSMRecord(3, 1); rec != nil {
		t.Fatal("a refused claim was applied")
	}
	refuse.Store(false)
	outs := n.propose(t, Command{Op: OpClaim, NowMs: 1000, Worker: "w", LeaseMs: 1000, Candidates: []Candidate{{ID: 1}}})
	if len(outs) != 1 || outs[0].Err != nil {
		t.Fatalf("allowed claim: %+v", outs)
	}
}

// TestGroupTransferLeadershipTo: the leader hands its leadership to the
// voter named, which leads next.
func TestGroupTransferLeadershipTo(t *testing.T) {
	ns, _ := startCohort(t)
	l := settledLeader(t, ns)
	to := (l + 2) % len(ns)
	id := fmt.Sprintf("n%d", to+1)
	if err := ns[l].group.TransferLeadershipTo(id, id); err != nil {
		t.Fatalf("transfer from n%d to %s: %v", l+1, id, err)
	}
	waitUntil(t, id+" to lead", func() bool { return ns[to].group.IsLeader() })
	if ns[l].group.IsLeader() {
		t.Fatal("the old leader still leads")
	}
	// A follower cannot hand over what it does not hold.
	if err := ns[l].group.TransferLeadershipTo(id, id); err == nil {
		t.Fatal("a follower's transfer succeeded")
	}
}
