package replicas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/transport"
)

// joinSeeds contacts the configured seeds and the nodes of the ring. A
// seed that belongs to another cluster is a configuration error: it stops
// the node.
func (h *Host) joinSeeds() error {
	seeds := slices.Clone(h.cfg.Join)
	if r := h.ring.Load(); r != nil {
		for _, nd := range r.Nodes {
			if nd.ID != h.cfg.NodeID && nd.GossipAddr != "" {
				seeds = append(seeds, nd.GossipAddr)
			}
		}
	}
	if len(seeds) == 0 {
		return nil
	}
	_, err := h.members.Join(seeds)
	if errors.Is(err, cluster.ErrOtherCluster) {
		return err
	}
	if err != nil && !h.seedsLogged {
		h.seedsLogged = true // once: the reconcile loop retries every second
		h.cfg.Logger.Info("no seed answered yet; retrying", "seeds", seeds, "err", err)
	}
	return nil
}

// form creates the cluster over nodes (sorted by id, this node first): it
// bootstraps the meta group with the first 3 (or 5) of them as voters and
// proposes the first ring.
func (h *Host) form(nodes []cluster.RingNode) error {
	h.adoptMu.Lock()
	h.takePart()
	h.adoptMu.Unlock()
	voters := nodes[:cluster.MetaVoters(len(nodes))]
	if err := h.meta.Bootstrap(voters); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		return fmt.Errorf("node: bootstrap the meta group: %w", err)
	}
	if !h.meta.WaitLeader(20 * h.cfg.RaftTimeout) {
		return errors.New("node: the meta group elected no leader (are the other nodes up?)")
	}
	if h.meta.Ring() == nil {
		r, err := cluster.NewRing(nodes, h.cfg.Partitions, min(h.cfg.Replication, len(nodes)))
		if err != nil {
			return err
		}
		if err := h.meta.ProposeRing(r, ProposeTimeout); err != nil && !errors.Is(err, cluster.ErrStaleEpoch) {
			return fmt.Errorf("node: propose the first ring: %w", err)
		}
	}
	r := h.meta.Ring()
	if r == nil {
		return errors.New("node: the first ring was not applied")
	}
	h.cfg.Logger.Info("cluster formed", "cluster_id", r.ClusterID, "nodes", len(r.Nodes),
		"partitions", r.Partitions, "replication", r.Replication)
	return h.adopt(r)
}

// adopt makes r this node's ring if it is newer than the current one: it
// keeps it in the data dir and, the first time, starts the groups of the
// partitions this node replicates. A ring that lists this node with
// another data dir (cluster.CheckIncarnation) is refused for good: the
// node keeps no ring, starts no group, its meta replica stays held, and
// every later adopt returns the refusal (after Start, OnFatal gets it).
func (h *Host) adopt(r *cluster.Ring) error {
	h.adoptMu.Lock()
	defer h.adoptMu.Unlock()
	if h.refusal != nil {
		return h.refusal
	}
	cur := h.ring.Load()
	if cur != nil && cur.ClusterID != r.ClusterID {
		return fmt.Errorf("node: %w: this node is in cluster %s, the ring is of cluster %s",
			cluster.ErrOtherCluster, cur.ClusterID, r.ClusterID)
	}
	if cur != nil && r.Epoch <= cur.Epoch {
		return nil
	}
	if r.Partitions != h.cfg.Partitions {
		return fmt.Errorf("node: the cluster has %d partitions, this node was started with %d (-partitions)",
			r.Partitions, h.cfg.Partitions)
	}
	if err := cluster.CheckIncarnation(r, h.cfg.NodeID, h.cfg.Incarnation); err != nil {
		h.refusal = err
		h.cfg.Logger.Error("refusing to take part: the cluster knows this node's id with another data dir", "err", err)
		if h.running.Load() {
			h.cfg.OnFatal(err)
		}
		return err
	}
	if err := cluster.SaveRing(h.cfg.DataDir, r); err != nil {
		return fmt.Errorf("node: keep the ring: %w", err)
	}
	h.takePart()
	if cur == nil {
		h.parts.Store(&partitions{
			groups:  make([]*claims.Group, r.Partitions),
			streams: make([]*transport.GroupStream, r.Partitions),
			trans:   make([]groupTransport, r.Partitions),
		})
	}
	h.ring.Store(r)
	// A new ring may bring a partition a new replica, or a member a new
	// address: compare with every peer now.
	h.cfg.OnPlacement()
	_, err := h.placeGroups(r, cur == nil)
	return err
}

