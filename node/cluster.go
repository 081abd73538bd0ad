package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/transport"
)

// metaPartition is the storage partition id of the meta group's Raft log
// (partition groups use 0 to P-1, and P is at most 1<<15).
const metaPartition = 0xFFFF

// partitions is the set of partition groups this node runs, replaced as a
// whole (copy on write) when a group is opened or dropped. groups[p] is
// nil for a partition the node does not replicate.
type partitions struct {
	groups  []*claims.Group
	streams []*transport.GroupStream
	trans   []*raft.NetworkTransport
}

// groupList returns the partition groups (nil before the cluster is
// formed); entries of partitions this node does not replicate are nil.
func (n *Node) groupList() []*claims.Group {
	if ps := n.parts.Load(); ps != nil {
		return ps.groups
	}
	return nil
}

// group returns partition p's group on this node, nil when the node does
// not replicate p (or the cluster is not formed yet).
func (n *Node) group(p uint16) *claims.Group {
	if gs := n.groupList(); int(p) < len(gs) {
		return gs[p]
	}
	return nil
}

func (n *Node) raftLogger() hclog.Logger {
	if n.cfg.RaftLogger != nil {
		return n.cfg.RaftLogger
	}
	return hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: os.Stderr})
}

// startCluster opens the Raft listener, starts the meta group's replica,
// adopts the ring kept in the data dir (a restart), starts gossip and,
// for a node that forms a cluster alone, forms it.
func (n *Node) startCluster() error {
	mux, err := transport.ListenRaftMux(n.cfg.RaftAddr, transport.MuxConfig{Allow: n.allowRaftPeer, Logger: n.cfg.Logger})
	if err != nil {
		return fmt.Errorf("node: raft listener: %w", err)
	}
	n.mux = mux
	n.raftAddr = mux.Addr().String()

	stream, err := mux.Register(transport.MetaGroup)
	if err != nil {
		return err
	}
	n.metaTrans = newNetworkTransport(stream, n.raftLogger().Named("meta"))
	snaps, err := raft.NewFileSnapshotStore(filepath.Join(n.cfg.DataDir, "raft", "meta"), 2, io.Discard)
	if err != nil {
		return fmt.Errorf("node: meta snapshots: %w", err)
	}
	rs := n.store.RaftStore(metaPartition)
	n.meta, err = cluster.StartMeta(cluster.MetaConfig{
		LocalID: n.cfg.NodeID, Transport: n.metaTrans, Log: rs, Stable: rs, Snapshots: snaps,
		HeartbeatTimeout: n.cfg.RaftTimeout, ElectionTimeout: n.cfg.RaftTimeout, LeaderLeaseTimeout: n.cfg.RaftTimeout / 2,
		OnRing: func(*cluster.Ring) {
			n.kickReconcile()
			n.kickDriver()
		},
		RaftLogger: n.raftLogger().Named("meta"),
	})
	if err != nil {
		return err
	}

	r, err := cluster.LoadRing(n.cfg.DataDir)
	if err != nil {
		return err
	}
	if r != nil {
		if err := n.adopt(r); err != nil {
			return err
		}
	}
	meta := cluster.NodeMeta{ID: n.cfg.NodeID, APIAddr: n.cfg.APIAddr, RaftAddr: n.raftAddr, Version: n.cfg.Version}
	if r != nil {
		meta.RingEpoch, meta.ClusterID = r.Epoch, r.ClusterID
	}
	n.members, err = cluster.StartMembership(cluster.MembershipConfig{Meta: meta, BindAddr: n.cfg.GossipAddr,
		Logger: n.raftLogger().Named("gossip"), LAN: n.cfg.GossipLAN, Clock: n.cfg.Clock})
	if err != nil {
		return err
	}
	n.gossip.Store(n.members)
	if r == nil && n.cfg.BootstrapExpect == 1 {
		// A cluster of one forms at once: New returns with the ring.
		self := []cluster.RingNode{n.self()}
		if err := n.form(self); err != nil {
			return err
		}
	}
	if err := n.joinSeeds(); err != nil {
		return err
	}
	return nil
}

// readsLocally reports whether this node answers reads of partition p
// (lists, counts, lookups) from its own replica: it is in p's cohort. A
// move's target, still being filled, reads from the cohort like a node
// without a replica.
func (n *Node) readsLocally(p uint16) bool {
	r := n.ring.Load()
	return n.group(p) != nil && r != nil && r.Hosts(int(p), n.cfg.NodeID)
}

