package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/antientropy"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/dispatch"
	"github.com/norn-dev/norn/rebalance"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/server"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
	"github.com/norn-dev/norn/transport"
)

// Node is one nornd: the store, the Raft groups of the partitions it
// replicates, its replica of the meta group, gossip, the task API's logic
// (coordinating writes, reads and claims across the cluster) and the
// monitor. A single node is a cluster of one: the code paths are the
// same.
type Node struct {
	cfg Config
	// retention caches the queues' own retentions (retention.go).
	retention atomic.Pointer[retentionCache]
	// refuseStates is the test hook RefuseTaskStates.
	refuseStates atomic.Bool
	// gossipedSecurity is the SecurityMeta last gossiped (gossipSecurity).
	gossipedSecurity cluster.SecurityMeta
	lock             *dirLock
	store            *storage.Store
	hlc              *crdt.HLC
	// incarnation names the data dir (norn.json; cluster/incarnation.go):
	// a ring that lists this node's id with another one is refused.
	incarnation string

	host  *replicas.Host     // the ring, the partition groups, meta group and gossip
	peers *transport.Peers   // other nodes' APIs
	coord *coord.Coordinator // quorum writes and reads, routing, lists and counts

	rebalance *rebalance.Driver // placement calls, partition moves and the meta group's voters

	waiters  *dispatch.Waiters    // long-polling claims, woken by the store and the host
	dispatch *dispatch.Dispatcher // claims, the monitor, claim ends, dependencies
	server   *server.Server       // the API edge: validation and translation

	ae *antientropy.Scheduler // Merkle trees, rounds with peers, fills of moves here

	// clockGuard judges this node's clock against the cluster's and hands
	// over its leaderships while it is out of bound.
	clockGuard *cluster.ClockGuard
	// rejoin keeps this node's in-cluster mark and enforces the
	// retention rule for a node out of the cluster too long (rejoin.go).
	rejoin *rejoinGuard

	rpc     *transport.RPCServer // framed peer calls
	metrics *nodeMetrics         // the registry of /metrics and what the parts report to
	tracing *nodeTracing         // the parts' tracers and the calls' wrappers; empty when off
	stop    chan struct{}
	stopped sync.WaitGroup
	failed  chan error // a partition's claim FSM stopped for good (Failed)
	closeMu sync.Mutex
	closed  bool

	// clientBudget and peerBudget bound the request bytes the node holds
	// (Config.MaxInflightClientBytes, MaxInflightPeerBytes; admit.go).
	clientBudget, peerBudget *transport.Budget
}

