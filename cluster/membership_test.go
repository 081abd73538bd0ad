package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hashicorp/memberlist"
)

// startMember starts a Membership on loopback with fast failure detection;
// opts adjust its config.
func startMember(t *testing.T, id string, opts ...func(*MembershipConfig)) *Membership {
	t.Helper()
	cfg := MembershipConfig{
		Meta:     NodeMeta{ID: id, APIAddr: "127.0.0.1:1" + id[1:], RaftAddr: "127.0.0.1:2" + id[1:], Version: "test"},
		BindAddr: "127.0.0.1:0",
		tune: func(c *memberlist.Config) {
			c.ProbeInterval = 100 * time.Millisecond
			c.ProbeTimeout = 50 * time.Millisecond
			c.GossipInterval = 20 * time.Millisecond
			c.SuspicionMult = 2
		},
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	m, err := StartMembership(cfg)
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

// eventually polls cond until it holds, failing the test after 20s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
		time.Sleep(10 * time.Millisecond)
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

// join makes m join seed, failing the test if it cannot.
func join(t *testing.T, m, seed *Membership) {
	t.Helper()
	if _, err := m.Join([]string{seed.Addr()}); err != nil {
		t.Fatal(err)
	}
}

// sees reports whether ms lists exactly the nodes ids, all alive.
func sees(ms []Member, ids ...string) bool {
	if len(ms) != len(ids) {
		return false
	}
	for _, id := range ids {
		if mb, ok := stateOf(ms, id); !ok || mb.State != StateAlive {
			return false
		}
	}
	return true
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A node of cluster 7f3a cannot join nodes of cluster 91bc: Join says why,
// naming both ids, neither side lists the other, and the seed logs the
// refusal once however often it is tried. A node with no cluster id yet
// joins them, and news it gossips of a 7f3a node is refused too.
func TestMembershipClusterID(t *testing.T) {
	logs := map[string]*syncBuffer{}
	logTo := func(c *MembershipConfig) {
		logs[c.Meta.ID] = &syncBuffer{}
		c.Logger = hclog.New(&hclog.LoggerOptions{Output: logs[c.Meta.ID], Level: hclog.Trace})
	}
	b1, b2 := startMember(t, "n1", logTo), startMember(t, "n2", logTo)
	join(t, b2, b1)
	// The cluster forms after gossip started: its id comes by UpdateMeta.
	for _, m := range []*Membership{b1, b2} {
		if err := m.UpdateMeta(func(meta *NodeMeta) { meta.ClusterID = "91bc" }, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []*Membership{b1, b2} {
		waitFor(t, m, "cluster 91bc formed", func(ms []Member) bool {
			return sees(ms, "n1", "n2") && ms[0].ClusterID == "91bc" && ms[1].ClusterID == "91bc"
		})
	}

	a := startMember(t, "n4", func(c *MembershipConfig) { c.Meta.ClusterID = "7f3a" })
	for range 2 {
		n, err := a.Join([]string{b1.Addr()})
		if err == nil || n != 0 {
			t.Fatalf("a node of another cluster joined: %d, %v", n, err)
		}
		if !errors.Is(err, ErrOtherCluster) || !strings.Contains(err.Error(), "7f3a") || !strings.Contains(err.Error(), "91bc") {
			t.Fatalf("Join's error does not say that the clusters differ: %v", err)
		}
	}

	c := startMember(t, "n5") // no cluster id yet
	join(t, c, b1)
	for _, m := range []*Membership{b1, b2, c} {
		waitFor(t, m, "n5 joined", func(ms []Member) bool { return sees(ms, "n1", "n2", "n5") })
	}
	// Gossip has run all the while n5 spread: n4 is still on its own.
	if ms := a.Members(); !sees(ms, "n4") {
		t.Errorf("n4 lists %+v", ms)
	}

	// n6 of cluster 7f3a tries n5: n6 refuses n5's list (it holds 91bc
	// nodes), but n5, with no cluster id, takes n6 in and gossips it on.
	// n1 and n2 refuse that news (NotifyAlive), logging it once, and do
	// not pass it on. (With memberlist's local timings n5 sends it to two
	// random nodes, so it may reach only one of them before push/pull.)
	a2 := startMember(t, "n6", func(c *MembershipConfig) { c.Meta.ClusterID = "7f3a" })
	if _, err := a2.Join([]string{c.Addr()}); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("n6 joined n5: %v", err)
	}
	eventually(t, "n1 or n2 hears of n6", func() bool {
		return strings.Contains(logs["n1"].String()+logs["n2"].String(), "node=n6 ")
	})
	for _, m := range []*Membership{b1, b2} {
		if _, ok := stateOf(m.Members(), "n6"); ok {
			t.Errorf("a member of 91bc lists n6: %+v", m.Members())
		}
		for _, n := range m.ml.Members() {
			if n.Name == "n6" {
				t.Errorf("a member of 91bc gossips with n6")
			}
		}
	}

	// n5 takes the other cluster's id: memberlist cannot evict it, but
	// n1 and n2 refuse its update and stop listing it. (The update, too,
	// may reach only one of them before push/pull.)
	if err := c.UpdateMeta(func(meta *NodeMeta) { meta.ClusterID = "7f3a" }, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n1 or n2 stops listing n5", func() bool {
		return sees(b1.Members(), "n1", "n2") || sees(b2.Members(), "n1", "n2")
	})

	seedLog := logs["n1"]
	if got := strings.Count(seedLog.String(), "node=n4 "); got != 1 {
		t.Errorf("the seed logged the refusal %d times, want once:\n%s", got, seedLog.String())
	}
	if strings.Contains(seedLog.String(), refusingSuffix) {
		t.Errorf("memberlist's own refusal lines got through:\n%s", seedLog.String())
	}
}

// A member that stops answering is suspect before it is dead.
func TestMembershipSuspect(t *testing.T) {
	slowVerdict := func(c *MembershipConfig) {
		fast := c.tune
		c.tune = func(mc *memberlist.Config) {
			fast(mc)
			mc.SuspicionMult = 6 // suspect for 600 ms (two nodes, no confirmations)
		}
	}
	n1, n2 := startMember(t, "n1", slowVerdict), startMember(t, "n2", slowVerdict)
	join(t, n2, n1)
	waitFor(t, n1, "both alive", func(ms []Member) bool { return sees(ms, "n1", "n2") })

	n2.Shutdown()
	var seen []MemberState // n2's states on n1, in order, without repeats
	deadline := time.After(20 * time.Second)
	for len(seen) == 0 || seen[len(seen)-1] != StateDead {
		if mb, _ := stateOf(n1.Members(), "n2"); len(seen) == 0 || seen[len(seen)-1] != mb.State {
			seen = append(seen, mb.State)
		}
		select {
		case <-n1.Changed():
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("n2 not dead within 20s; states seen %v", seen)
		}
	}
	if !slices.Equal(seen, []MemberState{StateAlive, StateSuspect, StateDead}) {
		t.Fatalf("n2's states on n1: %v, want [alive suspect dead]", seen)
	}
}

// shiftedClock is the system clock moved by a fixed amount.
type shiftedClock time.Duration

func (c shiftedClock) Now() time.Time { return time.Now().Add(time.Duration(c)) }

// With n3's clock 3 s ahead, the others see it ahead by 3 s, n3 sees them
// 3 s behind, and n1 and n2 agree with each other.
func TestMembershipClockOffset(t *testing.T) {
	const shift, tolerance = 3 * time.Second, 250 * time.Millisecond
	n1, n2 := startMember(t, "n1"), startMember(t, "n2")
	n3 := startMember(t, "n3", func(c *MembershipConfig) { c.Clock = shiftedClock(shift) })
	join(t, n2, n1)
	join(t, n3, n1)
	want := map[string]map[string]time.Duration{ // observer -> member -> offset
		"n1": {"n1": 0, "n2": 0, "n3": shift},
		"n2": {"n1": 0, "n2": 0, "n3": shift},
		"n3": {"n1": -shift, "n2": -shift, "n3": 0},
	}
	for id, m := range map[string]*Membership{"n1": n1, "n2": n2, "n3": n3} {
		waitFor(t, m, id+" knows the offsets", func(ms []Member) bool {
			if len(ms) != 3 {
				return false
			}
			for _, mb := range ms {
				d := mb.ClockOffset - want[id][mb.ID]
				if !mb.OffsetKnown || d < -tolerance || d > tolerance {
					return false
				}
			}
			return true
		})
	}
}

// The bookkeeping behind Members, driven by hand: a fake peer that
// memberlist knows nothing of (so it never probes it) joins, is suspected
// (memberlist's log line, written as probeNode writes it), answers a probe
// with its clock, is suspected again, and dies.
func TestMembershipBookkeeping(t *testing.T) {
	m := startMember(t, "n1")
	memberlistLogger := log.New(&memberlistLog{m: m, out: io.Discard}, "", 0)
	peer := &memberlist.Node{Name: "n9", Addr: net.IPv4(127, 0, 0, 9), Port: 9, Meta: []byte(`{"id":"n9","api":"a9"}`)}
	check := func(what string, state MemberState, offsetKnown bool) Member {
		t.Helper()
		mb, ok := stateOf(m.Members(), "n9")
		if !ok || mb.State != state || mb.OffsetKnown != offsetKnown || mb.APIAddr != "a9" || mb.GossipAddr != "127.0.0.9:9" {
			t.Fatalf("%s: n9 is %+v (listed %v), want %v, offset known %v", what, mb, ok, state, offsetKnown)
		}
		return mb
	}

	(*events)(m).NotifyJoin(peer)
	check("joined", StateAlive, false)
	if me, _ := stateOf(m.Members(), "n1"); me.State != StateAlive || !me.OffsetKnown || me.ClockOffset != 0 {
		t.Fatalf("own member: %+v", me)
	}
	memberlistLogger.Printf("[INFO] memberlist: Suspect %s has failed, no acks received", "n9")
	check("suspected", StateSuspect, false)

	// An ack 10 ms after the probe, from a clock 2 s ahead: the peer read
	// it 5 ms before we got the ack.
	ack := encodeAckTime(time.Now().Add(2*time.Second - 5*time.Millisecond))
	(*pinger)(m).NotifyPingComplete(peer, 10*time.Millisecond, ack)
	if mb := check("answered", StateAlive, true); mb.ClockOffset < 2*time.Second-50*time.Millisecond || mb.ClockOffset > 2*time.Second+50*time.Millisecond {
		t.Fatalf("offset %v, want about 2s", mb.ClockOffset)
	} else if mb.OffsetError != 5*time.Millisecond {
		t.Fatalf("offset error %v, want half the 10 ms round trip", mb.OffsetError)
	}
	(*pinger)(m).NotifyPingComplete(peer, time.Millisecond, []byte{1, 2, 3}) // wrong size: no sample
	if mb := check("short payload", StateAlive, true); mb.ClockOffset < time.Second {
		t.Fatalf("a short payload changed the offset to %v", mb.ClockOffset)
	}

	memberlistLogger.Printf("[INFO] memberlist: Suspect %s has failed, no acks received", "n9")
	memberlistLogger.Printf("[INFO] memberlist: Suspect %s has failed, no acks received", "nobody")
	check("suspected again", StateSuspect, true)
	(*events)(m).NotifyLeave(peer)
	check("dead", StateDead, true)
	memberlistLogger.Printf("[INFO] memberlist: Suspect %s has failed, no acks received", "n9")
	check("dead, suspect line late", StateDead, true)
	(*events)(m).NotifyJoin(peer) // back, perhaps restarted on another clock
	check("back", StateAlive, false)
}

// Refusals driven by hand: a member that takes another cluster's id is
// hidden, stays hidden when stale news without a cluster id comes, is
// logged once, and shows again when it takes this cluster's id or
// rejoins.
func TestMembershipRefusedMember(t *testing.T) {
	var logged syncBuffer
	m := startMember(t, "n1", func(c *MembershipConfig) {
		c.Meta.ClusterID = "91bc"
		c.Logger = hclog.New(&hclog.LoggerOptions{Output: &logged})
	})
	node := func(cluster string) *memberlist.Node {
		return &memberlist.Node{Name: "n9", Addr: net.IPv4(127, 0, 0, 9), Port: 9, Meta: []byte(`{"id":"n9","cluster":"` + cluster + `"}`)}
	}
	alive := func(cluster string) error { return (*clusterFilter)(m).NotifyAlive(node(cluster)) }
	listed := func() bool { _, ok := stateOf(m.Members(), "n9"); return ok }

	(*events)(m).NotifyJoin(node(""))
	for i, step := range []struct {
		cluster string
		refused bool
		listed  bool
	}{
		{"", false, true},
		{"7f3a", true, false},
		{"", false, false}, // stale: still hidden
		{"7f3a", true, false},
		{"91bc", false, true},
		{"7f3a", true, false},
	} {
		err := alive(step.cluster)
		if refused := errors.Is(err, ErrOtherCluster); refused != step.refused || listed() != step.listed {
			t.Fatalf("step %d: alive(%q): %v, listed %v; want refused %v, listed %v", i, step.cluster, err, listed(), step.refused, step.listed)
		}
	}
	if got := strings.Count(logged.String(), "node=n9 "); got != 2 {
		t.Errorf("logged %d refusals of n9, want 2 (once, and once after it showed 91bc):\n%s", got, logged.String())
	}
	(*events)(m).NotifyJoin(node("")) // back from dead, say
	if !listed() {
		t.Errorf("n9 rejoined but is not listed")
	}
}

func TestMemberStateString(t *testing.T) {
	for s, want := range map[MemberState]string{
		StateAlive: "alive", StateSuspect: "suspect", StateDead: "dead", StateLeft: "left", 7: "MemberState(7)",
	} {
		if got := s.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(s), got, want)
		}
	}
}

// TestMembershipSecretKey: nodes with the cluster's gossip key join each
// other; a node without it, or with another key, cannot join, and the
// cluster never lists it.
func TestMembershipSecretKey(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	withKey := func(k []byte) func(*MembershipConfig) {
		return func(c *MembershipConfig) { c.SecretKey = k }
	}
	a := startMember(t, "n1", withKey(key))
	b := startMember(t, "n2", withKey(key))
	join(t, b, a)
	waitFor(t, a, "n1 sees n2", func(ms []Member) bool { return sees(ms, "n1", "n2") })
	for _, c := range []struct {
		id  string
		key []byte
	}{{"n3", nil}, {"n4", bytes.Repeat([]byte{8}, 32)}} {
		m := startMember(t, c.id, withKey(c.key))
		if n, err := m.Join([]string{a.Addr()}); err == nil && n > 0 {
			t.Errorf("%s (key %x) joined %d node(s)", c.id, c.key, n)
		}
	}
	// Long enough for any gossip that got through to show.
	time.Sleep(500 * time.Millisecond)
	if ms := a.Members(); !sees(ms, "n1", "n2") {
		t.Fatalf("members with the key: %+v", ms)
	}
}

// FuzzDecodeMeta feeds arbitrary gossip metadata to decodeMeta: no input
// may panic, and a node always keeps the name gossip knows it by, whatever
// its metadata claims.
func FuzzDecodeMeta(f *testing.F) {
	good, _ := json.Marshal(NodeMeta{ID: "n1", APIAddr: "127.0.0.1:7400", RaftAddr: "127.0.0.1:7401", Version: "v1"})
	f.Add("n1", good)
	f.Add("n2", good)
	f.Add("n1", []byte(`{"id": "n1", "ring_epoch": -1}`))
	f.Add("", []byte(`null`))
	f.Fuzz(func(t *testing.T, name string, meta []byte) {
		got := decodeMeta(&memberlist.Node{Name: name, Meta: meta})
		if got.ID != name {
			t.Fatalf("node %q decoded as %q", name, got.ID)
		}
	})
}