// RaftAddr is the address of this node's Raft listener.
func (n *Node) RaftAddr() string { return n.raftAddr }

// GossipAddr is the address this node gossips on, for others to join.
func (n *Node) GossipAddr() string { return n.members.Addr() }

// ClusterID is the id of this node's cluster, "" before it is formed.
func (n *Node) ClusterID() string {
	if r := n.ring.Load(); r != nil {
		return r.ClusterID
	}
	return ""
}

// self is this node as the ring records it.
func (n *Node) self() cluster.RingNode {
	return cluster.RingNode{ID: n.cfg.NodeID, APIAddr: n.cfg.APIAddr, RaftAddr: n.raftAddr, GossipAddr: n.members.Addr()}
}

func newNetworkTransport(s *transport.GroupStream, logger hclog.Logger) *raft.NetworkTransport {
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: s, MaxPool: 2, Timeout: 10 * time.Second, Logger: logger,
	})
}

// joinSeeds contacts the configured seeds and the nodes of the ring. A
// seed that belongs to another cluster is a configuration error: it stops
// the node.
func (n *Node) joinSeeds() error {
	seeds := slices.Clone(n.cfg.Join)
	if r := n.ring.Load(); r != nil {
		for _, nd := range r.Nodes {
			if nd.ID != n.cfg.NodeID && nd.GossipAddr != "" {
				seeds = append(seeds, nd.GossipAddr)
			}
		}
	}
	if len(seeds) == 0 {
		return nil
	}
	_, err := n.members.Join(seeds)
	if errors.Is(err, cluster.ErrOtherCluster) {
		return err
	}
	if err != nil && !n.seedsLogged {
		n.seedsLogged = true // once: the reconcile loop retries every second
		n.cfg.Logger.Info("no seed answered yet; retrying", "seeds", seeds, "err", err)
	}
	return nil
}

// form creates the cluster over nodes (sorted by id, this node first): it
// bootstraps the meta group with the first 3 (or 5) of them as voters and
// proposes the first ring.
func (n *Node) form(nodes []cluster.RingNode) error {
	voters := nodes[:cluster.MetaVoters(len(nodes))]
	if err := n.meta.Bootstrap(voters); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		return fmt.Errorf("node: bootstrap the meta group: %w", err)
	}
	if !n.meta.WaitLeader(20 * n.cfg.RaftTimeout) {
		return errors.New("node: the meta group elected no leader (are the other nodes up?)")
	}
	if n.meta.Ring() == nil {
		r, err := cluster.NewRing(nodes, n.cfg.Partitions, min(n.cfg.Replication, len(nodes)))
		if err != nil {
			return err
		}
		if err := n.meta.ProposeRing(r, proposeTimeout); err != nil && !errors.Is(err, cluster.ErrStaleEpoch) {
			return fmt.Errorf("node: propose the first ring: %w", err)
		}
	}
	r := n.meta.Ring()
	if r == nil {
		return errors.New("node: the first ring was not applied")
	}
	n.cfg.Logger.Info("cluster formed", "cluster_id", r.ClusterID, "nodes", len(r.Nodes),
		"partitions", r.Partitions, "replication", r.Replication)
	return n.adopt(r)
}

// adopt makes r this node's ring if it is newer than the current one: it
// keeps it in the data dir and, the first time, starts the groups of the
// partitions this node replicates.
func (n *Node) adopt(r *cluster.Ring) error {
	n.adoptMu.Lock()
	defer n.adoptMu.Unlock()
	cur := n.ring.Load()
	if cur != nil && cur.ClusterID != r.ClusterID {
		return fmt.Errorf("node: %w: this node is in cluster %s, the ring is of cluster %s",
			cluster.ErrOtherCluster, cur.ClusterID, r.ClusterID)
	}
	if cur != nil && r.Epoch <= cur.Epoch {
		return nil
	}
	if r.Partitions != n.cfg.Partitions {
		return fmt.Errorf("node: the cluster has %d partitions, this node was started with %d (-partitions)",
			r.Partitions, n.cfg.Partitions)
	}
	if err := cluster.SaveRing(n.cfg.DataDir, r); err != nil {
		return fmt.Errorf("node: keep the ring: %w", err)
	}
	if cur == nil {
		n.parts.Store(&partitions{
			groups:  make([]*claims.Group, r.Partitions),
			streams: make([]*transport.GroupStream, r.Partitions),
			trans:   make([]*raft.NetworkTransport, r.Partitions),
		})
	}
	n.ring.Store(r)
	// A new ring may bring a partition a new replica, or a member a new
	// address: compare with every peer now.
	n.kickAntiEntropy()
	_, err := n.placeGroups(r, cur == nil)
	return err
}

