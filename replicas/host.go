package replicas

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"go.opentelemetry.io/otel/trace"

	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// ProposeTimeout bounds a Raft proposal of the node's parts (a claim
// command, a ring edit, a configuration change).
const ProposeTimeout = 10 * time.Second

// Trees is what a Host tells of the partition replicas it opens and
// drops: the anti-entropy scheduler keeps a Merkle tree per replica.
type Trees interface {
	// Add builds partition p's tree (from the store) when its replica
	// opens; an error fails the open, which the reconcile loop retries.
	Add(p uint16) error
	// Remove forgets partition p's tree (its replica closes or is
	// dropped).
	Remove(p uint16)
}

// Config configures a Host. The node's Config documents the shared
// fields (units, defaults); New applies no defaults of its own.
type Config struct {
	NodeID          string
	DataDir         string // the Raft snapshots go under DataDir/raft
	Partitions      int
	APIAddr         string
	RaftAddr        string
	GossipAddr      string
	GossipLAN       bool
	Join            []string
	BootstrapExpect int
	Replication     int
	RaftTimeout     time.Duration
	Version         string
	Clock           crdt.Clock
	Logger          *slog.Logger
	RaftLogger      hclog.Logger // nil: warnings to stderr

	// SkewBuffer is this node's skew buffer, gossiped
	// (cluster.NodeMeta.SkewBufferMs) for the others' Host.SkewBuffer.
	SkewBuffer time.Duration

	// Incarnation names this node's data dir (cluster/incarnation.go;
	// the node keeps it in norn.json). It is gossiped, recorded in the
	// ring at formation and join, and every ring is checked against it
	// (cluster.CheckIncarnation) before this node's Raft groups take part.
	Incarnation string

	// Features are what this node gossips it can apply
	// (cluster.NodeMeta.Features): cluster.FeaturesBuilt, but for tests
	// that play a node of an older build.
	Features uint64

	// TLS, when set, secures the Raft port: TLS 1.3 with node
	// certificates on both ends (transport.MuxConfig.TLS). Nil: cleartext.
	TLS *transport.Certs
	// GossipKey, when set, encrypts gossip (cluster.MembershipConfig.SecretKey).
	GossipKey []byte

	// Store holds every replica's data and Raft log.
	Store *storage.Store
	// Peers reaches other nodes' APIs (to pull a newer ring).
	Peers *transport.Peers
	// ClaimNoCheck, ActNoFence, RetryNoBackoff, ReviveCompleted and
	// DeadlineUnfenced are the seeded bugs of the same names in
	// claims.Bugs.
	ClaimNoCheck, ActNoFence, RetryNoBackoff, ReviveCompleted, DeadlineUnfenced bool
	// OnEnded and OnFatal are every partition group's
	// claims.GroupConfig.OnEnded (with the partition) and OnFatal.
	// OnFatal also gets the refusal of a ring that lists this node with
	// another data dir (a cluster.ReplacedDataDirError) when it comes
	// after Start returned: the node must stop.
	OnEnded func(p uint16, ids []uint64)
	OnFatal func(error)

	// Trees learns of replicas opened and dropped.
	Trees Trees
	// Heartbeats, when set, coalesces the partition groups' heartbeats
	// per peer node (the meta group keeps its own).
	Heartbeats *transport.Heartbeats
	// MayLead gates claim proposals (the clock guard): claims.GroupConfig.MayLead.
	MayLead func() error
	// OnProposed, when set, is each partition group's
	// claims.GroupConfig.OnProposed, told the partition too (metrics).
	OnProposed func(p uint16, took time.Duration)
	// Tracer is each partition group's claims.GroupConfig.Tracer (nil:
	// tracing is off).
	Tracer trace.Tracer
	// OnLeaderChange runs when a partition group's leader changes (here or
	// elsewhere): waiting claims look again.
	OnLeaderChange func()
	// LeaderBalance tunes the leader balancer (LeaderBalancer; the node
	// runs BalanceLeaders every leader-balance interval).
	LeaderBalance LeaderBalanceTuning
	// OnMetaRing runs when the meta group applies a ring (the rebalance
	// driver takes a pass); OnPlacement when this node's ring or its set
	// of replicas changed (anti-entropy compares with every peer now).
	// Neither may block.
	OnMetaRing, OnPlacement func()
	// OnQueues runs when this node adopts a newer queue settings table
	// (Queues): waiting claims look again. It may not block.
	OnQueues func()

	// HoldRing is a test hook (the node sets it only in a testhooks
	// build; nil in production): while it returns true the reconcile
	// loop adopts no newer ring, neither the meta group's nor one gossip
	// announces, as on a node cut off from both. PullRing still adopts:
	// a coordinator whose write a replica refused for its stale ring
	// pulls that replica's.
	HoldRing func() bool
}

