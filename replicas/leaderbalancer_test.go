package replicas

import (
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
)

// fakeGroup is one partition group on node self of a fakeCluster.
type fakeGroup struct {
	c       *fakeCluster
	p       int
	servers []claims.Server
}

func (g *fakeGroup) IsLeader() bool {
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	return g.c.leader[g.p] == g.c.self
}

func (g *fakeGroup) Leader() raft.ServerID {
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	return raft.ServerID(g.c.leader[g.p])
}

func (g *fakeGroup) Servers() ([]claims.Server, error) {
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	g.c.serversCalls++
	return g.servers, nil
}

func (g *fakeGroup) TransferLeadershipTo(id, addr string) error {
	if g.c.block != nil {
		<-g.c.block
	}
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	if addr != "raft-"+id {
		g.c.t.Errorf("transfer of partition %d to %s at %q", g.p, id, addr)
	}
	if err := g.c.fail[id]; err != nil {
		return err
	}
	g.c.transfers = append(g.c.transfers, LeaderTransfer{Partition: g.p, To: id})
	g.c.leader[g.p] = g.c.seenLeader(id)
	return nil
}

// fakeCluster is what a LeaderBalancer on node self sees: a ring of
// nodes n1..n3 where every partition's cohort is all of them, gossip
// (alive members and their LeaderMeta), the groups (their leaders), a
// clock guard and a monotonic clock, all set by the test. Its groups
// may be called concurrently (HandOver); the test reads and sets its
// fields while no call runs.
type fakeCluster struct {
	mu           sync.Mutex // held by the groups' methods
	t            *testing.T
	self         string
	ring         *cluster.Ring
	leader       []string // each partition's leader as self sees it
	meta         map[string]cluster.LeaderMeta
	state        map[string]cluster.MemberState
	mayLead      error
	now          time.Time
	fail         map[string]error // transfers to these nodes fail
	transfers    []LeaderTransfer
	published    []cluster.LeaderMeta
	serversCalls int
	// hideLeader: after a transfer, self does not see the new leader
	// yet (its first heartbeat has not arrived).
	hideLeader bool
	// block, when set, holds every transfer until it is closed.
	block chan struct{}
}

func (c *fakeCluster) seenLeader(id string) string {
	if c.hideLeader {
		return ""
	}
	return id
}

func newFakeCluster(t *testing.T, partitions int) *fakeCluster {
	nodes := []cluster.RingNode{{ID: "n1"}, {ID: "n2"}, {ID: "n3"}}
	c := &fakeCluster{t: t, self: "n1", ring: &cluster.Ring{Partitions: partitions, Replication: 3, Nodes: nodes},
		leader: make([]string, partitions), now: time.Unix(1000, 0), fail: map[string]error{},
		meta:  map[string]cluster.LeaderMeta{},
		state: map[string]cluster.MemberState{"n1": cluster.StateAlive, "n2": cluster.StateAlive, "n3": cluster.StateAlive}}
	c.ring.Placement.Cohorts = fullCohorts(partitions, "n1", "n2", "n3")
	return c
}

// lead makes node id the leader of the partitions in [lo, hi), and
// gossips every node's count as self sees it.
func (c *fakeCluster) lead(id string, lo, hi int) {
	for p := lo; p < hi; p++ {
		c.leader[p] = id
	}
	c.gossip()
}

// gossip has every other node tell its count (as self sees it), with a
// new sequence number.
func (c *fakeCluster) gossip() {
	counts := map[string]int{}
	for _, l := range c.leader {
		counts[l]++
	}
	for _, id := range []string{"n2", "n3"} {
		m := c.meta[id]
		c.meta[id] = cluster.LeaderMeta{Count: counts[id], NoLead: m.NoLead, Seq: m.Seq + 1}
	}
}

func (c *fakeCluster) balancer(rate float64, burst int, settle time.Duration) *LeaderBalancer {
	return NewLeaderBalancer(LeaderBalancerConfig{
		NodeID: c.self, Tolerance: 0.2, Rate: rate, Burst: burst, TargetSettle: settle,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Ring:   func() *cluster.Ring { return c.ring },
		Groups: func() []LeaderGroup {
			out := make([]LeaderGroup, c.ring.Partitions)
			for p := range out {
				g := &fakeGroup{c: c, p: p}
				for _, id := range c.ring.Cohort(p) {
					g.servers = append(g.servers, claims.Server{ID: string(id), Address: "raft-" + string(id), Voter: true})
				}
				out[p] = g
			}
			return out
		},
		Members: func() []cluster.Member {
			var out []cluster.Member
			for _, nd := range c.ring.Nodes {
				out = append(out, cluster.Member{NodeMeta: cluster.NodeMeta{ID: nd.ID, Leaders: c.meta[nd.ID]}, State: c.state[nd.ID]})
			}
			return out
		},
		MayLead: func() error { return c.mayLead },
		Publish: func(lm cluster.LeaderMeta) error {
			c.published = append(c.published, lm)
			return nil
		},
		Now: func() time.Time { return c.now },
	})
}

