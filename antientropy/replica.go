package antientropy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// Request bounds, enforced on both sides.
const (
	MaxRootsPartitions = 1 << 16
	MaxNodesPerCall    = 1 << 16
	MaxLeavesPerCall   = 4096
	// MaxStatesPerCall bounds the states one Read or Replicate carries
	// (PeerService's own limits are 1,000 ids per Read and 10,000 states
	// per Replicate).
	MaxStatesPerCall = 1000
)

// ErrNotReplicated is returned for a partition this replica does not hold.
var ErrNotReplicated = errors.New("antientropy: partition not replicated here")

// ErrTreeSize is returned when two replicas' trees differ in size.
var ErrTreeSize = errors.New("antientropy: tree sizes differ")

// Replica is one node's side of anti-entropy: a tree per partition it
// replicates, kept current by the store (storage.TrackDigests), and the
// answers to a peer's TreeRoots, TreeNodes and SegmentEntries.
type Replica struct {
	store    *storage.Store
	leafBits int
	// horizon returns this node's retention horizon (Unix ms): now minus
	// the retention.
	horizon func() int64
	// queueHorizons returns this node's horizons of the queues with a
	// retention of their own, and its queue settings' version.
	queueHorizons func() (map[string]int64, uint64)
	// expire deletes partition p's terminal tasks past their queue's
	// horizon (and whatever else the node ties to that, such as the
	// claim FSM's records). Default: the store's DeleteExpired.
	expire func(p uint16, h storage.Horizons) error
	// merge joins states of partition p into the store.
	merge func(p uint16, tasks []*crdt.Task) error

	mu    sync.RWMutex
	trees map[uint16]*Tree
}

// ReplicaConfig configures a Replica.
type ReplicaConfig struct {
	Store *storage.Store
	// LeafBits sizes every tree (DefaultLeafBits when 0). Every node of a
	// cluster must use the same.
	LeafBits int
	// Horizon returns the node's retention horizon (Unix ms): terminal
	// tasks older than it count as deleted. Required.
	Horizon func() int64
	// QueueHorizons returns the node's horizons (Unix ms) of the queues
	// with a retention of their own, and the version of the queue
	// settings they come from; nil: none.
	QueueHorizons func() (map[string]int64, uint64)
	// Expire deletes partition p's terminal tasks past their queue's
	// horizon in h; nil uses storage.Store.DeleteExpired.
	Expire func(p uint16, h storage.Horizons) error
	// Merge joins pulled states of partition p into this replica; nil
	// uses storage.Store.MergeTasks. The node also reacts to what arrives
	// (a terminal event ends a claim on the leader).
	Merge func(p uint16, tasks []*crdt.Task) error
}

// NewReplica returns a Replica with no partitions.
func NewReplica(cfg ReplicaConfig) (*Replica, error) {
	if cfg.Store == nil || cfg.Horizon == nil {
		return nil, errors.New("antientropy: ReplicaConfig.Store and Horizon are required")
	}
	if cfg.LeafBits == 0 {
		cfg.LeafBits = DefaultLeafBits
	}
	if cfg.LeafBits < MinLeafBits || cfg.LeafBits > MaxLeafBits {
		return nil, fmt.Errorf("antientropy: LeafBits %d: want %d to %d", cfg.LeafBits, MinLeafBits, MaxLeafBits)
	}
	r := &Replica{store: cfg.Store, leafBits: cfg.LeafBits, horizon: cfg.Horizon, queueHorizons: cfg.QueueHorizons,
		expire: cfg.Expire, merge: cfg.Merge, trees: make(map[uint16]*Tree)}
	if r.queueHorizons == nil {
		r.queueHorizons = func() (map[string]int64, uint64) { return nil, 0 }
	}
	if r.expire == nil {
		r.expire = func(p uint16, h storage.Horizons) error {
			_, err := cfg.Store.DeleteExpired(p, h, 1000, nil)
			return err
		}
	}
	if r.merge == nil {
		r.merge = func(p uint16, tasks []*crdt.Task) error {
			items := make([]storage.MergeItem, len(tasks))
			for i, t := range tasks {
				items[i] = storage.MergeItem{Partition: p, Task: t}
			}
			_, err := cfg.Store.MergeTasks(items)
			return err
		}
	}
	return r, nil
}

