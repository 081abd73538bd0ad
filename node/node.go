package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/norn-dev/norn/antientropy"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/rebalance"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// Node is one nornd: the store, the Raft groups of the partitions it
// replicates, its replica of the meta group, gossip, the task API's logic
// (coordinating writes, reads and claims across the cluster) and the
// monitor. A single node is a cluster of one: the code paths are the
// same.
type Node struct {
	cfg   Config
	lock  *dirLock
	store *storage.Store
	hlc   *crdt.HLC
	ids   *idGen
	start time.Time

	host  *replicas.Host     // the ring, the partition groups, meta group and gossip
	peers *transport.Peers   // other nodes' APIs
	coord *coord.Coordinator // quorum writes and reads, routing, lists and counts

	rebalance *rebalance.Driver // placement calls, partition moves and the meta group's voters

	waiters  *queueWaiters
	inflight inflightSet // tasks being claimed now
	ender    *ender      // coalesced claim ends of finished tasks
	deps     *depChecker // dependencies of blocked tasks (deps.go)

	ae      *antientropy.Replica // Merkle trees and exchanges (antientropy.go)
	aeStats aeStats
	aeKick  chan struct{}
	// aeLimiter paces the anti-entropy rounds' bytes, fillLimiter the
	// fills' of moves to this node.
	aeLimiter, fillLimiter *rate.Limiter
	// filling marks the partitions with a fill under way (antientropy.go).
	fillMu  sync.Mutex
	filling map[uint16]bool

	draining chan struct{} // closed by StopWaiting
	drainMu  sync.Once

	// monitorMu serializes monitor passes; extended[p] records that the
	// current leadership of p has extended the live claims.
	monitorMu sync.Mutex
	extended  []bool
	// clockGuard judges this node's clock against the cluster's and hands
	// over its leaderships while it is out of bound (clockguard.go).
	clockGuard clockGuard

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
	// Every replica's ready index wakes this node's waiting claims: an
	// enqueue merged here, or a yield, expiry or promotion applied by a
	// partition's claim FSM on any of its cohort members (the claim then
	// finds the task through its leader, here or proxied).
	waiters := newQueueWaiters()
	store, err := storage.Open(storage.Config{Dir: filepath.Join(cfg.DataDir, "db"), Clock: cfg.Clock,
		FS: cfg.StorageFS, AckBeforeSync: cfg.TestBugs.AckBeforeSync,
		OnReady: func(_ uint16, queue string) { waiters.notify(queue) }})
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

		waiters: waiters,

		draining: make(chan struct{}),
	}
	n.extended = make([]bool, cfg.Partitions)
	n.clockGuard.check = clockCheck{InBound: true}
	n.ender = newEnder(n)
	n.deps = newDepChecker(n)
	n.peers = transport.NewPeers(transport.PeersConfig{NodeID: cfg.NodeID, APIAddr: cfg.APIAddr})
	n.aeKick = make(chan struct{}, 1)
	n.aeLimiter = rate.NewLimiter(rate.Limit(cfg.AntiEntropyRate), max(cfg.AntiEntropyRate, 1<<20))
	n.fillLimiter = rate.NewLimiter(rate.Limit(cfg.MoveRate), max(cfg.MoveRate, 1<<20))
	n.filling = map[uint16]bool{}
	n.rebalance = rebalance.New(rebalance.Config{
		NodeID: cfg.NodeID, Peers: n.peers, Logger: cfg.Logger,
		MaxMovesPerNode: cfg.MaxMovesPerNode, MoveTargetTimeout: cfg.MoveTargetTimeout,
		AutoRebalance: cfg.AutoRebalance, AutoDeadAfter: cfg.AutoDeadAfter,
		Fills: aeFills{n},
	})
	if n.ae, err = n.newAntiEntropy(); err != nil {
		store.Close()
		lock.release()
		return nil, err
	}
	n.host, err = replicas.Start(replicas.Config{
		NodeID: cfg.NodeID, DataDir: cfg.DataDir, Partitions: cfg.Partitions,
		APIAddr: cfg.APIAddr, RaftAddr: cfg.RaftAddr, GossipAddr: cfg.GossipAddr, GossipLAN: cfg.GossipLAN,
		Join: cfg.Join, BootstrapExpect: cfg.BootstrapExpect, Replication: cfg.Replication,
		RaftTimeout: cfg.RaftTimeout, Version: cfg.Version, Clock: cfg.Clock,
		Logger: cfg.Logger, RaftLogger: cfg.RaftLogger,
		Store: store, Peers: n.peers, ClaimNoCheck: cfg.TestBugs.ClaimNoCheck,
		Trees:          aeTrees{n},
		MayLead:        n.mayLead,
		OnLeaderChange: n.waiters.notifyAll,
		OnMetaRing:     n.rebalance.Kick,
		OnPlacement:    n.kickAntiEntropy,
	})
	if err != nil {
		n.peers.Close()
		store.Close()
		lock.release()
		return nil, err
	}
	n.coord = coord.New(coord.Config{
		NodeID: cfg.NodeID, Partitions: cfg.Partitions,
		WriteTimeout: cfg.WriteTimeout, Limits: cfg.Limits, Clock: cfg.Clock, Logger: cfg.Logger,
		Store: store, Host: n.host, Peers: n.peers,
		OnEnded:             n.ended,
		DepsDone:            n.depsDone,
		DropReplicatedWrite: cfg.TestBugs.DropReplicatedWrite,
	})
	n.rebalance.Start(n.host)
	n.stopped.Add(5)
	go n.monitor()
	go n.clockLoop()
	go n.antiEntropyLoop()
	go func() {
		defer n.stopped.Done()
		n.ender.run(n.stop)
	}()
	go func() {
		defer n.stopped.Done()
		n.deps.run(n.stop)
	}()
	return n, nil
}