// replace runs placeGroups again on the current ring: a group that failed
// to open or drop is retried by every reconcile pass.
func (n *Node) replace() {
	n.adoptMu.Lock()
	defer n.adoptMu.Unlock()
	if r := n.ring.Load(); r != nil {
		if _, err := n.placeGroups(r, false); err != nil {
			n.cfg.Logger.Error("opening or dropping partition replicas failed; retrying", "err", err)
		}
	}
}

// placeGroups opens a group for every partition r places a replica of
// on this node and closes (and drops) every group it no longer does: a
// move's target opens its replica when the move starts; its source drops
// its own once the ring records the move done (the handoff confirmed).
// On the first ring (first), the cohort's first member bootstraps each
// group with the whole cohort; groups opened later start empty and learn
// their configuration from the group's leader.
func (n *Node) placeGroups(r *cluster.Ring, first bool) (changed bool, err error) {
	defer func() {
		if changed {
			n.kickAntiEntropy()
		}
	}()
	for p := range r.Partitions {
		want := r.HostsReplica(p, n.cfg.NodeID)
		have := n.group(uint16(p)) != nil
		switch {
		case want && !have:
			changed = true
			if err := n.openGroup(r, p, first && string(r.Cohort(p)[0]) == n.cfg.NodeID); err != nil {
				return changed, err
			}
		case !want && have:
			changed = true
			if err := n.dropGroup(p); err != nil {
				return changed, err
			}
		}
	}
	return changed, nil
}

// openGroup starts partition p's Raft group and Merkle tree on this node.
func (n *Node) openGroup(r *cluster.Ring, p int, bootstrap bool) error {
	snaps, err := raft.NewFileSnapshotStore(n.snapshotDir(p), 2, io.Discard)
	if err != nil {
		return fmt.Errorf("node: snapshots of partition %d: %w", p, err)
	}
	stream, err := n.mux.Register(uint32(p))
	if err != nil {
		return err
	}
	rl := n.raftLogger().Named(fmt.Sprintf("p%d", p))
	trans := newNetworkTransport(stream, rl)
	n.store.ReopenPartition(uint16(p))
	var servers []raft.Server
	for _, id := range r.Cohort(p) {
		nd, _ := r.Node(string(id))
		servers = append(servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(nd.RaftAddr)})
	}
	rs := n.store.RaftStore(uint16(p))
	g, err := claims.StartGroup(claims.GroupConfig{
		Partition: uint16(p), LocalID: raft.ServerID(n.cfg.NodeID),
		KV: n.store, Log: rs, Stable: rs, Snapshots: snaps, Transport: trans,
		Bootstrap: bootstrap, Servers: servers,
		HeartbeatTimeout: n.cfg.RaftTimeout, ElectionTimeout: n.cfg.RaftTimeout,
		LeaderLeaseTimeout: n.cfg.RaftTimeout / 2,
		Logger:             n.cfg.Logger, RaftLogger: rl,
		// The partition's ready tasks become claimable when it gets a
		// leader (here or elsewhere) after having none: waiting claims
		// look again (a change that finds nothing costs one look).
		OnLeaderChange: n.waiters.notifyAll,
		MayLead:        n.mayLead,
		Bugs:           claims.Bugs{ClaimNoCheck: n.cfg.TestBugs.ClaimNoCheck},
	})
	if err != nil {
		stream.Close()
		trans.Close()
		return err
	}
	// The partition's Merkle tree, built from the segment index, then kept
	// current by every write.
	if err := n.ae.Add(uint16(p)); err != nil {
		stream.Close()
		trans.Close()
		return errors.Join(fmt.Errorf("node: tree of partition %d: %w", p, err), g.Shutdown())
	}
	ps := n.parts.Load().clone()
	ps.groups[p], ps.streams[p], ps.trans[p] = g, stream, trans
	n.parts.Store(ps)
	return nil
}

