package transport

import (
	"errors"
	"sync"

	"github.com/hashicorp/raft"
)

// ErrGroupClosed answers a heartbeat that reaches a group whose transport
// was closed.
var ErrGroupClosed = errors.New("transport: the Raft group's transport is closed")

// heartbeatGate runs a Raft group's heartbeat fast path until closed, and
// close waits for the calls under way. hashicorp/raft's NetworkTransport
// calls the handler from its connection goroutines (and Heartbeats from
// its framed calls), which neither Transport.Close nor Raft.Shutdown
// waits for: a heartbeat with a newer term that raced a shutdown wrote the
// term through a RaftStore whose Store the node had just closed, and Raft
// panics when it cannot save its term (seen in make test-stress). With
// the gate closed first, no heartbeat touches the group's stores after
// its transport's Close returns.
type heartbeatGate struct {
	mu     sync.RWMutex
	closed bool
}

// wrap returns cb behind the gate.
func (g *heartbeatGate) wrap(cb func(raft.RPC)) func(raft.RPC) {
	if cb == nil {
		return nil
	}
	return func(rpc raft.RPC) {
		g.mu.RLock()
		defer g.mu.RUnlock()
		if g.closed {
			rpc.Respond(nil, ErrGroupClosed)
			return
		}
		cb(rpc)
	}
}

// close shuts the gate once the heartbeats under way have returned.
func (g *heartbeatGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// GatedTransport is a NetworkTransport whose Close also waits for the
// heartbeats under way and refuses later ones (heartbeatGate). Use it for
// every Raft group whose stores close with the node.
type GatedTransport struct {
	*raft.NetworkTransport
	gate heartbeatGate
}

// Gate returns t behind a heartbeat gate.
func Gate(t *raft.NetworkTransport) *GatedTransport { return &GatedTransport{NetworkTransport: t} }

// SetHeartbeatHandler registers Raft's heartbeat fast path behind the gate.
func (t *GatedTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	t.NetworkTransport.SetHeartbeatHandler(t.gate.wrap(cb))
}

// Close waits for the heartbeats under way, refuses later ones, and
// closes the NetworkTransport.
func (t *GatedTransport) Close() error {
	t.gate.close()
	return t.NetworkTransport.Close()
}
