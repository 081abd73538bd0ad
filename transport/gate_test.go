package transport

import (
	"errors"
	"runtime"
	"testing"

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