// dropGroup stops partition p's group and deletes the partition's data
// from this node, in the safe order: the group leaves the node's set (no
// new request finds it), its stream is unregistered (no new Raft
// connection reaches it), its transport closed, the group shut down, its
// tree untracked; then one range delete drops every key of p and its
// snapshots are removed.
func (n *Node) dropGroup(p int) error {
	old := n.parts.Load()
	ps := old.clone()
	ps.groups[p], ps.streams[p], ps.trans[p] = nil, nil, nil
	n.parts.Store(ps)
	old.streams[p].Close()
	old.trans[p].Close()
	err := old.groups[p].Shutdown()
	n.ae.Remove(uint16(p))
	n.aeStats.forget(uint16(p))
	if err != nil && !errors.Is(err, raft.ErrRaftShutdown) {
		n.cfg.Logger.Warn("partition group shutdown", "partition", p, "err", err)
	}
	if err := n.store.DropPartition(uint16(p)); err != nil {
		return err
	}
	if err := os.RemoveAll(n.snapshotDir(p)); err != nil {
		return fmt.Errorf("node: snapshots of partition %d: %w", p, err)
	}
	n.cfg.Logger.Info("partition handed over; its replica is dropped", "partition", p)
	return nil
}

func (n *Node) snapshotDir(p int) string {
	return filepath.Join(n.cfg.DataDir, "raft", fmt.Sprintf("p%04d", p))
}

// clone copies the set for a change (readers keep the one they loaded).
func (ps *partitions) clone() *partitions {
	return &partitions{groups: slices.Clone(ps.groups), streams: slices.Clone(ps.streams), trans: slices.Clone(ps.trans)}
}

// stopGroups shuts the groups down in the safe order: unregister each from
// the mux (no new connection reaches it), close its transport, shut the
// group down. Dropping a partition's data (rebalancing) comes after.
func (n *Node) stopGroups(ps *partitions) error {
	var errs []error
	for p := range ps.streams {
		if ps.streams[p] != nil {
			ps.streams[p].Close()
		}
		if ps.trans[p] != nil {
			ps.trans[p].Close()
		}
		if ps.groups[p] != nil {
			errs = append(errs, ps.groups[p].Shutdown())
			n.ae.Remove(uint16(p))
		}
	}
	return errors.Join(errs...)
}

// kickReconcile asks the reconcile loop for a pass (never blocks).
func (n *Node) kickReconcile() {
	select {
	case n.reconcileKick <- struct{}{}:
	default:
	}
}

// reconcileInterval is how often the reconcile loop runs without a
// signal (re-joining seeds, retrying a failed pull).
const reconcileInterval = time.Second

// reconcile brings the node in line with the cluster: it adopts rings the
// meta group applied, forms the cluster once the expected nodes are there,
// pulls newer rings seen in gossip and re-joins seeds while alone. It runs
// on gossip changes, meta group applies and a timer, until Close.
func (n *Node) reconcile() {
	defer n.stopped.Done()
	t := time.NewTicker(reconcileInterval)
	defer t.Stop()
	for {
		n.reconcileOnce()
		select {
		case <-n.stop:
			return
		case <-n.members.Changed():
		case <-n.reconcileKick:
		case <-t.C:
		}
	}
}

func (n *Node) reconcileOnce() {
	if r := n.meta.Ring(); r != nil {
		if err := n.adopt(r); err != nil {
			n.cfg.Logger.Error("cannot adopt the meta group's ring", "err", err)
		}
	}
	n.replace()
	members := n.members.Members()
	cur := n.ring.Load()
	if cur == nil && n.cfg.BootstrapExpect > 1 {
		f := cluster.DecideFormation(members, n.cfg.BootstrapExpect, n.cfg.NodeID)
		if f.Ready && f.Bootstrap {
			nodes := make([]cluster.RingNode, len(f.Members))
			for i, m := range f.Members {
				nodes[i] = cluster.RingNode{ID: m.ID, APIAddr: m.APIAddr, RaftAddr: m.RaftAddr, GossipAddr: m.GossipAddr}
			}
			if err := n.form(nodes); err != nil {
				n.cfg.Logger.Warn("forming the cluster failed; retrying", "err", err)
			}
			cur = n.ring.Load()
		}
	}
	alive := 0
	for _, m := range members {
		if !m.State.Up() || m.ID == n.cfg.NodeID {
			continue
		}
		alive++
		if m.RingEpoch > epochOf(cur) && (cur == nil || m.ClusterID == cur.ClusterID) {
			if err := n.pullRing(m.APIAddr); err != nil {
				n.cfg.Logger.Warn("pulling the ring failed", "from", m.ID, "err", err)
			}
			cur = n.ring.Load()
		}
	}
	if cur != nil && epochOf(cur) != n.announced {
		err := n.members.UpdateMeta(func(m *cluster.NodeMeta) {
			m.RingEpoch, m.ClusterID = cur.Epoch, cur.ClusterID
		}, time.Second)
		if err == nil || alive == 0 {
			n.announced = cur.Epoch
		}
	}
	if alive == 0 {
		if err := n.joinSeeds(); err != nil {
			n.cfg.Logger.Error("a seed refused this node", "err", err)
		}
	} else if cur != nil {
		n.rejoinDown(cur, members)
	}
}

