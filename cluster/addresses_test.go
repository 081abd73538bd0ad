package cluster

import (
	"strings"
	"testing"
	"time"
)

// addrRing is a ring of n1..n3 on 127.0.0.1 (ports 71x0..71x2), cluster c1.
func addrRing() *Ring {
	nodes := []RingNode{
		{ID: "n1", APIAddr: "127.0.0.1:7100", RaftAddr: "127.0.0.1:7101", GossipAddr: "127.0.0.1:7102"},
		{ID: "n2", APIAddr: "127.0.0.1:7110", RaftAddr: "127.0.0.1:7111", GossipAddr: "127.0.0.1:7112"},
		{ID: "n3", APIAddr: "127.0.0.1:7120", RaftAddr: "127.0.0.1:7121", GossipAddr: "127.0.0.1:7122"},
	}
	r, err := NewRing(nodes, 8, 3)
	if err != nil {
		panic(err)
	}
	r.ClusterID = "c1"
	return r
}

// asMembers is the ring's nodes as alive gossip members of its cluster.
func asMembers(r *Ring) []Member {
	var ms []Member
	for _, nd := range r.Nodes {
		ms = append(ms, Member{NodeMeta: NodeMeta{ID: nd.ID, APIAddr: nd.APIAddr, RaftAddr: nd.RaftAddr, ClusterID: r.ClusterID},
			GossipAddr: nd.GossipAddr, State: StateAlive})
	}
	return ms
}

func TestAddressUpdates(t *testing.T) {
	moved := func(m *Member) { // n3 back on 127.0.0.2
		m.APIAddr, m.RaftAddr, m.GossipAddr = "127.0.0.2:7120", "127.0.0.2:7121", "127.0.0.2:7122"
	}
	tests := []struct {
		name   string
		change func(ms []Member) // applied to n1..n3
		update bool              // n3's new addresses are taken
		reason string            // else: a refusal of n3 containing this
	}{
		{name: "nothing moved", change: func([]Member) {}},
		{name: "moved", change: func(ms []Member) { moved(&ms[2]) }, update: true},
		{name: "only the API address (a DNS name) moved", change: func(ms []Member) { ms[2].APIAddr = "norn-2.norn.ns.svc:7400" }, update: true},
		{name: "only the Raft port moved", change: func(ms []Member) { ms[2].RaftAddr = "127.0.0.1:7999" }, update: true},
		{name: "suspect", change: func(ms []Member) { moved(&ms[2]); ms[2].State = StateSuspect }, reason: "suspects"},
		{name: "dead: nothing to take", change: func(ms []Member) { moved(&ms[2]); ms[2].State = StateDead }},
		{name: "left: nothing to take", change: func(ms []Member) { moved(&ms[2]); ms[2].State = StateLeft }},
		{name: "no cluster id (a wiped data dir)", change: func(ms []Member) { moved(&ms[2]); ms[2].ClusterID = "" }, reason: "cluster id"},
		{name: "another cluster", change: func(ms []Member) { moved(&ms[2]); ms[2].ClusterID = "c2" }, reason: "cluster id"},
		{name: "Raft address not an IP", change: func(ms []Member) { moved(&ms[2]); ms[2].RaftAddr = "norn-2:7121" }, reason: "Raft address"},
		{name: "Raft address unspecified", change: func(ms []Member) { moved(&ms[2]); ms[2].RaftAddr = "0.0.0.0:7121" }, reason: "Raft address"},
		{name: "Raft address without port", change: func(ms []Member) { moved(&ms[2]); ms[2].RaftAddr = "127.0.0.2" }, reason: "Raft address"},
		{name: "gossip address garbage", change: func(ms []Member) { moved(&ms[2]); ms[2].GossipAddr = "::::" }, reason: "gossip address"},
		{name: "API address empty", change: func(ms []Member) { moved(&ms[2]); ms[2].APIAddr = "" }, reason: "API address"},
		{name: "at a live node's Raft address", change: func(ms []Member) { moved(&ms[2]); ms[2].RaftAddr = "127.0.0.1:7111" }, reason: "n2, up"},
		{name: "at a live node's gossip address", change: func(ms []Member) { moved(&ms[2]); ms[2].GossipAddr = "127.0.0.1:7102" }, reason: "n1, up"},
		{name: "at a dead node's old address (IP reused)", change: func(ms []Member) {
			moved(&ms[2])
			ms[2].RaftAddr = "127.0.0.1:7111"
			ms[1].State = StateDead
		}, update: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := addrRing()
			ms := asMembers(r)
			tc.change(ms)
			updates, refused := AddressUpdates(r, ms)
			switch {
			case tc.update:
				if len(updates) != 1 || len(refused) != 0 || updates[0].Node.ID != "n3" {
					t.Fatalf("updates %+v, refused %+v; want n3's", updates, refused)
				}
				u := updates[0]
				if u.Node.RaftAddr != ms[2].RaftAddr || u.Node.APIAddr != ms[2].APIAddr || u.Node.GossipAddr != ms[2].GossipAddr {
					t.Fatalf("update %+v, gossip %+v", u.Node, ms[2])
				}
				if old, _ := r.Node("n3"); u.Old != old {
					t.Fatalf("update's old record %+v, ring's %+v", u.Old, old)
				}
			case tc.reason != "":
				if len(updates) != 0 || len(refused) != 1 || refused[0].ID != "n3" || !strings.Contains(refused[0].Reason, tc.reason) {
					t.Fatalf("updates %+v, refused %+v; want n3 refused for %q", updates, refused, tc.reason)
				}
			default:
				if len(updates) != 0 || len(refused) != 0 {
					t.Fatalf("updates %+v, refused %+v; want none", updates, refused)
				}
			}
		})
	}
	// A member the ring does not know is not an address change (it joins).
	r := addrRing()
	stranger := Member{NodeMeta: NodeMeta{ID: "n9", APIAddr: "127.0.0.9:1", RaftAddr: "127.0.0.9:2", ClusterID: "c1"}, GossipAddr: "127.0.0.9:3", State: StateAlive}
	if u, rf := AddressUpdates(r, append(asMembers(r), stranger)); len(u) != 0 || len(rf) != 0 {
		t.Fatalf("a stranger: updates %+v, refused %+v", u, rf)
	}
	if u, rf := AddressUpdates(nil, asMembers(r)); u != nil || rf != nil {
		t.Fatal("no ring: want nothing")
	}
}