// KickReconcile asks the reconcile loop for a pass (never blocks).
func (h *Host) KickReconcile() {
	select {
	case h.reconcileKick <- struct{}{}:
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
func (h *Host) reconcile() {
	defer h.stopped.Done()
	t := time.NewTicker(reconcileInterval)
	defer t.Stop()
	for {
		h.reconcileOnce()
		select {
		case <-h.stop:
			return
		case <-h.members.Changed():
		case <-h.reconcileKick:
		case <-t.C:
		}
	}
}

func (h *Host) reconcileOnce() {
	if h.refused() {
		return // the node stops (OnFatal); nothing here may take part
	}
	held := h.cfg.HoldRing != nil && h.cfg.HoldRing()
	if r := h.meta.Ring(); r != nil && !held {
		if err := h.adopt(r); err != nil {
			h.cfg.Logger.Error("cannot adopt the meta group's ring", "err", err)
		}
	}
	h.replace()
	members := h.members.Members()
	cur := h.ring.Load()
	if cur == nil && h.cfg.BootstrapExpect > 1 {
		f := cluster.DecideFormation(members, h.cfg.BootstrapExpect, h.cfg.NodeID)
		if f.Ready && slices.ContainsFunc(f.Members, func(m cluster.Member) bool { return m.ID == h.cfg.NodeID }) {
			// One of the cluster's first nodes: its meta replica must
			// answer the bootstrapping node's vote requests.
			h.adoptMu.Lock()
			h.takePart()
			h.adoptMu.Unlock()
		}
		if f.Ready && f.Bootstrap {
			nodes := make([]cluster.RingNode, len(f.Members))
			for i, m := range f.Members {
				nodes[i] = cluster.RingNode{ID: m.ID, APIAddr: m.APIAddr, RaftAddr: m.RaftAddr, GossipAddr: m.GossipAddr,
					Incarnation: m.Incarnation}
			}
			if err := h.form(nodes); err != nil {
				h.cfg.Logger.Warn("forming the cluster failed; retrying", "err", err)
			}
			cur = h.ring.Load()
		}
	}
	alive := 0
	for _, m := range members {
		if !m.State.Up() || m.ID == h.cfg.NodeID {
			continue
		}
		alive++
		if !held && m.RingEpoch > epochOf(cur) && (cur == nil || m.ClusterID == cur.ClusterID) {
			if err := h.PullRing(m.APIAddr); errors.Is(err, cluster.ErrDataDirReplaced) {
				return // refused (adopt logged it and told OnFatal)
			} else if err != nil {
				h.cfg.Logger.Warn("pulling the ring failed", "from", m.ID, "err", err)
			}
			cur = h.ring.Load()
		}
	}
	if cur != nil && epochOf(cur) != h.announced {
		err := h.members.UpdateMeta(func(m *cluster.NodeMeta) {
			m.RingEpoch, m.ClusterID = cur.Epoch, cur.ClusterID
		}, time.Second)
		if err == nil || alive == 0 {
			h.announced = cur.Epoch
		}
	}
	if cur != nil {
		h.followAddresses(members)
		h.reconcileQueues(cur, members)
	}
	if alive == 0 {
		if err := h.joinSeeds(); err != nil {
			h.cfg.Logger.Error("a seed refused this node", "err", err)
		}
	} else if cur != nil {
		h.rejoinDown(cur, members)
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
func (h *Host) rejoinDown(r *cluster.Ring, members []cluster.Member) {
	if time.Since(h.rejoinAt) < rejoinInterval {
		return
	}
	h.rejoinAt = time.Now()
	up := map[string]bool{}
	for _, m := range members {
		up[m.ID] = m.State.Up()
	}
	var addrs []string
	for _, nd := range r.Nodes {
		if nd.ID != h.cfg.NodeID && nd.Role != cluster.RoleDead && nd.GossipAddr != "" && !up[nd.ID] {
			addrs = append(addrs, nd.GossipAddr)
		}
	}
	if len(addrs) == 0 || !h.rejoining.CompareAndSwap(false, true) {
		return
	}
	h.stopped.Add(1)
	go func() {
		defer h.stopped.Done()
		defer h.rejoining.Store(false)
		if k, err := h.members.Join(addrs); k > 0 {
			h.cfg.Logger.Info("gossiping again with nodes seen down", "joined", k, "tried", addrs, "err", err)
		}
	}()
}

// refused reports whether a ring listed this node with another data dir.
func (h *Host) refused() bool {
	h.adoptMu.Lock()
	defer h.adoptMu.Unlock()
	return h.refusal != nil
}

func epochOf(r *cluster.Ring) uint64 {
	if r == nil {
		return 0
	}
	return r.Epoch
}

// PullRing fetches the ring of the node at addr and adopts it.
func (h *Host) PullRing(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := h.cfg.Peers.Get(addr).Peer.GetRing(ctx, transport.Request(h.cfg.Peers, &nornv1.GetRingRequest{}))
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
	return h.adopt(&r)
}