// New opens the node's data dir and starts its partition groups and
// monitor. A second node on the same data dir fails with ErrDataDirInUse.
// A node whose data dir is not the one the cluster's ring knows under its
// id (lost or replaced) fails with an error wrapping
// cluster.ErrDataDirReplaced that names the fix, before any of its Raft
// groups takes part; when it learns the ring only later, Failed delivers
// that error instead.
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
	// The incarnation goes with the store: a data dir whose store is gone
	// gets a new one (openDataDirMeta).
	storageFS := cfg.StorageFS
	if storageFS == nil {
		storageFS = vfs.Default
	}
	_, statErr := storageFS.Stat(filepath.Join(cfg.DataDir, "db"))
	if statErr != nil && !errors.Is(statErr, fs.ErrNotExist) {
		lock.release()
		return nil, fmt.Errorf("node: store: %w", statErr)
	}
	incarnation, err := openDataDirMeta(cfg.DataDir, cfg.Partitions, statErr == nil)
	if err != nil {
		lock.release()
		return nil, err
	}
	// Every replica's ready index wakes this node's waiting claims: an
	// enqueue merged here, or a yield, expiry or promotion applied by a
	// partition's claim FSM on any of its cohort members (the claim then
	// finds the task through its leader, here or proxied).
	waiters := dispatch.NewWaiters()
	store, err := storage.Open(storage.Config{Dir: filepath.Join(cfg.DataDir, "db"), Clock: cfg.Clock,
		FS: cfg.StorageFS, AckBeforeSync: cfg.TestBugs.AckBeforeSync, CountDrift: cfg.TestBugs.CountDrift, RetentionFromEnqueue: cfg.TestBugs.RetentionFromEnqueue, WALMinSyncInterval: max(cfg.WALMinSyncInterval, 0),
		Log:     cfg.logger("storage"),
		OnReady: func(_ uint16, queue string) { waiters.Notify(queue) }})
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
	rejoin, err := newRejoinGuard(cfg.DataDir, cfg.NodeID, cfg.Clock, cfg.Retention, cfg.logger("rejoin"))
	if err != nil {
		store.Close()
		lock.release()
		return nil, err
	}
	tr, err := newNodeTracing(cfg.TracerProvider)
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

		incarnation: incarnation,
		stop:        make(chan struct{}),
		failed:      make(chan error, 1),

		rejoin:  rejoin,
		waiters: waiters,
		metrics: newNodeMetrics(cfg),
		tracing: tr,

		clientBudget: transport.NewBudget("client", int64(cfg.MaxInflightClientBytes), 0),
		peerBudget:   transport.NewBudget("peer", int64(cfg.MaxInflightPeerBytes), 0),
	}
	rejoin.shortest = n.shortestQueueRetention
	n.clockGuard = cluster.NewClockGuard(cluster.ClockGuardConfig{
		NodeID: cfg.NodeID, MaxOffset: cfg.MaxClockOffset, Clock: cfg.Clock, Logger: cfg.logger("clock"),
		Members: func() []cluster.Member { return n.host.Members().Members() },
		Groups:  n.leaders,
	})
	if cfg.TLS != nil && cfg.TestBugs.TLSAnyClient {
		cfg.TLS.AcceptAnyClient = true
	}
	n.peers = transport.NewPeers(transport.PeersConfig{NodeID: cfg.NodeID, APIAddr: cfg.APIAddr, TLS: cfg.TLS,
		Interceptors: append([]connect.Interceptor{n.metrics.rpc.Interceptor()}, n.tracing.interceptors...),
		ObserveRPC:   n.metrics.rpc.ObserveFramedClient})
	n.ae, err = antientropy.New(antientropy.Config{
		NodeID: cfg.NodeID,
		Replica: antientropy.ReplicaConfig{
			Store:    store,
			LeafBits: cfg.TreeLeafBits,
			Horizon:  func() int64 { return n.dispatch.RetentionHorizon() },
			QueueHorizons: func() (map[string]int64, uint64) {
				h, v := n.dispatch.RetentionHorizons()
				return h.Queues, v
			},
			Expire: func(p uint16, h storage.Horizons) error { return n.dispatch.Expire(p, h) },
			Merge: func(_ uint16, tasks []*crdt.Task) error {
				return n.coord.MergeLocal(tasks)
			},
		},
		Interval: cfg.AntiEntropyInterval, Timeout: cfg.AntiEntropyTimeout, Settle: cfg.AntiEntropySettle,
		Rate: cfg.AntiEntropyRate, FillRate: cfg.MoveRate,
		Limits: cfg.Limits, Peers: n.peers, Logger: cfg.logger("antientropy"),
		Tracer: n.tracing.tracer("antientropy"),
	})
	if err != nil {
		store.Close()
		lock.release()
		return nil, err
	}
	n.rebalance = rebalance.New(rebalance.Config{
		NodeID: cfg.NodeID, Peers: n.peers, Logger: cfg.logger("rebalance"),
		MaxMovesPerNode: cfg.MaxMovesPerNode, MoveTargetTimeout: cfg.MoveTargetTimeout,
		AutoRebalance: cfg.AutoRebalance, AutoDeadAfter: cfg.AutoDeadAfter,
		Fills: n.ae,
	})
	var heartbeats *transport.Heartbeats
	if cfg.RaftHeartbeatLinger > 0 {
		heartbeats = transport.NewHeartbeats(transport.HeartbeatsConfig{
			Call: func(ctx context.Context, addr string, m transport.RPCMethod, body []byte) ([]byte, error) {
				return n.peers.RPC(addr).Call(ctx, m, n.peers.Meta(), body)
			},
			Linger: cfg.RaftHeartbeatLinger,
		})
	}
	var holdRing func() bool
	if testhooks.Built {
		holdRing = cfg.HoldRing
	}
	n.host, err = replicas.Start(replicas.Config{
		NodeID: cfg.NodeID, DataDir: cfg.DataDir, Partitions: cfg.Partitions,
		APIAddr: cfg.APIAddr, RaftAddr: cfg.RaftAddr, GossipAddr: cfg.GossipAddr, GossipLAN: cfg.GossipLAN,
		Join: cfg.Join, BootstrapExpect: cfg.BootstrapExpect, Replication: cfg.Replication,
		RaftTimeout: cfg.RaftTimeout, Version: cfg.Version, Incarnation: incarnation, SkewBuffer: cfg.SkewBuffer, Features: cfg.features(), Clock: cfg.Clock, TLS: cfg.TLS, GossipKey: cfg.GossipKey,
		Logger: cfg.logger("replicas"), RaftLogger: cfg.RaftLogger,
		Store: store, Peers: n.peers, ClaimNoCheck: cfg.TestBugs.ClaimNoCheck, ActNoFence: cfg.TestBugs.ActNoFence,
		RetryNoBackoff: cfg.TestBugs.RetryNoBackoff, ReviveCompleted: cfg.TestBugs.RetryCompleted, DeadlineUnfenced: cfg.TestBugs.DeadlineUnfenced,
		// A task a partition's claim FSM made terminal may unblock its
		// dependants, in any queue.
		OnEnded:       func(uint16, []uint64) { n.waiters.NotifyAll() },
		OnFatal:       n.fail,
		LeaderBalance: leaderBalanceTuning(cfg),
		Trees:         n.ae,
		Heartbeats:    heartbeats,
		MayLead: func() error {
			if err := n.rejoin.mayLead(); err != nil {
				return err
			}
			return n.clockGuard.MayLead()
		},
		OnProposed:     n.metrics.raft.Proposed,
		Tracer:         n.tracing.tracer("claims"),
		OnLeaderChange: n.waiters.NotifyAll,
		OnMetaRing:     n.rebalance.Kick,
		OnPlacement:    n.ae.Kick,
		// A queue resumed: its waiting claims look again.
		OnQueues: n.waiters.NotifyAll,
		HoldRing: holdRing,
	})
	if err != nil {
		n.peers.Close()
		store.Close()
		lock.release()
		return nil, err
	}
	n.coord = coord.New(coord.Config{
		NodeID: cfg.NodeID, Partitions: cfg.Partitions,
		WriteTimeout: cfg.WriteTimeout, Limits: cfg.Limits, Clock: cfg.Clock, Logger: cfg.logger("coord"),
		Store: store, Host: n.host, Peers: n.peers, Tracer: n.tracing.tracer("coord"),
		OnEnded:             func(e []coord.Ended) { n.dispatch.Ended(e) },
		DepsDone:            func(ids []uint64) bool { return n.dispatch.DepsDone(ids) },
		DropReplicatedWrite: cfg.TestBugs.DropReplicatedWrite,
	})
	n.dispatch = dispatch.New(dispatch.Config{
		NodeID: cfg.NodeID, APIAddr: cfg.APIAddr, Partitions: cfg.Partitions,
		MonitorInterval: cfg.MonitorInterval, ClaimRecheck: cfg.ClaimRecheck,
		HeadsTTL: cfg.ClaimHeadsTTL, HeadsWait: cfg.ClaimHeadsWait,
		LeaseGrace: cfg.LeaseGrace, SkewBuffer: cfg.SkewBuffer, Retention: cfg.Retention,
		WriteTimeout: cfg.WriteTimeout, Clock: cfg.Clock, HLC: n.hlc, Logger: cfg.logger("dispatch"),
		Store: store, Host: n.host, Peers: n.peers, Coord: n.coord, Waiters: waiters,
		ClockInBound: func() bool { return n.clockGuard.State().InBound },
		ExpiryNoSkew: cfg.TestBugs.ExpiryNoSkew, ClaimLocalFirst: cfg.TestBugs.ClaimLocalFirst, FairIgnoresKeys: cfg.TestBugs.FairIgnoresKeys,
		OnExpired:      n.metrics.tasks.Expired,
		OnAborted:      n.metrics.tasks.Aborted,
		Paused:         func(q string) bool { return n.host.Queues().Get(q).Paused },
		QueueRetention: n.queueRetention,
		Limits: func(q string) dispatch.Limits {
			s := n.host.Queues().Get(q)
			return dispatch.Limits{MaxClaimed: s.MaxClaimed, ClaimRate: s.ClaimRate}
		},
		CapStaleCount: cfg.TestBugs.CapStaleCount, DeadlineUnfenced: cfg.TestBugs.DeadlineUnfenced,
		UniquePhantomAfter: n.rejoin.limit,
	})
	n.dispatch.Start()
	n.server = server.New(server.Config{
		Limits: cfg.Limits, DefaultLease: cfg.DefaultLease, MaxLease: cfg.MaxLease, MaxWait: cfg.MaxWait, DefaultRetry: *cfg.DefaultRetry,
		MinQueueRetention: cfg.MinQueueRetention,
		Clock:             cfg.Clock, HLC: n.hlc, IDs: ids, Logger: cfg.logger("server"),
		NodeID: cfg.NodeID, APIAddr: cfg.APIAddr, Version: cfg.Version, Start: cfg.Clock.Now(),
		Store: store, Host: n.host, Peers: n.peers, Coord: n.coord, Dispatch: n.dispatch,
		AE: n.ae, Rebalance: n.rebalance, ClockGuard: n.clockGuard, Heartbeats: heartbeats,
		Auth:     cfg.Auth,
		ActLocal: cfg.TestBugs.ActLocal, EndAfterWrite: cfg.TestBugs.EndAfterWrite, RetryCompleted: cfg.TestBugs.RetryCompleted,
		UniqueAfterWrite: cfg.TestBugs.UniqueAfterWrite, UniquePhantomAfter: n.rejoin.limit,
		ScheduleRandomID: cfg.TestBugs.ScheduleRandomID, ScheduleRanDelay: cfg.ScheduleRanDelay, WriteTimeout: cfg.WriteTimeout,
		Events:   n.metrics.tasks,
		Security: server.SecurityStatus{TLS: cfg.TLS != nil, GossipEncrypted: cfg.GossipKey != nil, Insecure: cfg.Insecure},
		Build:    cfg.Build, DataDir: cfg.DataDir, Backup: n.Backup,
		ExchangeGate: n.exchangeGate,
		OutTooLong:   n.rejoin.Out,
	})
	// Replication's framed calls, on the Raft port (transport.PeerRPCGroup).
	rpcStream, err := n.host.RegisterStream(transport.PeerRPCGroup)
	if err != nil {
		n.dispatch.Close()
		n.host.Close()
		n.peers.Close()
		store.Close()
		lock.release()
		return nil, err
	}
	// The Raft port takes only nodes (at its handshake over TLS, by
	// address over cleartext), before any frame is read.
	n.rpc = transport.ServeRPCWith(rpcStream, transport.RPCServerConfig{Budget: n.peerBudget, Refused: n.metrics.rpc.ObserveFramedRefused},
		n.metrics.rpc.FramedServer(n.tracing.framed(n.server.HandleRPC)), cfg.logger("transport"))
	n.registerMetrics()
	n.rejoin.announce(n.host.Members())
	n.ae.Start(aeHost{Host: n.host, mayExchange: func(peer string) error { return n.exchangeGate(peer, true) }})
	n.rebalance.Start(n.host)
	n.stopped.Add(4)
	// The rejoin rule's mark and judgement, and the node's security
	// settings gossiped (an access file reloaded changes its digest),
	// every monitor interval.
	go n.every(n.cfg.MonitorInterval, func() {
		n.rejoin.check(n.host.Ring(), n.host.Members())
		n.gossipSecurity()
	})
	// The clock guard judges the clock every monitor interval, apart from
	// the monitor, whose passes can wait on Raft for seconds.
	go n.every(n.cfg.MonitorInterval, n.clockGuard.Check)
	// The leader balancer, apart again: its transfers wait on Raft.
	go n.every(n.cfg.LeaderBalanceInterval, n.host.BalanceLeaders)
	// The schedules' ticks, on the meta group's leader.
	go n.every(n.cfg.SchedulePass, n.server.RunSchedulesOnce)
	return n, nil
}

