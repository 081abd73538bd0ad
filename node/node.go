package node

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/storage"
)

// Node is one nornd: the store, a Raft group per partition, the task API's
// logic and the monitor. On a single node every partition's group has this
// node as its only voter; the code paths are the cluster's.
type Node struct {
	cfg    Config
	lock   *dirLock
	store  *storage.Store
	hlc    *crdt.HLC
	ids    *idGen
	groups []*claims.Group
	trans  []*raft.InmemTransport
	start  time.Time

	waiters  queueWaiters
	inflight inflightSet // tasks being claimed now
	ender    *ender      // coalesced claim ends of finished tasks

	specConflicts atomic.Uint64 // merges that met two specs for one id
	draining      chan struct{} // closed by StopWaiting
	drainMu       sync.Once

	// monitorMu serializes monitor passes; extended[p] records that the
	// current leadership of p has extended the live claims.
	monitorMu sync.Mutex
	extended  []bool

	stop    chan struct{}
	stopped sync.WaitGroup
	closeMu sync.Mutex
	closed  bool
}

// New opens the node's data dir and starts its partition groups and
// monitor. A second node on the same data dir fails with ErrDataDirInUse.
func New(cfg Config) (*Node, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("node: data dir: %w", err)
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := checkDataDirMeta(cfg.DataDir, cfg.Partitions); err != nil {
		lock.release()
		return nil, err
	}
	store, err := storage.Open(storage.Config{Dir: filepath.Join(cfg.DataDir, "db"), Clock: cfg.Clock})
	if err != nil {
		lock.release()
		return nil, err
	}
	ids, err := newIDGen(cfg.MachineID)
	if err != nil {
		store.Close()
		lock.release()
		return nil, err
	}
	n := &Node{
		cfg:   cfg,
		lock:  lock,
		store: store,
		hlc:   crdt.NewHLC(cfg.Clock, uint32(cfg.MachineID)),
		ids:   ids,
		start: cfg.Clock.Now(),
		stop:  make(chan struct{}),

		draining: make(chan struct{}),
	}
	n.waiters.init()
	n.extended = make([]bool, cfg.Partitions)
	n.ender = newEnder(n)
	if err := n.startGroups(); err != nil {
		n.shutdownGroups()
		store.Close()
		lock.release()
		return nil, err
	}
	n.stopped.Add(2)
	go n.monitor()
	go func() {
		defer n.stopped.Done()
		n.ender.run(n.stop)
	}()
	return n, nil
}

func (n *Node) startGroups() error {
	rl := n.cfg.RaftLogger
	if rl == nil {
		rl = hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: os.Stderr})
	}
	for p := range n.cfg.Partitions {
		dir := filepath.Join(n.cfg.DataDir, "raft", fmt.Sprintf("p%04d", p))
		snaps, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
		if err != nil {
			return fmt.Errorf("node: snapshots of partition %d: %w", p, err)
		}
		// A single node's groups never send: an in-memory transport serves.
		// The cluster gives each group a network transport on the node's
		// Raft listener.
		_, trans := raft.NewInmemTransport(raft.ServerAddress(n.cfg.NodeID))
		rs := n.store.RaftStore(uint16(p))
		g, err := claims.StartGroup(claims.GroupConfig{
			Partition: uint16(p), LocalID: raft.ServerID(n.cfg.NodeID),
			KV: n.store, Log: rs, Stable: rs, Snapshots: snaps, Transport: trans,
			Bootstrap:        true,
			HeartbeatTimeout: n.cfg.RaftTimeout, ElectionTimeout: n.cfg.RaftTimeout,
			LeaderLeaseTimeout: n.cfg.RaftTimeout / 2,
			Logger:             n.cfg.Logger, RaftLogger: rl.Named(fmt.Sprintf("p%d", p)),
		})
		if err != nil {
			trans.Close()
			return err
		}
		n.groups = append(n.groups, g)
		n.trans = append(n.trans, trans)
	}
	return nil
}

// Ready reports whether this node leads every partition (on a single node:
// whether every group has elected itself).
func (n *Node) Ready() bool {
	for _, g := range n.groups {
		if !g.IsLeader() {
			return false
		}
	}
	return true
}

// WaitReady blocks until this node leads every partition (a single node
// elects itself within about one Raft timeout) or timeout passes.
func (n *Node) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, g := range n.groups {
		for !g.IsLeader() {
			if time.Now().After(deadline) {
				return errors.New("node: partitions have no leader yet")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// StopWaiting makes long-polling claims return now (empty) and new ones
// not wait, so that a server shutting down can drain its requests.
func (n *Node) StopWaiting() {
	n.drainMu.Do(func() { close(n.draining) })
}

// Close stops the monitor and the groups and closes the store, in that
// order. Requests in flight must have finished (the server stops first).
func (n *Node) Close() error {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	n.StopWaiting()
	close(n.stop)
	n.waiters.closeAll()
	n.stopped.Wait()
	errs := n.shutdownGroups()
	return errors.Join(errs, n.store.Close(), n.lock.release())
}

func (n *Node) shutdownGroups() error {
	var errs []error
	for i, g := range n.groups {
		errs = append(errs, g.Shutdown())
		n.trans[i].Close()
	}
	return errors.Join(errs...)
}

// partition returns the partition of id.
func (n *Node) partition(id uint64) uint16 { return uint16(ring.Partition(id, n.cfg.Partitions)) }

// queueWaiters wakes long-polling claims when a queue may have work.
type queueWaiters struct {
	mu     sync.Mutex
	chans  map[string]chan struct{}
	closed bool
}

func (w *queueWaiters) init() { w.chans = map[string]chan struct{}{} }

// wait returns a channel closed at the next notify of queue.
func (w *queueWaiters) wait(queue string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.chans[queue]
	if !ok {
		ch = make(chan struct{})
		if w.closed {
			close(ch)
		} else {
			w.chans[queue] = ch
		}
	}
	return ch
}

// notify wakes every claim waiting on queue.
func (w *queueWaiters) notify(queue string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ch, ok := w.chans[queue]; ok {
		close(ch)
		delete(w.chans, queue)
	}
}

// notifyAll wakes every waiting claim (they re-check their queues).
func (w *queueWaiters) notifyAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for q, ch := range w.chans {
		close(ch)
		delete(w.chans, q)
	}
}

func (w *queueWaiters) closeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for q, ch := range w.chans {
		close(ch)
		delete(w.chans, q)
	}
}
