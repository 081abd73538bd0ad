//lint:file-ignore SA1019 hashicorp/raft still fills and reads the legacy Leader and Candidate fields (a heartbeat is told by its Leader); a transport must carry them.

package transport

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// countFSM counts the entries it applied.
type countFSM struct{ n atomic.Int64 }

func (f *countFSM) Apply(*raft.Log) any                 { return f.n.Add(1) }
func (f *countFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, fmt.Errorf("no snapshots") }
func (f *countFSM) Restore(io.ReadCloser) error         { return nil }

// framedCluster is n Raft nodes of one group whose transports are
// GroupTransports over Heartbeats wired to each other in process (the
// framed calls skip the network; the NetworkTransports are real TCP, on
// loopback, for what does not travel framed).
type framedCluster struct {
	rafts []*raft.Raft
	fsms  []*countFSM
	hbs   []*Heartbeats
	calls map[RPCMethod]*atomic.Int64
	down  []atomic.Bool // a node that answers no framed call
}

func newFramedCluster(t *testing.T, n int, linger time.Duration) *framedCluster {
	t.Helper()
	c := &framedCluster{calls: map[RPCMethod]*atomic.Int64{MethodRaft: {}, MethodRaftHeartbeats: {}}, down: make([]atomic.Bool, n)}
	addrs := map[string]int{}
	nts := make([]*raft.NetworkTransport, n)
	for i := range n {
		nt, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		nts[i] = nt
		addrs[string(nt.LocalAddr())] = i
	}
	for range n {
		c.hbs = append(c.hbs, NewHeartbeats(HeartbeatsConfig{Linger: linger, Call: func(ctx context.Context, addr string, m RPCMethod, body []byte) ([]byte, error) {
			i := addrs[addr]
			if c.down[i].Load() {
				return nil, ErrRPCUnsupported
			}
			c.calls[m].Add(1)
			if m == MethodRaft {
				return c.hbs[i].ServeRaft(ctx, body)
			}
			return c.hbs[i].Serve(ctx, body)
		}}))
	}
	var servers []raft.Server
	for i, nt := range nts {
		servers = append(servers, raft.Server{ID: raft.ServerID(fmt.Sprint("n", i)), Address: nt.LocalAddr()})
	}
	for i, nt := range nts {
		cfg := raft.DefaultConfig()
		cfg.LocalID = servers[i].ID
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 300*time.Millisecond, 300*time.Millisecond, 150*time.Millisecond
		cfg.CommitTimeout = 20 * time.Millisecond
		cfg.LogOutput = io.Discard
		trans := c.hbs[i].Wrap(7, nt)
		logs, snaps := raft.NewInmemStore(), raft.NewInmemSnapshotStore()
		if err := raft.BootstrapCluster(cfg, logs, logs, snaps, trans, raft.Configuration{Servers: servers}); err != nil {
			t.Fatal(err)
		}
		fsm := &countFSM{}
		r, err := raft.NewRaft(cfg, fsm, logs, logs, snaps, trans)
		if err != nil {
			t.Fatal(err)
		}
		c.rafts = append(c.rafts, r)
		c.fsms = append(c.fsms, fsm)
		t.Cleanup(func() {
			r.Shutdown().Error()
			trans.Close()
		})
	}
	return c
}

