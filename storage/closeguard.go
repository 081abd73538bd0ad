package storage

import (
	"errors"
	"sync"
)

// ErrClosed is returned (wrapped) by a RaftStore method called after its
// Store was closed.
var ErrClosed = errors.New("storage: store closed")

// closeGuard lets calls into Pebble answer ErrClosed after Close instead of
// hitting Pebble's panic on a closed DB. Calls hold it shared for their
// length; Close takes it exclusively, so it waits for calls under way and
// every later call sees closed.
//
// It exists for callers whose lifetime the node cannot bound: hashicorp/raft
// starts goroutines (emitLogStoreMetrics reads FirstIndex and LastIndex) that
// Raft.Shutdown does not wait for. A nil *closeGuard guards nothing.
type closeGuard struct {
	mu     sync.RWMutex
	closed bool
}

// enter returns ErrClosed if the store is closed; otherwise the caller must
// call exit when it is done with Pebble.
func (g *closeGuard) enter() error {
	if g == nil {
		return nil
	}
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

func (g *closeGuard) exit() {
	if g != nil {
		g.mu.RUnlock()
	}
}

// close marks the store closed once calls under way have exited, then runs
// f (the DB's Close) while no call can enter.
func (g *closeGuard) close(f func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrClosed
	}
	g.closed = true
	return f()
}