// Host is this node's place in the cluster: the Raft listener (one mux
// for every group), its replica of the meta group, gossip, the ring it
// works with, and one claims.Group per partition the ring places here.
// The reconcile loop keeps them in line with the cluster (see
// reconcile.go). Every other part of the node reads the ring and the
// groups through it.
type Host struct {
	cfg Config

	mux           *transport.RaftMux
	raftAddr      string // the mux's address, advertised
	meta          *cluster.Meta
	metaTrans     *transport.HeldTransport // held until takePart
	members       *cluster.Membership
	gossip        atomic.Pointer[cluster.Membership] // members, for the Raft listener's check
	ring          atomic.Pointer[cluster.Ring]       // nil until the cluster is formed
	parts         atomic.Pointer[partitions]         // set with the first ring
	adoptMu       sync.Mutex
	refusal       error             // the ring listed this node with another data dir (adoptMu; sticky)
	running       atomic.Bool       // Start returned: a refusal goes to OnFatal
	dropPending   map[int]bool      // partitions whose data a failed drop left (adoptMu)
	announced     uint64            // ring epoch gossiped (reconcile loop only)
	seedsLogged   bool              // a failed join was logged (reconcile loop only)
	rejoinAt      time.Time         // the last rejoinDown attempt (reconcile loop only)
	rejoining     atomic.Bool       // a rejoinDown join is running
	recording     atomic.Bool       // a recordAddresses pass is running (addresses.go)
	fixing        atomic.Bool       // a fixGroupAddresses pass is running
	refusals      map[string]string // node -> reason its addresses were last refused (recordAddresses only)
	reconcileKick chan struct{}
	leaders       *LeaderBalancer // spreads this node's leaderships (BalanceLeaders)
	queues        queueTable      // the queue settings this node applies (queues.go)

	stop    chan struct{}
	stopped sync.WaitGroup
}

// Start opens the Raft listener, starts the meta group's replica, adopts
// the ring kept in the data dir (a restart), starts gossip and, for a
// node that forms a cluster alone, forms it (Start returns with the
// ring); then it starts the reconcile loop. On an error everything
// started is stopped again.
func Start(cfg Config) (*Host, error) {
	h := &Host{cfg: cfg, reconcileKick: make(chan struct{}, 1), stop: make(chan struct{})}
	cfg.Peers.SetRing(func() (string, uint64) {
		if r := h.ring.Load(); r != nil {
			return r.ClusterID, r.Epoch
		}
		return "", 0
	})
	if err := h.startCluster(); err != nil {
		return nil, errors.Join(err, h.stopCluster())
	}
	h.leaders = h.newLeaderBalancer()
	h.running.Store(true)
	h.stopped.Add(1)
	go h.reconcile()
	return h, nil
}

// Close stops the reconcile loop, then gossip (with a goodbye), the
// partition groups, the meta group and the Raft listener. The node's
// other parts must have stopped using the groups.
func (h *Host) Close() error {
	close(h.stop)
	h.stopped.Wait()
	return h.stopCluster()
}

// Ring is the ring this node works with, nil before the cluster is
// formed. The caller must not modify it.
func (h *Host) Ring() *cluster.Ring { return h.ring.Load() }

// Partition returns the partition of task id.
func (h *Host) Partition(id uint64) uint16 { return uint16(ring.Partition(id, h.cfg.Partitions)) }