func TestRingWithAddresses(t *testing.T) {
	r := addrRing()
	n3, _ := r.Node("n3")
	n3.APIAddr, n3.RaftAddr, n3.GossipAddr, n3.Role = "127.0.0.2:1", "127.0.0.2:2", "127.0.0.2:3", RoleDraining
	next := r.WithAddresses([]AddressUpdate{{Node: n3}})
	if next.Epoch != r.Epoch+1 {
		t.Fatalf("epoch %d after %d", next.Epoch, r.Epoch)
	}
	got, _ := next.Node("n3")
	if got.APIAddr != n3.APIAddr || got.RaftAddr != n3.RaftAddr || got.GossipAddr != n3.GossipAddr || got.Role != RoleMember {
		t.Fatalf("n3 is %+v: want the new addresses and its role kept", got)
	}
	if old, _ := r.Node("n3"); old.RaftAddr != "127.0.0.1:7121" {
		t.Fatalf("the old ring changed: %+v", old)
	}
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
}

// A node whose name is held by a dead member comes back from another
// address only after DeadNodeReclaim; one that left, at once.
func TestMembershipReclaimsNameAtNewAddress(t *testing.T) {
	const reclaim = 1500 * time.Millisecond
	opt := func(c *MembershipConfig) { c.DeadNodeReclaim = reclaim }
	for _, how := range []string{"dead", "left"} {
		t.Run(how, func(t *testing.T) {
			n1, n2 := startMember(t, "n1", opt), startMember(t, "n2", opt)
			join(t, n2, n1)
			waitFor(t, n1, "both alive", func(ms []Member) bool { return sees(ms, "n1", "n2") })
			oldAddr := n2.Addr()
			if how == "left" {
				if err := n2.Leave(time.Second); err != nil {
					t.Fatal(err)
				}
			} else {
				n2.Shutdown()
			}
			want := StateDead
			if how == "left" {
				want = StateLeft
			}
			waitFor(t, n1, "n2 "+how, func(ms []Member) bool { mb, _ := stateOf(ms, "n2"); return mb.State == want })
			gone := time.Now()
			back := startMember(t, "n2", opt, func(c *MembershipConfig) {
				c.BindAddr = "127.0.0.2:0"
				c.Meta.RaftAddr = "127.0.0.2:9"
			})
			if back.Addr() == oldAddr {
				t.Fatalf("restarted at the same address %s", oldAddr)
			}
			// Join until n1 takes it: memberlist refuses it while the
			// dead member's name may not be reclaimed yet. Without
			// DeadNodeReclaim it would only be taken once memberlist
			// forgets the dead member (GossipToTheDeadTime, 15 s here).
			deadline := gone.Add(reclaim + 5*time.Second)
			for {
				back.Join([]string{n1.Addr()}) //nolint:errcheck // retried
				mb, _ := stateOf(n1.Members(), "n2")
				if mb.State == StateAlive && mb.GossipAddr == back.Addr() && mb.RaftAddr == "127.0.0.2:9" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("n2 not taken back at its new address %s within %s of being %s; n1 sees %+v", back.Addr(), reclaim+5*time.Second, how, mb)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if took := time.Since(gone); how == "dead" && took < reclaim-300*time.Millisecond {
				t.Fatalf("a dead member's name was reclaimed after %s, before DeadNodeReclaim %s", took, reclaim)
			}
		})
	}
}