// LeafBits returns the size of the replica's trees.
func (r *Replica) LeafBits() int { return r.leafBits }

// Add starts partition p's tree: it is built from the store's segment
// index (writes wait meanwhile) and then follows every write. Adding a
// partition twice rebuilds its tree.
func (r *Replica) Add(p uint16) error {
	t, err := NewTree(r.leafBits)
	if err != nil {
		return err
	}
	if err := r.store.TrackDigests(p, t); err != nil {
		return err
	}
	r.mu.Lock()
	r.trees[p] = t
	r.mu.Unlock()
	return nil
}

// Remove stops partition p's tree (before the partition is dropped).
func (r *Replica) Remove(p uint16) {
	r.store.UntrackDigests(p)
	r.mu.Lock()
	delete(r.trees, p)
	r.mu.Unlock()
}

// Tree returns partition p's tree, nil when not replicated here.
func (r *Replica) Tree(p uint16) *Tree {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.trees[p]
}

// Partitions returns the number of trees and the memory their nodes take.
func (r *Replica) Partitions() (n, bytes int) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, t := range r.trees {
		n++
		bytes += t.Bytes()
	}
	return n, bytes
}

func (r *Replica) tree(p uint32) (*Tree, error) {
	if p >= 1<<16 {
		return nil, fmt.Errorf("partition %d: %w", p, ErrNotReplicated)
	}
	t := r.Tree(uint16(p))
	if t == nil {
		return nil, fmt.Errorf("partition %d: %w", p, ErrNotReplicated)
	}
	return t, nil
}

// ErrQueuesVersion is returned when two replicas that must agree on
// their queue settings (a queue has a retention of its own) hold
// different versions of them. The round is skipped; gossip brings the
// newer table within seconds.
var ErrQueuesVersion = errors.New("antientropy: queue settings versions differ")

// horizons returns this node's horizons and queue settings version.
func (r *Replica) horizons() (storage.Horizons, uint64) {
	q, v := r.queueHorizons()
	return storage.Horizons{Default: r.horizon(), Queues: q}, v
}

// agree applies the later of the caller's horizons and this node's to
// the partitions: it deletes their terminal tasks past them. It returns
// the horizons used. Per-queue horizons need both sides on one version
// of the queue settings (theirsVersion; ErrQueuesVersion otherwise).
func (r *Replica) agree(parts []uint16, theirs storage.Horizons, theirsVersion uint64) (storage.Horizons, error) {
	mine, v := r.horizons()
	if (len(mine.Queues) > 0 || len(theirs.Queues) > 0) && v != theirsVersion {
		return storage.Horizons{}, fmt.Errorf("queues_version: %d, this node's %d: %w", theirsVersion, v, ErrQueuesVersion)
	}
	h := mine.Later(theirs)
	for _, p := range parts {
		if err := r.expire(p, h); err != nil {
			return storage.Horizons{}, fmt.Errorf("partition %d: expiring before %+v: %w", p, h, err)
		}
	}
	return h, nil
}

// ServeTreeRoots answers PeerService.TreeRoots.
func (r *Replica) ServeTreeRoots(req *nornv1.TreeRootsRequest) (*nornv1.TreeRootsResponse, error) {
	if n := len(req.Partitions); n == 0 || n > MaxRootsPartitions {
		return nil, fmt.Errorf("partitions: %d given, want 1 to %d", n, MaxRootsPartitions)
	}
	if req.LeafBits != uint32(r.leafBits) {
		return nil, fmt.Errorf("leaf_bits: %d, this node's trees have %d: %w", req.LeafBits, r.leafBits, ErrTreeSize)
	}
	parts := make([]uint16, len(req.Partitions))
	trees := make([]*Tree, len(req.Partitions))
	seen := make(map[uint32]bool, len(parts))
	for i, p := range req.Partitions {
		if seen[p] {
			return nil, fmt.Errorf("partitions[%d]: %d repeated", i, p)
		}
		seen[p] = true
		t, err := r.tree(p)
		if err != nil {
			return nil, fmt.Errorf("partitions[%d]: %w", i, err)
		}
		parts[i], trees[i] = uint16(p), t
	}
	h, err := r.agree(parts, storage.Horizons{Default: req.DeleteHorizonMs, Queues: req.QueueDeleteHorizonsMs}, req.QueuesVersion)
	if err != nil {
		return nil, err
	}
	resp := &nornv1.TreeRootsResponse{DeleteHorizonMs: h.Default, QueueDeleteHorizonsMs: h.Queues, Roots: make([]uint64, len(parts))}
	for i, t := range trees {
		resp.Roots[i] = t.Root()
	}
	return resp, nil
}

