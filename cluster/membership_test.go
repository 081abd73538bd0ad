package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func startMember(t *testing.T, id string) *Membership {
	t.Helper()
	m, err := StartMembership(MembershipConfig{
		Meta:     NodeMeta{ID: id, APIAddr: "127.0.0.1:1" + id[1:], RaftAddr: "127.0.0.1:2" + id[1:], Version: "test"},
		BindAddr: "127.0.0.1:0",
		tune: func(c *memberlist.Config) {
			c.ProbeInterval = 100 * time.Millisecond
			c.ProbeTimeout = 50 * time.Millisecond
			c.GossipInterval = 20 * time.Millisecond
			c.SuspicionMult = 2
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown() })
	return m
}

// waitFor waits (on Changed signals, with a deadline) until cond holds for
// m's member list.
func waitFor(t *testing.T, m *Membership, what string, cond func([]Member) bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for !cond(m.Members()) {
		select {
		case <-m.Changed():
		case <-time.After(100 * time.Millisecond): // state can change without a signal to us: re-check
		case <-deadline:
			t.Fatalf("%s: not within 20s; members %+v", what, m.Members())
		}
	}
}

func stateOf(ms []Member, id string) (Member, bool) {
	for _, m := range ms {
		if m.ID == id {
			return m, true
		}
	}
	return Member{}, false
}

// Three nodes find each other through one seed, see each other's metadata,
// see a metadata update, a node that leaves, and one that dies.
func TestMembership(t *testing.T) {
	n1, n2, n3 := startMember(t, "n1"), startMember(t, "n2"), startMember(t, "n3")
	for _, m := range []*Membership{n2, n3} {
		if _, err := m.Join([]string{n1.Addr()}); err != nil {
			t.Fatal(err)
		}
	}
	all := []*Membership{n1, n2, n3}
	for _, m := range all {
		waitFor(t, m, "all three alive", func(ms []Member) bool {
			if len(ms) != 3 {
				return false
			}
			for i, mb := range ms {
				id := fmt.Sprint("n", i+1)
				if mb.ID != id || mb.State != StateAlive || mb.APIAddr != "127.0.0.1:1"+id[1:] || mb.RaftAddr != "127.0.0.1:2"+id[1:] {
					return false
				}
			}
			return true
		})
	}

	if err := n2.UpdateMeta(func(m *NodeMeta) { m.RingEpoch = 7 }, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		waitFor(t, m, "n2's new epoch", func(ms []Member) bool {
			mb, ok := stateOf(ms, "n2")
			return ok && mb.RingEpoch == 7
		})
	}
	if err := n2.UpdateMeta(func(m *NodeMeta) { m.ID = "other" }, time.Second); err == nil {
		t.Fatal("UpdateMeta changed the node id")
	}

	if err := n3.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, n1, "n3 left", func(ms []Member) bool {
		mb, ok := stateOf(ms, "n3")
		return ok && mb.State == StateLeft
	})

	n2.Shutdown() // no goodbye: n1 must find out by itself
	waitFor(t, n1, "n2 dead", func(ms []Member) bool {
		mb, ok := stateOf(ms, "n2")
		return ok && mb.State == StateDead
	})
}

func TestMembershipConfigErrors(t *testing.T) {
	for _, cfg := range []MembershipConfig{
		{BindAddr: "127.0.0.1:0"},                                                               // no id
		{Meta: NodeMeta{ID: "n1"}, BindAddr: "127.0.0.1"},                                       // no port
		{Meta: NodeMeta{ID: "n1"}, BindAddr: "127.0.0.1:99999"},                                 // bad port
		{Meta: NodeMeta{ID: "n1", Version: string(make([]byte, 600))}, BindAddr: "127.0.0.1:0"}, // meta too large
	} {
		if m, err := StartMembership(cfg); err == nil {
			m.Shutdown()
			t.Errorf("StartMembership(%+v) succeeded", cfg)
		}
	}
}
