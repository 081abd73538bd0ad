package replicas

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/transport"
)

// partitions is the set of partition groups this node runs, replaced as a
// whole (copy on write) when a group is opened or dropped. groups[p] is
// nil for a partition the node does not replicate.
type partitions struct {
	groups  []*claims.Group
	streams []*transport.GroupStream
	trans   []groupTransport
}

// groupTransport is a partition group's Raft transport: its
// NetworkTransport, with heartbeats coalesced when the node has a
// transport.Heartbeats.
type groupTransport interface {
	raft.Transport
	Close() error
}

// Groups returns the partition groups (nil before the cluster is
// formed); entries of partitions this node does not replicate are nil.
func (h *Host) Groups() []*claims.Group {
	if ps := h.parts.Load(); ps != nil {
		return ps.groups
	}
	return nil
}

// Group returns partition p's group on this node, nil when the node does
// not replicate p (or the cluster is not formed yet).
func (h *Host) Group(p uint16) *claims.Group {
	if gs := h.Groups(); int(p) < len(gs) {
		return gs[p]
	}
	return nil
}

// replace runs placeGroups again on the current ring: a group that failed
// to open or drop is retried by every reconcile pass.
func (h *Host) replace() {
	h.adoptMu.Lock()
	defer h.adoptMu.Unlock()
	if r := h.ring.Load(); r != nil {
		if _, err := h.placeGroups(r, false); err != nil {
			h.cfg.Logger.Error("opening or dropping partition replicas failed; retrying", "err", err)
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
func (h *Host) placeGroups(r *cluster.Ring, first bool) (changed bool, err error) {
	defer func() {
		if changed {
			h.cfg.OnPlacement()
		}
	}()
	for p := range r.Partitions {
		want := r.HostsReplica(p, h.cfg.NodeID)
		have := h.Group(uint16(p)) != nil
		switch {
		case want && !have:
			changed = true
			if h.dropPending[p] {
				// Placed here again before the data of its last replica
				// here was deleted: delete it first, the group starts anew.
				if err := h.dropData(p); err != nil {
					return changed, err
				}
			}
			if err := h.openGroup(r, p, first && string(r.Cohort(p)[0]) == h.cfg.NodeID); err != nil {
				return changed, err
			}
		case !want && have:
			changed = true
			if err := h.dropGroup(p); err != nil {
				return changed, err
			}
		case !want && h.dropPending[p]:
			// A drop whose delete failed: its group is closed, its data
			// must not stay behind.
			if err := h.dropData(p); err != nil {
				return changed, err
			}
		}
	}
	return changed, nil
}

// openGroup starts partition p's Raft group and Merkle tree on this node.
func (h *Host) openGroup(r *cluster.Ring, p int, bootstrap bool) error {
	snaps, err := raft.NewFileSnapshotStore(h.snapshotDir(p), 2, io.Discard)
	if err != nil {
		return fmt.Errorf("node: snapshots of partition %d: %w", p, err)
	}
	stream, err := h.mux.Register(uint32(p))
	if err != nil {
		return err
	}
	rl := h.raftLogger().Named(fmt.Sprintf("p%d", p))
	nt := newNetworkTransport(stream, rl)
	var trans groupTransport = transport.Gate(nt)
	if h.cfg.Heartbeats != nil {
		trans = h.cfg.Heartbeats.Wrap(uint32(p), nt)
	}
	h.cfg.Store.ReopenPartition(uint16(p))
	var servers []raft.Server
	for _, id := range r.Cohort(p) {
		nd, _ := r.Node(string(id))
		servers = append(servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(nd.RaftAddr)})
	}
	rs := h.cfg.Store.RaftStore(uint16(p))
	var onProposed func(time.Duration)
	if h.cfg.OnProposed != nil {
		onProposed = func(d time.Duration) { h.cfg.OnProposed(uint16(p), d) }
	}
	var onEnded func([]uint64)
	if h.cfg.OnEnded != nil {
		onEnded = func(ids []uint64) { h.cfg.OnEnded(uint16(p), ids) }
	}
	g, err := claims.StartGroup(claims.GroupConfig{
		Partition: uint16(p), LocalID: raft.ServerID(h.cfg.NodeID),
		KV: h.cfg.Store, Log: rs, Stable: rs, Snapshots: snaps, Transport: trans,
		Bootstrap: bootstrap, Servers: servers,
		HeartbeatTimeout: h.cfg.RaftTimeout, ElectionTimeout: h.cfg.RaftTimeout,
		LeaderLeaseTimeout: h.cfg.RaftTimeout / 2,
		// An idle leader sends each follower an empty append every
		// CommitTimeout to 2x (so a follower learns the last commit):
		// with 1,024 groups those were a third of an idle node's Raft
		// calls at 500 ms. Writes do not wait for it.
		CommitTimeout: max(h.cfg.RaftTimeout, 500*time.Millisecond),
		Logger:        h.cfg.Logger, RaftLogger: rl,
		// The partition's ready tasks become claimable when it gets a
		// leader (here or elsewhere) after having none: waiting claims
		// look again (a change that finds nothing costs one look).
		OnLeaderChange: h.cfg.OnLeaderChange,
		MayLead:        h.cfg.MayLead,
		OnProposed:     onProposed,
		Tracer:         h.cfg.Tracer,
		OnEnded:        onEnded,
		OnFatal:        h.cfg.OnFatal,
		Bugs: claims.Bugs{ClaimNoCheck: h.cfg.ClaimNoCheck, ActNoFence: h.cfg.ActNoFence, RetryNoBackoff: h.cfg.RetryNoBackoff, ReviveCompleted: h.cfg.ReviveCompleted,
			DeadlineUnfenced: h.cfg.DeadlineUnfenced},
	})
	if err != nil {
		stream.Close()
		trans.Close()
		return err
	}
	// The partition's Merkle tree, built from the segment index, then kept
	// current by every write.
	if err := h.cfg.Trees.Add(uint16(p)); err != nil {
		stream.Close()
		trans.Close()
		return errors.Join(fmt.Errorf("node: tree of partition %d: %w", p, err), g.Shutdown())
	}
	ps := h.parts.Load().clone()
	ps.groups[p], ps.streams[p], ps.trans[p] = g, stream, trans
	h.parts.Store(ps)
	return nil
}

// dropGroup stops partition p's group and deletes the partition's data
// from this node, in the safe order: the group leaves the node's set (no
// new request finds it), its stream is unregistered (no new Raft
// connection reaches it), its transport closed, the group shut down, its
// tree untracked; then one range delete drops every key of p and its
// snapshots are removed.
func (h *Host) dropGroup(p int) error {
	old := h.parts.Load()
	ps := old.clone()
	ps.groups[p], ps.streams[p], ps.trans[p] = nil, nil, nil
	h.parts.Store(ps)
	old.streams[p].Close()
	old.trans[p].Close()
	err := old.groups[p].Shutdown()
	h.cfg.Trees.Remove(uint16(p))
	if err != nil && !errors.Is(err, raft.ErrRaftShutdown) {
		h.cfg.Logger.Warn("partition group shutdown", "partition", p, "err", err)
	}
	return h.dropData(p)
}

// dropData deletes partition p's data on this node (its group is closed):
// tasks, indexes, Raft log and snapshots. A failure leaves p pending, and
// the next placement pass (every reconcile pass) tries again, so a
// replica handed over is never left behind.
func (h *Host) dropData(p int) error {
	if h.dropPending == nil {
		h.dropPending = map[int]bool{}
	}
	h.dropPending[p] = true
	if err := h.cfg.Store.DropPartition(uint16(p)); err != nil {
		return err
	}
	if err := os.RemoveAll(h.snapshotDir(p)); err != nil {
		return fmt.Errorf("node: snapshots of partition %d: %w", p, err)
	}
	delete(h.dropPending, p)
	h.cfg.Logger.Info("partition handed over; its replica is dropped", "partition", p)
	return nil
}

func (h *Host) snapshotDir(p int) string {
	return filepath.Join(h.cfg.DataDir, "raft", fmt.Sprintf("p%04d", p))
}

// clone copies the set for a change (readers keep the one they loaded).
func (ps *partitions) clone() *partitions {
	return &partitions{groups: slices.Clone(ps.groups), streams: slices.Clone(ps.streams), trans: slices.Clone(ps.trans)}
}

// stopGroups shuts the groups down in the safe order: unregister each from
// the mux (no new connection reaches it), close its transport, shut the
// group down. Dropping a partition's data (rebalancing) comes after.
func (h *Host) stopGroups(ps *partitions) error {
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
			h.cfg.Trees.Remove(uint16(p))
		}
	}
	return errors.Join(errs...)
}
