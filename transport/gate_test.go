package transport

import (
	"errors"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestHeartbeatGate: close waits for a heartbeat under way; after it, a
// heartbeat is answered ErrGroupClosed without reaching Raft.
func TestHeartbeatGate(t *testing.T) {
	var g heartbeatGate
	entered, release := make(chan struct{}), make(chan struct{})
	calls := 0
	h := g.wrap(func(rpc raft.RPC) {
		calls++
		close(entered)
		<-release
		rpc.Respond(nil, nil)
	})
	firstResp := make(chan raft.RPCResponse, 1)
	go h(raft.RPC{RespChan: firstResp})
	<-entered // the heartbeat is in Raft's handler

	closed := make(chan struct{})
	go func() { g.close(); close(closed) }()
	// Wait until close is waiting for the gate: a waiting writer makes
	// TryRLock fail.
	for g.mu.TryRLock() {
		g.mu.RUnlock()
		runtime.Gosched()
	}
	select {
	case <-closed:
		t.Fatal("close returned while a heartbeat was under way")
	default:
	}
	close(release)
	<-closed
	if r := <-firstResp; r.Error != nil {
		t.Fatalf("the heartbeat under way answered %v", r.Error)
	}

	lateResp := make(chan raft.RPCResponse, 1)
	h(raft.RPC{RespChan: lateResp})
	if r := <-lateResp; !errors.Is(r.Error, ErrGroupClosed) {
		t.Fatalf("a heartbeat after close answered %v, want ErrGroupClosed", r.Error)
	}
	if calls != 1 {
		t.Fatalf("Raft's handler ran %d times, want 1", calls)
	}
}

// TestHeldTransport: a held transport answers a vote request and a
// heartbeat ErrHeld without Raft seeing them; once released, both reach
// Raft (its consumer and its heartbeat handler).
func TestHeldTransport(t *testing.T) {
	nt, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	held := Hold(nt)
	defer held.Close()
	beats := 0
	held.SetHeartbeatHandler(func(rpc raft.RPC) {
		beats++
		rpc.Respond(&raft.AppendEntriesResponse{Term: 7}, nil)
	})
	sender, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	target := held.LocalAddr()
	vote := func() error {
		return sender.RequestVote("n9", target, &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte("n1")}, Term: 3},
			&raft.RequestVoteResponse{})
	}
	beat := func() error {
		return sender.AppendEntries("n9", target, &raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ID: []byte("n1"), Addr: []byte("127.0.0.1:1")}, Term: 3}, &raft.AppendEntriesResponse{})
	}
	for name, call := range map[string]func() error{"vote": vote, "heartbeat": beat} {
		if err := call(); err == nil || err.Error() != ErrHeld.Error() {
			t.Fatalf("a %s to a held transport: %v, want %v", name, err, ErrHeld)
		}
	}
	if held.Released() || beats != 0 {
		t.Fatalf("released %v, heartbeats handled %d, before Release", held.Released(), beats)
	}

	held.Release()
	got := make(chan raft.RPC, 1)
	go func() {
		rpc := <-held.Consumer()
		rpc.Respond(&raft.RequestVoteResponse{Term: 3, Granted: true}, nil)
		got <- rpc
	}()
	if err := vote(); err != nil {
		t.Fatalf("a vote after Release: %v", err)
	}
	if _, ok := (<-got).Command.(*raft.RequestVoteRequest); !ok {
		t.Fatal("Raft's consumer did not get the vote request")
	}
	if err := beat(); err != nil || beats != 1 {
		t.Fatalf("a heartbeat after Release: %v, handled %d", err, beats)
	}
}