// KeyPartition returns the partition that decides the unique key key of
// queue.
func (h *Host) KeyPartition(queue, key string) uint16 {
	return uint16(ring.KeyPartition(queue, key, h.cfg.Partitions))
}

// Meta is this node's replica of the meta group.
func (h *Host) Meta() *cluster.Meta { return h.meta }

// Members is gossip's view of the cluster.
func (h *Host) Members() *cluster.Membership { return h.members }

// Alive is the ids of the members gossip sees alive (this node too).
func (h *Host) Alive() map[string]bool {
	out := map[string]bool{h.cfg.NodeID: true}
	for _, m := range h.members.Members() {
		if m.State.Up() {
			out[m.ID] = true
		}
	}
	return out
}

// SkewBuffer is the largest skew buffer of this node (Config.SkewBuffer)
// and every member gossip knows that has not left, dead ones included (a
// node that comes back may lead again). A leader expiring a lease waits
// it: the rule skew buffer > 2 × max clock offset + error is checked
// per node, so while nodes' settings differ only the largest buffer
// covers every pair of them (issue 41).
func (h *Host) SkewBuffer() time.Duration {
	return largestSkewBuffer(h.cfg.SkewBuffer, h.members.Members())
}

func largestSkewBuffer(own time.Duration, members []cluster.Member) time.Duration {
	for _, m := range members {
		if m.State != cluster.StateLeft {
			own = max(own, time.Duration(m.SkewBufferMs)*time.Millisecond)
		}
	}
	return own
}

// Lacking returns the ring's nodes (not dead) that have not said they
// have feature (cluster.NodeMeta.Features, as gossip last carried it; a
// node gossip has not seen counts as lacking), sorted; nil when every one
// has. A feature is used only when none lacks it (a rolling upgrade under
// way, a node of an older build).
func (h *Host) Lacking(feature uint64) []string {
	r := h.Ring()
	if r == nil {
		return nil
	}
	has := map[string]bool{}
	for _, m := range h.members.Members() {
		has[m.ID] = m.Features&feature == feature
	}
	var out []string
	for _, n := range r.Nodes {
		if n.Role != cluster.RoleDead && !has[n.ID] {
			out = append(out, n.ID)
		}
	}
	return out
}

// Up reports whether gossip sees node id alive or suspect.
func (h *Host) Up(id string) bool {
	for _, m := range h.members.Members() {
		if m.ID == id {
			return m.State.Up()
		}
	}
	return false
}

// metaPartition is the storage partition id of the meta group's Raft log
// (partition groups use 0 to P-1, and P is at most 1<<15).
const metaPartition = 0xFFFF

func (h *Host) raftLogger() hclog.Logger {
	if h.cfg.RaftLogger != nil {
		return h.cfg.RaftLogger
	}
	return hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: os.Stderr})
}