// Ready reports whether the cluster is formed, every partition this
// node replicates has a leader (GET /healthz), the replicas moves are
// filling here included, and the clock guard has judged this node's
// clock (it has measured a peer's, or it is alone): until then it leads
// nothing (cluster.ClockCheck.Unjudged).
func (n *Node) Ready() bool {
	l, formed := n.leaderless()
	return formed && l.cohort == 0 && l.moveTarget == 0 && !n.clockGuard.State().Unjudged
}

// leaderlessCounts counts the partitions a node replicates that have no
// leader it knows of (the metric norn_partitions_without_leader).
type leaderlessCounts struct {
	// cohort: partitions whose cohort the node is in, a group not open
	// yet included.
	cohort int
	// moveTarget: replicas a move is filling here. No leader reaches a
	// replica before it joins the group as a non-voter, so each counts
	// for its whole fill.
	moveTarget int
}

// leaderless counts the partitions without a leader this node knows of,
// and reports whether the cluster is formed (before, there is nothing to
// count).
func (n *Node) leaderless() (c leaderlessCounts, formed bool) {
	gs, r := n.host.Groups(), n.host.Ring()
	if gs == nil || r == nil {
		return c, false
	}
	for p, g := range gs {
		inCohort := r.Hosts(p, n.cfg.NodeID)
		switch {
		// A partition of this node's cohorts whose group is not open yet
		// is not served yet: the groups of a new ring open one after the
		// other (a move's target opens its group before it joins the
		// cohort).
		case g == nil:
			if inCohort {
				c.cohort++
			}
		case g.Leader() != "":
		case inCohort:
			c.cohort++
		default:
			c.moveTarget++
		}
	}
	return c, true
}

