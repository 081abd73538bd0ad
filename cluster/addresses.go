package cluster

import (
	"fmt"
	"net"
	"slices"
	"strings"
)

// A node that comes back with the same id and data dir but other
// addresses (a Kubernetes pod rescheduled with a new IP) gossips its new
// ones; the meta leader then records them in the ring (AddressUpdates,
// WithAddresses), and every partition group's leader updates the group's
// configuration from the ring. docs/rfcs/2026-11-26-node-addresses.md has
// the design and what is checked before an id's addresses move.

// AddressUpdate is a ring node whose gossip shows other addresses than
// the ring records: Node carries the new ones.
type AddressUpdate struct {
	Node RingNode // the ring's record with the addresses gossip shows
	Old  RingNode // the ring's record as it is
}

// AddressRefusal is a ring node whose gossip shows other addresses that
// may not go into the ring (yet), and why.
type AddressRefusal struct {
	ID     string
	Reason string
}

// AddressUpdates compares the ring's nodes with the members gossip shows
// and returns the nodes whose addresses should follow gossip, and those
// whose new addresses are refused, with the reason. It is the rule the
// meta leader applies; pure, so it is tested on its own. A member's
// addresses go into the ring when:
//
//   - it is a node of the ring (an id the ring does not know joins through
//     AdminService.Join instead);
//   - gossip sees it alive (not suspect: memberlist gave it the name at its
//     new address only once the old one left, or was dead long enough to
//     be reclaimed; see MembershipConfig.DeadNodeReclaim);
//   - it gossips this ring's cluster id, which it only has from the ring
//     kept in its data dir or pulled from the cluster (a node of another
//     cluster, or one without a cluster, is refused);
//   - its API, Raft and gossip addresses are host:port, and the Raft and
//     gossip ones IP addresses (the Raft listener admits peers by IP);
//   - no other node of the ring that gossip shows up is at its new Raft or
//     gossip address (two live nodes at one address is a conflict, not a
//     move; an address a down node had may be taken over: IPs are reused).
//
// The caller checks the rest (with TLS: that the certificate presented at
// the new Raft address names the node).
func AddressUpdates(r *Ring, members []Member) (updates []AddressUpdate, refused []AddressRefusal) {
	if r == nil {
		return nil, nil
	}
	up := map[string]Member{}
	for _, m := range members {
		if m.State.Up() {
			up[m.ID] = m
		}
	}
	for _, m := range members {
		old, ok := r.Node(m.ID)
		if !ok || !m.State.Up() {
			continue
		}
		next := old
		next.APIAddr, next.RaftAddr, next.GossipAddr = m.APIAddr, m.RaftAddr, m.GossipAddr
		if next == old {
			continue
		}
		refuse := func(format string, args ...any) {
			refused = append(refused, AddressRefusal{ID: m.ID, Reason: fmt.Sprintf(format, args...)})
		}
		switch {
		case m.State != StateAlive:
			refuse("gossip suspects it")
			continue
		case m.ClusterID != r.ClusterID:
			refuse("it gossips cluster id %q, the ring's is %q", m.ClusterID, r.ClusterID)
			continue
		}
		if err := checkHostPort(m.APIAddr, false); err != nil {
			refuse("API address: %v", err)
			continue
		}
		if err := checkHostPort(m.RaftAddr, true); err != nil {
			refuse("Raft address: %v", err)
			continue
		}
		if err := checkHostPort(m.GossipAddr, true); err != nil {
			refuse("gossip address: %v", err)
			continue
		}
		if other := holderOf(r, up, m); other != "" {
			refuse("node %s, up, is at the same Raft or gossip address", other)
			continue
		}
		updates = append(updates, AddressUpdate{Node: next, Old: old})
	}
	return updates, refused
}

// holderOf returns another node of the ring, up in gossip, that is at m's
// Raft or gossip address (by the ring or by gossip), "" when none is.
func holderOf(r *Ring, up map[string]Member, m Member) string {
	for _, nd := range r.Nodes {
		if nd.ID == m.ID {
			continue
		}
		o, isUp := up[nd.ID]
		if !isUp {
			continue
		}
		for _, a := range []string{nd.RaftAddr, nd.GossipAddr, o.RaftAddr, o.GossipAddr} {
			if a != "" && (a == m.RaftAddr || a == m.GossipAddr) {
				return nd.ID
			}
		}
	}
	return ""
}

// checkHostPort checks that addr is host:port with a port, and with ipOnly
// that the host is an IP address that is not unspecified (0.0.0.0).
func checkHostPort(addr string, ipOnly bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" || port == "" || port == "0" {
		return fmt.Errorf("%q lacks a host or port", addr)
	}
	if ipOnly {
		ip := net.ParseIP(host)
		if ip == nil || ip.IsUnspecified() {
			return fmt.Errorf("%q is not a specific IP address", addr)
		}
	}
	return nil
}

// WithAddresses returns the next ring (epoch + 1) with the addresses of
// the nodes of updates replaced; nothing else changes.
func (r *Ring) WithAddresses(updates []AddressUpdate) *Ring {
	next := r.Next()
	for _, u := range updates {
		i, ok := slices.BinarySearchFunc(next.Nodes, u.Node.ID, func(n RingNode, id string) int { return strings.Compare(n.ID, id) })
		if ok {
			nd := &next.Nodes[i]
			nd.APIAddr, nd.RaftAddr, nd.GossipAddr = u.Node.APIAddr, u.Node.RaftAddr, u.Node.GossipAddr
		}
	}
	return next
}