// ServeTreeNodes answers PeerService.TreeNodes.
func (r *Replica) ServeTreeNodes(req *nornv1.TreeNodesRequest) (*nornv1.TreeNodesResponse, error) {
	t, err := r.tree(req.Partition)
	if err != nil {
		return nil, fmt.Errorf("partition: %w", err)
	}
	if n := len(req.Nodes); n == 0 || n > MaxNodesPerCall {
		return nil, fmt.Errorf("nodes: %d given, want 1 to %d", n, MaxNodesPerCall)
	}
	if req.Level >= uint32(t.Levels()) {
		return nil, fmt.Errorf("level: %d, the tree has %d levels", req.Level, t.Levels())
	}
	hashes, err := t.Nodes(int(req.Level), req.Nodes)
	if err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}
	return &nornv1.TreeNodesResponse{Hashes: hashes}, nil
}

// ServeSegmentEntries answers PeerService.SegmentEntries.
func (r *Replica) ServeSegmentEntries(req *nornv1.SegmentEntriesRequest) (*nornv1.SegmentEntriesResponse, error) {
	t, err := r.tree(req.Partition)
	if err != nil {
		return nil, fmt.Errorf("partition: %w", err)
	}
	if n := len(req.Leaves); n == 0 || n > MaxLeavesPerCall {
		return nil, fmt.Errorf("leaves: %d given, want 1 to %d", n, MaxLeavesPerCall)
	}
	resp := &nornv1.SegmentEntriesResponse{}
	for i, leaf := range req.Leaves {
		if int(leaf) >= t.Width(t.Levels()-1) {
			return nil, fmt.Errorf("leaves[%d]: %d, the tree has %d leaves", i, leaf, t.Width(t.Levels()-1))
		}
	}
	err = r.entries(uint16(req.Partition), t, req.Leaves, func(e storage.SegmentEntry) {
		resp.Ids = append(resp.Ids, e.ID)
		resp.Digests = append(resp.Digests, e.Digest)
	})
	return resp, err
}

// entries calls fn for every stored task under the leaves.
func (r *Replica) entries(p uint16, t *Tree, leaves []uint32, fn func(storage.SegmentEntry)) error {
	sorted := slices.Clone(leaves)
	slices.Sort(sorted)
	var ranges []storage.SegmentRange
	for _, leaf := range sorted {
		lo, hi := t.Segments(leaf)
		if n := len(ranges); n > 0 && ranges[n-1].Hi >= lo {
			ranges[n-1].Hi = max(ranges[n-1].Hi, hi)
			continue
		}
		ranges = append(ranges, storage.SegmentRange{Lo: lo, Hi: hi})
	}
	return r.store.ScanSegmentRanges(p, ranges, func(_ uint16, e storage.SegmentEntry) error {
		fn(e)
		return nil
	})
}

// localEntries returns the stored (id -> digest) under the leaves.
func (r *Replica) localEntries(p uint16, t *Tree, leaves []uint32) (map[uint64]uint64, error) {
	m := map[uint64]uint64{}
	err := r.entries(p, t, leaves, func(e storage.SegmentEntry) { m[e.ID] = e.Digest })
	return m, err
}

// states returns this replica's states of ids in partition p, skipping
// the ids it does not store.
func (r *Replica) states(p uint16, ids []uint64) ([]*crdt.Task, error) {
	var out []*crdt.Task
	for _, id := range ids {
		t, err := r.store.TaskState(p, id)
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// ctxErr is a small helper for loops that should stop when ctx ends.
func ctxErr(ctx context.Context) error { return context.Cause(ctx) }
