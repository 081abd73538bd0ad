package replicas

import (
	"fmt"
	"time"

	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/transport"
)

// A node's addresses follow it (docs/rfcs/2026-11-26-node-addresses.md):
// a node that comes back with its id and data dir at other addresses
// gossips the new ones; then
//
//  1. the meta leader checks them (cluster.AddressUpdates; with TLS, the
//     certificate at the new Raft address must name the node, and none
//     may answer as the node at its old one) and proposes a ring with
//     them (recordAddresses);
//  2. every node adopts that ring; coordinators, anti-entropy, forwards
//     and PeerService checks read addresses from the ring, and peer
//     clients are kept by address, so new calls go to the new ones;
//  3. the leader of each group (every partition group, and the meta
//     group) rewrites the node's address in the group's configuration
//     once the ring and gossip agree on it (fixGroupAddresses,
//     fixMetaAddresses): the leader replicates to the new address from
//     then on, and the node catches up.

// probeTimeout bounds one TLS probe of a node's Raft port.
const probeTimeout = 2 * time.Second

// followAddresses starts, in the background and one at a time each, the
// meta leader's recording of moved nodes' addresses and the groups'
// configuration updates. The reconcile loop calls it on every pass.
func (h *Host) followAddresses(members []cluster.Member) {
	if h.meta.IsLeader() && h.recording.CompareAndSwap(false, true) {
		h.stopped.Add(1)
		go func() {
			defer h.stopped.Done()
			defer h.recording.Store(false)
			h.recordAddresses(members)
		}()
	}
	if r := h.ring.Load(); r != nil && h.fixing.CompareAndSwap(false, true) {
		h.stopped.Add(1)
		go func() {
			defer h.stopped.Done()
			defer h.fixing.Store(false)
			h.fixGroupAddresses(r, members)
		}()
	}
}

// recordAddresses (meta leader) proposes a ring with the addresses of the
// ring's nodes that gossip shows elsewhere and pass the checks, and one
// with the incarnations of the nodes a ring from before incarnations
// lists without one (cluster.IncarnationsToRecord), then brings the meta
// group's configuration in line with the ring.
func (h *Host) recordAddresses(members []cluster.Member) {
	if err := h.meta.LeaderReady(ProposeTimeout); err != nil {
		return
	}
	r := h.meta.Ring()
	if r == nil {
		return
	}
	updates, refused := cluster.AddressUpdates(r, members)
	for _, rf := range refused {
		h.noteRefusal(rf.ID, rf.Reason)
	}
	var ok []cluster.AddressUpdate
	for _, u := range updates {
		if err := h.checkMoved(u); err != nil {
			h.noteRefusal(u.Node.ID, err.Error())
			continue
		}
		ok = append(ok, u)
	}
	if len(ok) > 0 {
		if err := h.meta.ProposeRing(r.WithAddresses(ok), ProposeTimeout); err != nil {
			// A stale epoch (another ring change won): the next pass
			// compares again with the new ring.
			h.cfg.Logger.Info("recording new node addresses in the ring failed; retrying", "err", err)
			return
		}
		for _, u := range ok {
			delete(h.refusals, u.Node.ID)
			h.cfg.Logger.Info("a node is back at other addresses; the ring records them",
				"node", u.Node.ID, "raft", u.Node.RaftAddr, "api", u.Node.APIAddr, "gossip", u.Node.GossipAddr,
				"old_raft", u.Old.RaftAddr, "old_api", u.Old.APIAddr, "old_gossip", u.Old.GossipAddr)
		}
		r = h.meta.Ring()
	}
	if inc := cluster.IncarnationsToRecord(r, members); inc != nil {
		if err := h.meta.ProposeRing(r.WithIncarnations(inc), ProposeTimeout); err != nil {
			h.cfg.Logger.Info("recording nodes' incarnations in the ring failed; retrying", "err", err)
			return
		}
		h.cfg.Logger.Info("the ring records the incarnations of nodes it listed without one", "nodes", len(inc))
		r = h.meta.Ring()
	}
	h.fixMetaAddresses(r, members)
}

// noteRefusal logs, once per node and reason, that a node's new addresses
// were not taken (recordAddresses' goroutine only).
func (h *Host) noteRefusal(id, reason string) {
	if h.refusals == nil {
		h.refusals = map[string]string{}
	}
	if h.refusals[id] == reason {
		return
	}
	h.refusals[id] = reason
	h.cfg.Logger.Warn("a node gossips other addresses than the ring's; not taking them", "node", id, "reason", reason)
}