func (c *framedCluster) leader(t *testing.T) *raft.Raft {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range c.rafts {
			if r.State() == raft.Leader {
				return r
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader")
	return nil
}

// A Raft group elects a leader, replicates, keeps its leader through
// heartbeats and hands leadership over, with its votes, appends and
// leadership transfer as framed calls and its heartbeats coalesced.
func TestRaftOverFramedCalls(t *testing.T) {
	c := newFramedCluster(t, 3, 5*time.Millisecond)
	l := c.leader(t)
	for i := range 50 {
		if err := l.Apply(fmt.Appendf(nil, "e%d", i), 5*time.Second).Error(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every replica to apply 50 entries", func() bool {
		for _, f := range c.fsms {
			if f.n.Load() < 50 {
				return false
			}
		}
		return true
	})
	// Idle for several heartbeat intervals: the leader keeps its place.
	term := l.CurrentTerm()
	time.Sleep(time.Second)
	if l.State() != raft.Leader || l.CurrentTerm() != term {
		t.Fatalf("the leader lost its place while idle: %v, term %d -> %d", l.State(), term, l.CurrentTerm())
	}
	if c.calls[MethodRaftHeartbeats].Load() == 0 || c.calls[MethodRaft].Load() == 0 {
		t.Fatalf("framed calls: %d heartbeat calls, %d Raft calls", c.calls[MethodRaftHeartbeats].Load(), c.calls[MethodRaft].Load())
	}
	if err := l.LeadershipTransfer().Error(); err != nil {
		t.Fatal(err)
	}
	l2 := c.leader(t)
	if l2 == l {
		t.Fatal("the leadership transfer left the leader in place")
	}
	if err := l2.Apply([]byte("after"), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
}

// With framed calls refused (a peer of an older version), Raft runs
// through the NetworkTransport.
func TestRaftFallsBackToNetworkTransport(t *testing.T) {
	c := newFramedCluster(t, 3, 5*time.Millisecond)
	for i := range c.down {
		c.down[i].Store(true)
	}
	l := c.leader(t)
	if err := l.Apply([]byte("x"), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if n := c.calls[MethodRaft].Load() + c.calls[MethodRaftHeartbeats].Load(); n != 0 {
		t.Fatalf("%d framed calls answered", n)
	}
}

// Heartbeats to one peer within the linger travel in one call, and each
// gets its own group's answer; one for a group the peer does not have
// fails alone.
func TestHeartbeatsCoalesce(t *testing.T) {
	var calls atomic.Int64
	var recv *Heartbeats
	send := NewHeartbeats(HeartbeatsConfig{Linger: 50 * time.Millisecond, Call: func(ctx context.Context, addr string, m RPCMethod, body []byte) ([]byte, error) {
		calls.Add(1)
		return recv.Serve(ctx, body)
	}})
	recv = NewHeartbeats(HeartbeatsConfig{Call: func(context.Context, string, RPCMethod, []byte) ([]byte, error) {
		return nil, ErrRPCUnsupported
	}})
	for g := range uint32(20) {
		gt := recv.Wrap(g, nil)
		gt.handler = func(rpc raft.RPC) {
			req := rpc.Command.(*raft.AppendEntriesRequest)
			rpc.Respond(&raft.AppendEntriesResponse{RPCHeader: raft.RPCHeader{ID: []byte("f")}, Term: req.Term + uint64(g), Success: true}, nil)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 21)
	resps := make([]raft.AppendEntriesResponse, 21)
	for g := range uint32(21) {
		wg.Go(func() {
			req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("l"), Addr: []byte("a")}, Term: 100}
			errs[g] = send.send("peer", g, req, &resps[g])
		})
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("21 heartbeats took %d calls", n)
	}
	for g := range 20 {
		if errs[g] != nil || resps[g].Term != 100+uint64(g) || !resps[g].Success || string(resps[g].ID) != "f" {
			t.Fatalf("heartbeat of group %d: %+v, %v", g, resps[g], errs[g])
		}
	}
	if errs[20] == nil {
		t.Fatal("a heartbeat for a group the peer does not have succeeded")
	}
}

// The codecs give back what they were given.
func TestRaftCodecsRoundTrip(t *testing.T) {
	h := raft.RPCHeader{ProtocolVersion: 3, ID: []byte("n1"), Addr: []byte("127.0.0.1:7401")}
	app := &raft.AppendEntriesRequest{RPCHeader: h, Term: 9, Leader: []byte("x"), PrevLogEntry: 4, PrevLogTerm: 8, LeaderCommitIndex: 3,
		Entries: []*raft.Log{{Index: 5, Term: 9, Type: raft.LogCommand, Data: []byte("d"), Extensions: []byte("e"), AppendedAt: time.Unix(0, 12345)},
			{Index: 6, Term: 9, Type: raft.LogNoop}}}
	r := &frameReader{b: encodeAppend(app)}
	if got := decodeAppend(r); r.err != nil || len(r.b) != 0 || !reflect.DeepEqual(got, app) {
		t.Fatalf("append: %+v, %v", got, r.err)
	}
	vote := &raft.RequestVoteRequest{RPCHeader: h, Term: 2, Candidate: []byte("c"), LastLogIndex: 7, LastLogTerm: 1, LeadershipTransfer: true}
	r = &frameReader{b: encodeVote(vote)}
	if got := decodeVote(r); r.err != nil || !reflect.DeepEqual(got, vote) {
		t.Fatalf("vote: %+v, %v", got, r.err)
	}
	pre := &raft.RequestPreVoteRequest{RPCHeader: h, Term: 2, LastLogIndex: 7, LastLogTerm: 1}
	r = &frameReader{b: encodePreVote(pre)}
	if got := decodePreVote(r); r.err != nil || !reflect.DeepEqual(got, pre) {
		t.Fatalf("pre-vote: %+v, %v", got, r.err)
	}
	ar := &raft.AppendEntriesResponse{RPCHeader: h, Term: 3, LastLog: 44, Success: true, NoRetryBackoff: true}
	var ar2 raft.AppendEntriesResponse
	decodeAppendResp(&frameReader{b: encodeAppendResp(ar)}, &ar2)
	if !reflect.DeepEqual(&ar2, ar) {
		t.Fatalf("append answer: %+v", ar2)
	}
	vr := &raft.RequestVoteResponse{RPCHeader: h, Term: 3, Peers: []byte("p"), Granted: true}
	var vr2 raft.RequestVoteResponse
	decodeVoteResp(&frameReader{b: encodeVoteResp(vr)}, &vr2)
	if !reflect.DeepEqual(&vr2, vr) {
		t.Fatalf("vote answer: %+v", vr2)
	}
	// A truncated frame is an error, not a panic.
	b := encodeAppend(app)
	for i := range len(b) {
		r := &frameReader{b: b[:i]}
		decodeAppend(r)
		if r.err == nil {
			t.Fatalf("an append cut at %d of %d bytes decoded", i, len(b))
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// FuzzRaftFrames: no body of a MethodRaft or MethodRaftHeartbeats call,
// nor of an answer, crashes the decoders; what decodes as a heartbeat
// call is heartbeats.
func FuzzRaftFrames(f *testing.F) {
	hb := &hbCall{group: 3, req: &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("n1"), Addr: []byte("a")}, Term: 4, Leader: []byte("a")}}
	f.Add(encodeHeartbeats([]*hbCall{hb}))
	f.Add(encodeAppend(&raft.AppendEntriesRequest{Term: 2, Entries: []*raft.Log{{Index: 1, Data: []byte("x")}}}))
	f.Add(encodeVote(&raft.RequestVoteRequest{Term: 1}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if items, err := decodeHeartbeats(b); err == nil {
			for _, it := range items {
				if len(it.req.Entries) > 0 || it.req.Term == 0 {
					t.Fatalf("decoded more than a heartbeat or an empty append: %+v", it.req)
				}
			}
		}
		decodeAppend(&frameReader{b: b})
		decodeVote(&frameReader{b: b})
		decodePreVote(&frameReader{b: b})
		var ar raft.AppendEntriesResponse
		decodeAppendResp(&frameReader{b: b}, &ar)
		decodeHeartbeatAnswers(b, []*hbCall{{resp: &raft.AppendEntriesResponse{}}, {resp: &raft.AppendEntriesResponse{}}})
		h := NewHeartbeats(HeartbeatsConfig{Call: func(context.Context, string, RPCMethod, []byte) ([]byte, error) { return nil, ErrRPCUnsupported }})
		h.Serve(context.Background(), b)     //nolint:errcheck // must not crash
		h.ServeRaft(context.Background(), b) //nolint:errcheck // must not crash
	})
}
