package replicas

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/transport"
)

// The queue settings this node applies (cluster.Queues): the meta
// group's voters adopt every table their replica applies; the other
// nodes pull the table of a member that gossips a newer version
// (reconcileQueues), and a SetQueue's coordinator pushes it to every live
// node (PushQueues). Each node keeps the last table in its data dir, so a
// restarted node applies a pause before it hears from anyone, and gossips
// its version.

// queueTable is the Host's copy of the table.
type queueTable struct {
	mu        sync.Mutex // serializes adoptions (their file writes)
	cur       atomic.Pointer[cluster.Queues]
	announced atomic.Uint64 // version gossiped
	pulling   atomic.Bool
}

// Queues returns the queue settings this node applies (nil before any).
// The caller must not modify them.
func (h *Host) Queues() *cluster.Queues { return h.queues.cur.Load() }

// loadQueues adopts the table kept in the data dir (a restart).
func (h *Host) loadQueues() error {
	q, err := cluster.LoadQueues(h.cfg.DataDir)
	if err != nil || q == nil {
		return err
	}
	return h.AdoptQueues(q)
}

// AdoptQueues makes q this node's table if it is newer than the current
// one and of this node's cluster: it keeps it in the data dir first, then
// applies it and tells Config.OnQueues.
func (h *Host) AdoptQueues(q *cluster.Queues) error {
	h.queues.mu.Lock()
	defer h.queues.mu.Unlock()
	cur := h.queues.cur.Load()
	if q.Version <= cur.VersionOf() {
		return nil
	}
	if r := h.ring.Load(); r != nil && q.ClusterID != r.ClusterID {
		return fmt.Errorf("replicas: queue settings of cluster %s in cluster %s", q.ClusterID, r.ClusterID)
	}
	if err := cluster.SaveQueues(h.cfg.DataDir, q); err != nil {
		return fmt.Errorf("replicas: keep the queue settings: %w", err)
	}
	h.queues.cur.Store(q)
	if h.cfg.OnQueues != nil {
		h.cfg.OnQueues()
	}
	h.KickReconcile() // gossip the new version
	return nil
}

// reconcileQueues (the reconcile loop) adopts the meta replica's table,
// pulls a newer one a member gossips, in the background, and gossips
// this node's version when it changed.
func (h *Host) reconcileQueues(r *cluster.Ring, members []cluster.Member) {
	if q := h.meta.Queues(); q != nil {
		if err := h.AdoptQueues(q); err != nil {
			h.cfg.Logger.Error("cannot keep the meta group's queue settings", "err", err)
		}
	}
	have := h.Queues().VersionOf()
	var from []string
	for _, m := range members {
		if m.ID != h.cfg.NodeID && m.State.Up() && m.QueuesVersion > have && m.ClusterID == r.ClusterID {
			from = append(from, m.APIAddr)
		}
	}
	if len(from) > 0 && h.queues.pulling.CompareAndSwap(false, true) {
		h.stopped.Add(1)
		go func() {
			defer h.stopped.Done()
			defer h.queues.pulling.Store(false)
			for _, addr := range from {
				if err := h.PullQueues(addr); err != nil {
					h.cfg.Logger.Warn("pulling the queue settings failed", "from", addr, "err", err)
					continue
				}
				if h.Queues().VersionOf() > have {
					return
				}
			}
		}()
	}
	if v := h.Queues().VersionOf(); v != h.queues.announced.Load() {
		err := h.members.UpdateMeta(func(m *cluster.NodeMeta) { m.QueuesVersion = v }, time.Second)
		if err == nil {
			h.queues.announced.Store(v)
		}
	}
}

// PullQueues fetches the queue settings of the node at addr and adopts
// them when newer.
func (h *Host) PullQueues(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := h.cfg.Peers.Get(addr).Peer.GetRing(ctx, transport.Request(h.cfg.Peers, &nornv1.GetRingRequest{}))
	if err != nil {
		return err
	}
	q, err := DecodeQueues(resp.Msg.GetQueues())
	if err != nil || q == nil {
		return err
	}
	return h.AdoptQueues(q)
}

// DecodeQueues reads a table as PeerService.GetRing carries it (nil for
// none).
func DecodeQueues(b []byte) (*cluster.Queues, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var q cluster.Queues
	if err := json.Unmarshal(b, &q); err != nil {
		return nil, fmt.Errorf("replicas: queue settings: %w", err)
	}
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return &q, nil
}