// rejoinInterval is how often a node tries to gossip again with the ring
// nodes it sees dead.
const rejoinInterval = 5 * time.Second

// rejoinDown contacts again, every rejoinInterval and in the background,
// the ring's nodes (other than dead-for-good ones) that gossip shows down
// or does not show at all. Memberlist stops gossiping with a dead node
// after a while, so the two sides of a healed network split would each
// go on seeing the other dead (and anti-entropy and fills, which skip
// down peers, would never reconcile them) until someone joins again.
func (n *Node) rejoinDown(r *cluster.Ring, members []cluster.Member) {
	if time.Since(n.rejoinAt) < rejoinInterval {
		return
	}
	n.rejoinAt = time.Now()
	up := map[string]bool{}
	for _, m := range members {
		up[m.ID] = m.State.Up()
	}
	var addrs []string
	for _, nd := range r.Nodes {
		if nd.ID != n.cfg.NodeID && nd.Role != cluster.RoleDead && nd.GossipAddr != "" && !up[nd.ID] {
			addrs = append(addrs, nd.GossipAddr)
		}
	}
	if len(addrs) == 0 || !n.rejoining.CompareAndSwap(false, true) {
		return
	}
	n.stopped.Add(1)
	go func() {
		defer n.stopped.Done()
		defer n.rejoining.Store(false)
		if k, err := n.members.Join(addrs); k > 0 {
			n.cfg.Logger.Info("gossiping again with nodes seen down", "joined", k, "tried", addrs, "err", err)
		}
	}()
}

func epochOf(r *cluster.Ring) uint64 {
	if r == nil {
		return 0
	}
	return r.Epoch
}

// pullRing fetches the ring of the node at addr and adopts it.
func (n *Node) pullRing(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := n.peers.get(addr).peer.GetRing(ctx, peerRequest(n, &nornv1.GetRingRequest{}))
	if err != nil {
		return err
	}
	if len(resp.Msg.GetRing()) == 0 {
		return nil
	}
	var r cluster.Ring
	if err := json.Unmarshal(resp.Msg.GetRing(), &r); err != nil {
		return err
	}
	if err := r.Validate(); err != nil {
		return err
	}
	return n.adopt(&r)
}

// allowRaftPeer admits a Raft connection from an address of a node of the
// ring or of a gossip member.
func (n *Node) allowRaftPeer(remote net.Addr) bool {
	ta, ok := remote.(*net.TCPAddr)
	if !ok {
		return false
	}
	match := func(hostport string) bool { return hostIs(hostport, ta.IP) }
	if r := n.ring.Load(); r != nil {
		for _, nd := range r.Nodes {
			if match(nd.RaftAddr) {
				return true
			}
		}
	}
	if ms := n.gossip.Load(); ms != nil {
		for _, m := range ms.Members() {
			if m.State.Up() && match(m.RaftAddr) {
				return true
			}
		}
	}
	return false
}

// stopCluster stops gossip (with a goodbye), the partition groups and the
// meta group, then the Raft listener.
func (n *Node) stopCluster() error {
	var errs []error
	if n.members != nil {
		errs = append(errs, n.members.Leave(time.Second))
	}
	if ps := n.parts.Load(); ps != nil {
		errs = append(errs, n.stopGroups(ps))
	}
	if n.meta != nil {
		errs = append(errs, n.meta.Shutdown())
	}
	if n.metaTrans != nil {
		n.metaTrans.Close()
	}
	if n.mux != nil {
		errs = append(errs, n.mux.Close())
	}
	n.peers.close()
	return errors.Join(errs...)
}

// errNotFormed answers requests before the node has a ring.
var errNotFormed = connect.NewError(connect.CodeUnavailable,
	errors.New("the cluster is not formed yet (waiting for the expected nodes)"))
