package server

import (
	"testing"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/cluster"
)

// TestPeerAllowed: a peer call is admitted from a node of this cluster
// only. A caller whose node id comes from its TLS certificate is that
// node wherever it calls from (on Kubernetes its API address is a DNS
// name no check resolves); over cleartext the caller must call from the
// host of one of the node's addresses.
func TestPeerAllowed(t *testing.T) {
	ring := &cluster.Ring{ClusterID: "c1", Nodes: []cluster.RingNode{
		{ID: "n1", APIAddr: "10.0.0.1:7400", RaftAddr: "10.0.0.1:7401", GossipAddr: "10.0.0.1:7402"},
		// As deploy/k8s advertises it: a DNS name for the API, the pod IP
		// for Raft and gossip.
		{ID: "n2", APIAddr: "norn-1.norn.ns.svc:7400", RaftAddr: "10.0.0.2:7401", GossipAddr: "10.0.0.2:7402"},
	}}
	members := []cluster.Member{
		{NodeMeta: cluster.NodeMeta{ID: "n3", APIAddr: "10.0.0.3:7400", RaftAddr: "10.0.0.3:7401"}},
		{NodeMeta: cluster.NodeMeta{ID: "n4", APIAddr: "10.0.0.4:7400", RaftAddr: "10.0.0.4:7401", ClusterID: "c2"}},
	}
	for _, tc := range []struct {
		name                string
		ring                *cluster.Ring
		addr, id, clusterID string
		verified            bool
		ok                  bool
	}{
		{"a ring node from its API host", ring, "10.0.0.1:50000", "n1", "c1", false, true},
		{"a ring node from its Raft host", ring, "10.0.0.2:50000", "n2", "c1", false, true},
		{"a ring node named by a DNS API address, unverified, from another host", ring, "10.0.0.9:50000", "n2", "c1", false, false},
		{"a ring node from another node's host, unverified", ring, "10.0.0.1:50000", "n2", "", false, false},
		{"a ring node verified by its certificate, from any host", ring, "10.0.0.9:50000", "n2", "c1", true, true},
		{"a verified node of another cluster", ring, "10.0.0.2:50000", "n2", "c2", true, false},
		{"a verified name that is no node", ring, "10.0.0.9:50000", "n9", "c1", true, false},
		{"no node id", ring, "10.0.0.1:50000", "", "c1", true, false},
		{"an address that is not an IP", ring, "somewhere:50000", "n1", "c1", true, false},
		{"a gossip member without a cluster", ring, "10.0.0.3:50000", "n3", "", false, true},
		{"a gossip member of another cluster", ring, "10.0.0.4:50000", "n4", "", false, false},
		{"before the ring, a gossip member", nil, "10.0.0.4:50000", "n4", "", false, true},
		{"before the ring, a gossip member from another host", nil, "10.0.0.5:50000", "n4", "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := peerAllowed(tc.ring, func() []cluster.Member { return members }, tc.addr, tc.id, tc.clusterID, tc.verified)
			if tc.ok != (err == nil) {
				t.Fatalf("admitted: %v (%v), want %v", err == nil, err, tc.ok)
			}
			if err != nil && connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Fatalf("code %v, want PERMISSION_DENIED", connect.CodeOf(err))
			}
		})
	}
}

// The ring vouches for its nodes without gossip's member list, which is
// a sorted copy made on each call: a peer call does not pay for it.
func TestPeerAllowedAsksMembersOnlyBeyondTheRing(t *testing.T) {
	r := &cluster.Ring{ClusterID: "c1", Nodes: []cluster.RingNode{{ID: "n1", APIAddr: "10.0.0.1:7400"}}}
	asked := 0
	members := func() []cluster.Member { asked++; return nil }
	if err := peerAllowed(r, members, "10.0.0.1:50000", "n1", "c1", false); err != nil || asked != 0 {
		t.Fatalf("a ring node: err %v, members asked %d times, want nil and 0", err, asked)
	}
	if err := peerAllowed(r, members, "10.0.0.9:50000", "n9", "c1", false); err == nil || asked != 1 {
		t.Fatalf("an unknown node: err %v, members asked %d times, want an error and 1", err, asked)
	}
}
