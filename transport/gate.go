package transport

import (
	"errors"
	"sync"
	"sync/atomic"

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

// ErrHeld answers every Raft request a HeldTransport receives before it
// is released.
var ErrHeld = errors.New("transport: this Raft replica takes no requests until its node has checked the ring")

// HeldTransport is a GatedTransport that answers every request it
// receives (appends, heartbeats, votes, pre-votes, snapshots, leadership
// transfers) with ErrHeld until Release: its Raft replica stores nothing,
// grants no vote and acknowledges no entry meanwhile. Requests it sends
// are not held. The meta group's replica runs behind one until its node
// has checked that the ring does not list it with another data dir
// (replicas.Host): a replica with an empty store grants any vote, as
// hashicorp/raft's requestVote checks the candidate against the
// configuration only when it has one.
type HeldTransport struct {
	*GatedTransport
	released atomic.Bool
	consumer chan raft.RPC
	closed   chan struct{}
	once     sync.Once
}

// Hold returns t behind a heartbeat gate (GatedTransport), held. Raft
// must read Consumer and set its heartbeat handler through it.
func Hold(t *raft.NetworkTransport) *HeldTransport {
	h := &HeldTransport{GatedTransport: Gate(t), consumer: make(chan raft.RPC), closed: make(chan struct{})}
	go h.forward(t.Consumer())
	return h
}

// forward passes the NetworkTransport's requests on to Raft once
// released, and answers them ErrHeld before; it returns on Close.
func (t *HeldTransport) forward(in <-chan raft.RPC) {
	for {
		select {
		case rpc := <-in:
			if !t.released.Load() {
				rpc.Respond(nil, ErrHeld)
				continue
			}
			select {
			case t.consumer <- rpc:
			case <-t.closed:
				return
			}
		case <-t.closed:
			return
		}
	}
}

// Release lets requests through to Raft from now on (idempotent).
func (t *HeldTransport) Release() { t.released.Store(true) }

// Released reports whether Release was called.
func (t *HeldTransport) Released() bool { return t.released.Load() }

// Consumer is where Raft reads the requests let through.
func (t *HeldTransport) Consumer() <-chan raft.RPC { return t.consumer }

// SetHeartbeatHandler registers Raft's heartbeat fast path behind the
// hold and the gate.
func (t *HeldTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	if cb == nil {
		t.GatedTransport.SetHeartbeatHandler(nil)
		return
	}
	t.GatedTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		if !t.released.Load() {
			rpc.Respond(nil, ErrHeld)
			return
		}
		cb(rpc)
	})
}

// Close stops passing requests on, then closes the GatedTransport.
func (t *HeldTransport) Close() error {
	t.once.Do(func() { close(t.closed) })
	return t.GatedTransport.Close()
}