// WaitReady blocks until Ready or timeout passes.
func (n *Node) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !n.Ready() {
		if time.Now().After(deadline) {
			if n.host.Ring() == nil {
				return errors.New("node: the cluster is not formed yet")
			}
			if l, _ := n.leaderless(); l.cohort == 0 && l.moveTarget == 0 {
				return errors.New("node: no peer's clock measured yet (the clock guard lets it lead nothing until then)")
			}
			return errors.New("node: partitions have no leader yet")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// HandOver prepares the node to stop (nornd calls it on SIGTERM, before
// it stops serving): from now on the node leads nothing, and tells the
// others through gossip not to hand it any leadership (as while its
// clock is out of bound); it hands every partition leadership it holds to
// another voter that may lead, picked so that the nodes that stay are
// balanced, at most replicas.HandOverParallel transfers at once, and the
// meta group's too. It returns when it leads no partition, when no voter
// may take what is left (a cluster of one: nothing to do), or when ctx
// ends; the result says which, and it is logged. The node keeps serving
// meanwhile: claims of a partition whose leadership moved go to its new
// leader. It cannot be undone: Close the node after it.
func (n *Node) HandOver(ctx context.Context) replicas.HandOverResult {
	return n.host.HandOver(ctx)
}

// StopWaiting makes long-polling claims return now (empty) and new ones
// not wait, so that a server shutting down can drain its requests.
func (n *Node) StopWaiting() {
	n.dispatch.StopWaiting()
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
	n.closeMetrics()
	n.StopWaiting()
	close(n.stop)
	n.dispatch.Close()
	n.ae.Close()
	n.rebalance.Close()
	n.stopped.Wait()
	n.rpc.Close()
	n.rejoin.stop()
	errs := n.host.Close()
	n.peers.Close()
	return errors.Join(errs, n.store.Close(), n.lock.release())
}

// Failed delivers the error that made the node unable to go on: a
// partition's claim FSM could not apply an entry and stopped (see
// claims.GroupConfig.OnFatal; a restart replays the partition's log from
// the last entry it stored), or the ring this node learned after New
// returned lists its id with another data dir (cluster.ErrDataDirReplaced;
// its Raft groups took no part). The node must then stop (nornd exits
// with the error).
func (n *Node) Failed() <-chan error { return n.failed }

// fail reports err on Failed (the first one; later ones are logged by
// their FSMs).
func (n *Node) fail(err error) {
	select {
	case n.failed <- err:
	default:
	}
}

// RaftAddr is the address of this node's Raft listener.
func (n *Node) RaftAddr() string { return n.host.RaftAddr() }

// GossipAddr is the address this node gossips on, for others to join.
func (n *Node) GossipAddr() string { return n.host.GossipAddr() }

// ClusterID is the id of this node's cluster, "" before it is formed.
func (n *Node) ClusterID() string { return n.host.ClusterID() }

// leaders lists the partition groups on this node, indexed by partition,
// for the clock guard (nil where there is none).
func (n *Node) leaders() []cluster.Leader {
	gs := n.host.Groups()
	out := make([]cluster.Leader, len(gs))
	for p, g := range gs {
		if g != nil {
			out[p] = g
		}
	}
	return out
}

// leaderBalanceTuning is the leader balancer's setting from cfg: a node
// just seen eligible is handed leaderships only two passes later (it
// catches up on its groups' logs meanwhile).
func leaderBalanceTuning(cfg Config) replicas.LeaderBalanceTuning {
	t := replicas.LeaderBalanceTuning{Tolerance: cfg.LeaderBalanceTolerance,
		TargetSettle: 2 * cfg.LeaderBalanceInterval}
	if !cfg.NoLeaderBalance {
		t.Rate = cfg.LeaderBalanceRate
		t.Burst = replicas.LeaderBurst(cfg.LeaderBalanceRate, cfg.LeaderBalanceInterval)
	}
	return t
}

// every runs fn now and then every period until Close (a goroutine
// counted in n.stopped).
func (n *Node) every(period time.Duration, fn func()) {
	defer n.stopped.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		fn()
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
	}
}

// TransferLeadershipTo hands the leadership of partition p, which this
// node must lead, to its voter to, and returns when this node has
// stepped down or the transfer failed. For the Jepsen harness's POST
// /test/transfer (a leadership moved mid-lease on purpose); the leader
// balancer and the clock guard move leaderships on their own.
func (n *Node) TransferLeadershipTo(p uint16, to string) error {
	g := n.host.Group(p)
	if g == nil {
		return fmt.Errorf("node: no group of partition %d on this node", p)
	}
	servers, err := g.Servers()
	if err != nil {
		return err
	}
	for _, s := range servers {
		if s.ID == to && s.Voter {
			return g.TransferLeadershipTo(s.ID, s.Address)
		}
	}
	return fmt.Errorf("node: %s is no voter of partition %d", to, p)
}

// gossipSecurity gossips the node's security settings when they changed
// since it last did (an access file reloaded), for every node's Status.
func (n *Node) gossipSecurity() {
	sec := cluster.SecurityMeta{TLS: n.cfg.TLS != nil, GossipEncrypted: n.cfg.GossipKey != nil, Known: true}
	if n.cfg.Auth != nil {
		sec.Access = n.cfg.Auth.Digest()
	}
	members := n.host.Members()
	if sec == n.gossipedSecurity || members == nil {
		return
	}
	if err := members.UpdateMeta(func(m *cluster.NodeMeta) { m.Security = sec }, time.Second); err == nil {
		n.gossipedSecurity = sec
	}
}

// exchangeGate says whether task states may pass between this node and
// peer (server.Config.ExchangeGate): serving, this node sends them (a
// replica read, anti-entropy); else it takes them (a replicated write).
// The rejoin rule decides, and the test hook RefuseTaskStates.
func (n *Node) exchangeGate(peer string, serving bool) error {
	if testhooks.Built && n.refuseStates.Load() {
		return errStatesRefused
	}
	if serving {
		return n.rejoin.mayExchange(peer)
	}
	return n.rejoin.peerOut(peer)
}

// errStatesRefused is exchangeGate's answer while RefuseTaskStates is on.
var errStatesRefused = errors.New("node: task states refused (test hook)")

// RefuseTaskStates makes this node exchange no task states with its peers
// (on) or exchange them again (off), while its Raft groups go on: it
// refuses their replicated writes, serves no replica reads and does no
// anti-entropy, as a replica whose writes fail. A write acked at W < N
// then misses it. Test hooks only (POST /test/refuse-states); elsewhere
// it does nothing.
func (n *Node) RefuseTaskStates(on bool) {
	if testhooks.Built {
		n.refuseStates.Store(on)
	}
}

// PartitionOf is the partition of task id.
func (n *Node) PartitionOf(id uint64) uint16 { return n.host.Partition(id) }