// startCluster opens the Raft listener, starts the meta group's replica,
// adopts the ring kept in the data dir (a restart), starts gossip and,
// for a node that forms a cluster alone, forms it.
func (h *Host) startCluster() error {
	mux, err := transport.ListenRaftMux(h.cfg.RaftAddr, transport.MuxConfig{Allow: h.allowRaftPeer, AllowNode: h.allowRaftNode, Logger: h.cfg.Logger, TLS: h.cfg.TLS})
	if err != nil {
		return fmt.Errorf("node: raft listener: %w", err)
	}
	h.mux = mux
	h.raftAddr = mux.Addr().String()

	stream, err := mux.Register(transport.MetaGroup)
	if err != nil {
		return err
	}
	// The meta replica starts held: it answers no request (no vote, no
	// append) until this node has a ring it checked or forms the
	// cluster (takePart). A node whose data dir was wiped while the ring
	// and the meta group's configuration still list it starts here with
	// an empty store, and an empty hashicorp/raft replica grants any
	// vote: it could vote twice in a term, or elect a leader that lacks
	// entries it had acknowledged. Held, it cannot before the refusal.
	// (Starting the replica only after the check would leave Meta nil
	// for the rest of the node meanwhile.) Partition groups start only
	// from a checked ring (adopt).
	h.metaTrans = transport.Hold(newNetworkTransport(stream, h.raftLogger().Named("meta")))
	snaps, err := raft.NewFileSnapshotStore(filepath.Join(h.cfg.DataDir, "raft", "meta"), 2, io.Discard)
	if err != nil {
		return fmt.Errorf("node: meta snapshots: %w", err)
	}
	rs := h.cfg.Store.RaftStore(metaPartition)
	h.meta, err = cluster.StartMeta(cluster.MetaConfig{
		LocalID: h.cfg.NodeID, Transport: h.metaTrans, Log: rs, Stable: rs, Snapshots: snaps,
		HeartbeatTimeout: h.cfg.RaftTimeout, ElectionTimeout: h.cfg.RaftTimeout, LeaderLeaseTimeout: h.cfg.RaftTimeout / 2,
		OnRing: func(*cluster.Ring) {
			h.KickReconcile()
			h.cfg.OnMetaRing()
		},
		OnQueues: func(q *cluster.Queues) {
			if err := h.AdoptQueues(q); err != nil {
				h.cfg.Logger.Error("cannot keep the meta group's queue settings", "err", err)
			}
		},
		RaftLogger: h.raftLogger().Named("meta"),
	})
	if err != nil {
		return err
	}

	r, err := cluster.LoadRing(h.cfg.DataDir)
	if err != nil {
		return err
	}
	if err := h.loadQueues(); err != nil {
		return err
	}
	if r != nil {
		if err := h.adopt(r); err != nil {
			return err
		}
	}
	meta := cluster.NodeMeta{ID: h.cfg.NodeID, APIAddr: h.cfg.APIAddr, RaftAddr: h.raftAddr, Version: h.cfg.Version,
		SkewBufferMs: h.cfg.SkewBuffer.Milliseconds(), Incarnation: h.cfg.Incarnation, Features: h.cfg.Features}
	if r != nil {
		meta.RingEpoch, meta.ClusterID = r.Epoch, r.ClusterID
	}
	meta.QueuesVersion = h.Queues().VersionOf()
	h.members, err = cluster.StartMembership(cluster.MembershipConfig{Meta: meta, BindAddr: h.cfg.GossipAddr,
		Logger: h.raftLogger().Named("gossip"), LAN: h.cfg.GossipLAN, Clock: h.cfg.Clock, SecretKey: h.cfg.GossipKey})
	if err != nil {
		return err
	}
	h.gossip.Store(h.members)
	if r == nil && h.cfg.BootstrapExpect == 1 {
		// A cluster of one forms at once: New returns with the ring.
		self := []cluster.RingNode{h.self()}
		if err := h.form(self); err != nil {
			return err
		}
	}
	if err := h.joinSeeds(); err != nil {
		return err
	}
	if h.ring.Load() == nil {
		return h.learnRing()
	}
	return nil
}

// learnRing pulls the ring of the cluster gossip shows (after joining the
// seeds) on a node that keeps none: a node whose data dir was wiped is
// then refused by New itself (adopt's check). A node not listed, or
// listed with its own data dir (one that crashed before it kept the ring
// it was added in), adopts it and takes part. When no member answers,
// the reconcile loop pulls later, and a refusal then goes to OnFatal.
func (h *Host) learnRing() error {
	var from []cluster.Member
	for _, m := range h.members.Members() {
		if m.ID != h.cfg.NodeID && m.State.Up() && m.ClusterID != "" && m.RingEpoch > 0 {
			from = append(from, m)
		}
	}
	slices.SortFunc(from, func(a, b cluster.Member) int { return cmp.Compare(b.RingEpoch, a.RingEpoch) })
	for _, m := range from {
		err := h.PullRing(m.APIAddr)
		if err == nil || errors.Is(err, cluster.ErrDataDirReplaced) {
			return err
		}
		h.cfg.Logger.Warn("pulling the cluster's ring at start failed", "from", m.ID, "err", err)
	}
	return nil
}