func (c *fakeCluster) count(id string) int {
	n := 0
	for _, l := range c.leader {
		if l == id {
			n++
		}
	}
	return n
}

// TestLeaderBalancerRateLimit: a node leading every partition of three
// nodes hands leaderships over at the rate, in bursts of the burst, the
// least loaded node first.
func TestLeaderBalancerRateLimit(t *testing.T) {
	c := newFakeCluster(t, 16)
	c.lead("n1", 0, 16)
	b := c.balancer(1, 1, 0)
	b.Pass()
	if len(c.transfers) != 1 || c.transfers[0] != (LeaderTransfer{Partition: 0, To: "n2"}) {
		t.Fatalf("first pass: transfers %v, want partition 0 to n2", c.transfers)
	}
	b.Pass()
	c.now = c.now.Add(500 * time.Millisecond)
	b.Pass()
	if len(c.transfers) != 1 {
		t.Fatalf("within a second of the first: transfers %v", c.transfers)
	}
	c.now = c.now.Add(500 * time.Millisecond)
	b.Pass()
	if len(c.transfers) != 2 || c.transfers[1] != (LeaderTransfer{Partition: 1, To: "n3"}) {
		t.Fatalf("a second later: transfers %v, want partition 1 to n3 next", c.transfers)
	}
	if s := b.Stats(); s.Transfers != 2 || s.Failures != 0 {
		t.Fatalf("stats %+v", s)
	}

	// A burst of 3: up to 3 in one pass, one at a time.
	c = newFakeCluster(t, 16)
	c.lead("n1", 0, 16)
	b = c.balancer(1, 3, 0)
	b.Pass()
	if len(c.transfers) != 3 {
		t.Fatalf("burst 3: transfers %v", c.transfers)
	}
	// Then passes a second apart until balanced: 16 on n1 -> 6, 5, 5.
	for range 20 {
		c.now = c.now.Add(time.Second)
		c.gossip()
		b.Pass()
	}
	if got := [3]int{c.count("n1"), c.count("n2"), c.count("n3")}; got != [3]int{6, 5, 5} {
		t.Fatalf("after 20 s: leads %v, want [6 5 5]", got)
	}
	// Balanced: no more transfers, and no Raft calls for them.
	n, calls := len(c.transfers), c.serversCalls
	for range 10 {
		c.now = c.now.Add(time.Second)
		b.Pass()
	}
	if len(c.transfers) != n || c.serversCalls != calls {
		t.Fatalf("balanced: %d more transfers, %d more Servers calls", len(c.transfers)-n, c.serversCalls-calls)
	}
	loads := b.Loads()
	if l := loads["n2"]; l.Leads != 5 || !l.Eligible || l.Share < 5.33 || l.Share > 5.34 {
		t.Fatalf("loads %+v", loads)
	}
}

// TestLeaderBalancerClockGuard: a node whose clock guard refuses hands
// nothing over (the guard does) and says so; a node that said so is
// never handed a leadership.
func TestLeaderBalancerClockGuard(t *testing.T) {
	c := newFakeCluster(t, 16)
	c.lead("n1", 0, 16)
	c.mayLead = errors.New("clock out of bound")
	b := c.balancer(100, 100, 0)
	b.Pass()
	if len(c.transfers) != 0 {
		t.Fatalf("out of bound: transfers %v", c.transfers)
	}
	if len(c.published) != 1 || !c.published[0].NoLead || c.published[0].Count != 16 {
		t.Fatalf("published %+v, want 16 and no-lead", c.published)
	}
	if l := b.Loads()["n1"]; l.Eligible || l.Share != 0 {
		t.Fatalf("own load %+v, want not eligible", l)
	}

	c.mayLead = nil
	c.meta["n3"] = cluster.LeaderMeta{Count: 0, NoLead: true, Seq: 7}
	b.Pass()
	if c.published[len(c.published)-1].NoLead {
		t.Fatal("back in bound, still publishing no-lead")
	}
	for _, tr := range c.transfers {
		if tr.To == "n3" {
			t.Fatalf("handed partition %d to n3, whose clock guard refuses", tr.Partition)
		}
	}
	// n1 and n2 share 16, 8 each, band [7, 9]: n1 hands over 7.
	if c.count("n1") != 9 || c.count("n2") != 7 {
		t.Fatalf("leads n1 %d, n2 %d; want 9 and 7", c.count("n1"), c.count("n2"))
	}
}