// Ready reports whether the cluster is formed and every partition this
// node replicates has a leader.
func (n *Node) Ready() bool {
	gs := n.host.Groups()
	if gs == nil {
		return false
	}
	for _, g := range gs {
		if g != nil && g.Leader() == "" {
			return false
		}
	}
	return true
}

// WaitReady blocks until Ready or timeout passes.
func (n *Node) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !n.Ready() {
		if time.Now().After(deadline) {
			if n.host.Ring() == nil {
				return errors.New("node: the cluster is not formed yet")
			}
			return errors.New("node: partitions have no leader yet")
		}
		time.Sleep(10 * time.Millisecond)
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
	n.rebalance.Close()
	n.stopped.Wait()
	errs := n.host.Close()
	n.peers.Close()
	return errors.Join(errs, n.store.Close(), n.lock.release())
}

// queueWaiters wakes long-polling claims when a queue may have work.
type queueWaiters struct {
	mu     sync.Mutex
	chans  map[string]chan struct{}
	closed bool
}

func newQueueWaiters() *queueWaiters { return &queueWaiters{chans: map[string]chan struct{}{}} }

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

// RaftAddr is the address of this node's Raft listener.
func (n *Node) RaftAddr() string { return n.host.RaftAddr() }

// GossipAddr is the address this node gossips on, for others to join.
func (n *Node) GossipAddr() string { return n.host.GossipAddr() }

// ClusterID is the id of this node's cluster, "" before it is formed.
func (n *Node) ClusterID() string { return n.host.ClusterID() }

// ended ends the claims of tasks a merge made terminal, in the partitions
// this node leads, and wakes waiting claims: dependants of these tasks, in
// any queue, may be claimable (or doomed) now.
func (n *Node) ended(tasks []coord.Ended) {
	for _, e := range tasks {
		if g := n.host.Group(e.P); g != nil && g.IsLeader() {
			n.endClaim(e.ID, e.Event)
		}
	}
	n.waiters.notifyAll()
}