// takePart releases the meta replica (transport.HeldTransport): this
// node has a ring that passed its check, or is one of the nodes forming
// the cluster. Not after a refusal. The caller holds adoptMu.
func (h *Host) takePart() {
	if h.refusal == nil && !h.metaTrans.Released() {
		h.metaTrans.Release()
	}
}

// ReadsLocally reports whether this node answers reads of partition p
// (lists, counts, lookups) from its own replica: it is in p's cohort. A
// move's target, still being filled, reads from the cohort like a node
// without a replica.
func (h *Host) ReadsLocally(p uint16) bool {
	r := h.ring.Load()
	return h.Group(p) != nil && r != nil && r.Hosts(int(p), h.cfg.NodeID)
}

// RegisterStream adds a stream with id to the node's Raft mux (see
// transport.PeerRPCGroup).
func (h *Host) RegisterStream(id uint32) (*transport.GroupStream, error) { return h.mux.Register(id) }

// RaftAddr is the address of this node's Raft listener.
func (h *Host) RaftAddr() string { return h.raftAddr }

// GossipAddr is the address this node gossips on, for others to join.
func (h *Host) GossipAddr() string { return h.members.Addr() }

// ClusterID is the id of this node's cluster, "" before it is formed.
func (h *Host) ClusterID() string {
	if r := h.ring.Load(); r != nil {
		return r.ClusterID
	}
	return ""
}

// self is this node as the ring records it.
func (h *Host) self() cluster.RingNode {
	return cluster.RingNode{ID: h.cfg.NodeID, APIAddr: h.cfg.APIAddr, RaftAddr: h.raftAddr, GossipAddr: h.members.Addr(),
		Incarnation: h.cfg.Incarnation}
}

func newNetworkTransport(s *transport.GroupStream, logger hclog.Logger) *raft.NetworkTransport {
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: s, MaxPool: 2, Timeout: 10 * time.Second, Logger: logger,
	})
}

// allowRaftPeer admits a Raft connection from an address of a node of the
// ring or of a gossip member.
func (h *Host) allowRaftPeer(remote net.Addr) bool {
	ta, ok := remote.(*net.TCPAddr)
	if !ok {
		return false
	}
	match := func(hostport string) bool { return transport.SameHost(hostport, ta.IP) }
	if r := h.ring.Load(); r != nil {
		for _, nd := range r.Nodes {
			if match(nd.RaftAddr) {
				return true
			}
		}
	}
	if ms := h.gossip.Load(); ms != nil {
		for _, m := range ms.Members() {
			if m.State.Up() && match(m.RaftAddr) {
				return true
			}
		}
	}
	return false
}

// allowRaftNode accepts a Raft connection over TLS only from the node its
// certificate names, at that node's Raft address on the ring or in
// gossip: a node's certificate does not let another host speak for it.
func (h *Host) allowRaftNode(id string, remote net.Addr) bool {
	ta, ok := remote.(*net.TCPAddr)
	if !ok {
		return false
	}
	match := func(hostport string) bool { return transport.SameHost(hostport, ta.IP) }
	if r := h.ring.Load(); r != nil {
		if nd, ok := r.Node(id); ok && match(nd.RaftAddr) {
			return true
		}
	}
	if ms := h.gossip.Load(); ms != nil {
		for _, m := range ms.Members() {
			if m.ID == id && m.State.Up() && match(m.RaftAddr) {
				return true
			}
		}
	}
	return false
}

// stopCluster stops gossip (with a goodbye), the partition groups and the
// meta group, then the Raft listener.
func (h *Host) stopCluster() error {
	var errs []error
	if h.members != nil {
		errs = append(errs, h.members.Leave(time.Second))
	}
	if ps := h.parts.Load(); ps != nil {
		errs = append(errs, h.stopGroups(ps))
	}
	if h.meta != nil {
		errs = append(errs, h.meta.Shutdown())
	}
	if h.metaTrans != nil {
		h.metaTrans.Close()
	}
	if h.mux != nil {
		errs = append(errs, h.mux.Close())
	}
	return errors.Join(errs...)
}