// TestLeaderBalancerSkipsMoves: a partition with a move under way keeps
// its leader.
func TestLeaderBalancerSkipsMoves(t *testing.T) {
	c := newFakeCluster(t, 16)
	c.lead("n1", 0, 16)
	for p := range 12 {
		c.ring.Moves = append(c.ring.Moves, cluster.Move{Partition: p, From: "n3", To: "n4", State: cluster.MoveCatchingUp})
	}
	b := c.balancer(100, 100, 0)
	b.Pass()
	for _, tr := range c.transfers {
		if tr.Partition < 12 {
			t.Fatalf("handed over partition %d, whose move is under way", tr.Partition)
		}
	}
	if len(c.transfers) != 4 {
		t.Fatalf("transfers %v, want partitions 12-15", c.transfers)
	}
}

// TestLeaderBalancerPending: a transfer counts on top of the taker's
// gossiped count until it gossips again, so the next choice does not
// pile onto it; a node that failed to take one is left alone for a
// while; a node just seen eligible is handed nothing before it settles.
func TestLeaderBalancerPending(t *testing.T) {
	c := newFakeCluster(t, 16)
	c.lead("n1", 0, 16)
	c.hideLeader = true
	b := c.balancer(1, 1, 0)
	b.Pass()
	c.now = c.now.Add(time.Second)
	b.Pass()
	// Without the credit n2 and n3 would tie at 0 and n2 would win again.
	if len(c.transfers) != 2 || c.transfers[0].To != "n2" || c.transfers[1].To != "n3" {
		t.Fatalf("transfers %v, want to n2, then n3", c.transfers)
	}
	if got := b.Loads()["n2"].Leads; got != 1 {
		t.Fatalf("before n2 gossips: its load %d, want 1", got)
	}
	c.meta["n2"] = cluster.LeaderMeta{Count: 4, Seq: c.meta["n2"].Seq + 1}
	c.now = c.now.Add(time.Second)
	b.Pass()
	if got := b.Loads()["n2"].Leads; got != 4 {
		t.Fatalf("n2 gossiped 4: load %d", got)
	}

	c = newFakeCluster(t, 16)
	c.lead("n1", 0, 16)
	c.fail["n2"] = errors.New("leadership transfer timeout")
	b = c.balancer(1, 1, 0)
	b.Pass()
	if s := b.Stats(); s.Transfers != 1 || s.Failures != 1 {
		t.Fatalf("stats %+v, want one failed transfer", s)
	}
	delete(c.fail, "n2")
	for range 5 {
		c.now = c.now.Add(time.Second)
		b.Pass()
	}
	for _, tr := range c.transfers {
		if tr.To == "n2" {
			t.Fatalf("n2 handed partition %d within 5 s of a failed transfer", tr.Partition)
		}
	}
	c.now = c.now.Add(leaderFailBackoff)
	c.gossip()
	b.Pass()
	if last := c.transfers[len(c.transfers)-1]; last.To != "n2" {
		t.Fatalf("after the backoff: %v, want n2 (the least loaded) again", c.transfers)
	}

	c = newFakeCluster(t, 16)
	c.lead("n1", 0, 16)
	b = c.balancer(100, 100, 3*time.Second)
	b.Pass()
	c.now = c.now.Add(2 * time.Second)
	b.Pass()
	if len(c.transfers) != 0 {
		t.Fatalf("handed over %v before the takers settled", c.transfers)
	}
	c.now = c.now.Add(time.Second)
	b.Pass()
	if c.count("n1") != 6 {
		t.Fatalf("after settling: n1 leads %d, want 6", c.count("n1"))
	}
}

// TestLeaderBalancerPublish: the count is gossiped when it changes only.
func TestLeaderBalancerPublish(t *testing.T) {
	c := newFakeCluster(t, 6)
	c.lead("n1", 0, 2)
	c.lead("n2", 2, 4)
	c.lead("n3", 4, 6)
	b := c.balancer(1, 1, 0)
	for range 3 {
		b.Pass()
	}
	c.leader[2] = "n1"
	b.Pass()
	want := []cluster.LeaderMeta{{Count: 2, Seq: 1}, {Count: 3, Seq: 2}}
	if len(c.published) != 2 || c.published[0] != want[0] || c.published[1] != want[1] {
		t.Fatalf("published %+v, want %+v", c.published, want)
	}
	// Nothing before the cluster is formed.
	c.ring = nil
	b = c.balancer(1, 1, 0)
	b.Pass()
	if len(c.published) != 2 || b.Loads() != nil {
		t.Fatalf("without a ring: published %+v, loads %v", c.published, b.Loads())
	}
}

var _ LeaderGroup = (*claims.Group)(nil)