// checkMoved is what recordAddresses checks beyond the pure rule: with
// TLS, the certificate at the node's new Raft address must name it, and
// nothing may answer as the node at its old one (one id, two live
// processes). Without TLS there is no identity to check (see the RFC).
// This node's own new addresses need no check.
func (h *Host) checkMoved(u cluster.AddressUpdate) error {
	if h.cfg.TLS == nil || u.Node.ID == h.cfg.NodeID {
		return nil
	}
	local := h.mux.DialFrom()
	if err := transport.ProbeNode(u.Node.RaftAddr, u.Node.ID, local, h.cfg.TLS, probeTimeout); err != nil {
		return fmt.Errorf("its new Raft address %s does not present its certificate: %w", u.Node.RaftAddr, err)
	}
	if u.Old.RaftAddr != u.Node.RaftAddr {
		if err := transport.ProbeNode(u.Old.RaftAddr, u.Node.ID, local, h.cfg.TLS, probeTimeout); err == nil {
			return fmt.Errorf("it answers at its old Raft address %s too", u.Old.RaftAddr)
		}
	}
	return nil
}

// wantAddress returns the Raft address server id should have in a group's
// configuration: the ring's, when gossip shows the node up at that very
// address (so a leader whose ring is older than gossip never turns an
// address back); "" when there is nothing to change to.
func wantAddress(r *cluster.Ring, up map[string]string, id string) string {
	nd, ok := r.Node(id)
	if !ok || nd.RaftAddr == "" || up[id] != nd.RaftAddr {
		return ""
	}
	return nd.RaftAddr
}

// upRaftAddrs maps the ids of the members gossip shows up to their Raft
// addresses (this node to its own).
func (h *Host) upRaftAddrs(members []cluster.Member) map[string]string {
	up := map[string]string{h.cfg.NodeID: h.raftAddr}
	for _, m := range members {
		if m.State.Up() && m.ID != h.cfg.NodeID {
			up[m.ID] = m.RaftAddr
		}
	}
	return up
}

// fixMetaAddresses (meta leader) rewrites the address of every server of
// the meta group whose address differs from the ring's.
func (h *Host) fixMetaAddresses(r *cluster.Ring, members []cluster.Member) {
	servers, err := h.meta.Servers()
	if err != nil || r == nil {
		return
	}
	up := h.upRaftAddrs(members)
	for _, s := range servers {
		addr := wantAddress(r, up, string(s.ID))
		if addr == "" || addr == string(s.Address) {
			continue
		}
		if err := h.meta.UpdateAddress(string(s.ID), addr, ProposeTimeout); err != nil {
			h.cfg.Logger.Warn("updating a node's address in the meta group failed; retrying", "node", s.ID, "raft", addr, "err", err)
			return
		}
		h.cfg.Logger.Info("meta group: node's Raft address updated", "node", s.ID, "raft", addr, "old", s.Address)
	}
}

// fixGroupAddresses rewrites, in every partition group this node leads,
// the address of each server whose address differs from the ring's.
func (h *Host) fixGroupAddresses(r *cluster.Ring, members []cluster.Member) {
	up := h.upRaftAddrs(members)
	updated := map[string]int{}
	for p, g := range h.Groups() {
		if g == nil || !g.IsLeader() {
			continue
		}
		select {
		case <-h.stop:
			return
		default:
		}
		h.fixGroup(p, g, r, up, updated)
	}
	for id, n := range updated {
		h.cfg.Logger.Info("partition groups this node leads: node's Raft address updated", "node", id, "raft", up[id], "groups", n)
	}
}

// fixGroup rewrites the addresses in partition p's group g (led here)
// that differ from the ring's, counting them by node in updated.
func (h *Host) fixGroup(p int, g *claims.Group, r *cluster.Ring, up map[string]string, updated map[string]int) {
	servers, err := g.Servers()
	if err != nil {
		return
	}
	for _, s := range servers {
		addr := wantAddress(r, up, s.ID)
		if addr == "" || addr == s.Address {
			continue
		}
		if err := g.UpdateAddress(s.ID, addr, ProposeTimeout); err != nil {
			h.cfg.Logger.Warn("updating a node's address in a partition group failed; retrying", "partition", p, "node", s.ID, "raft", addr, "err", err)
			return
		}
		updated[s.ID]++
		h.cfg.Logger.Debug("partition group: node's Raft address updated", "partition", p, "node", s.ID, "raft", addr, "old", s.Address)
	}
}
