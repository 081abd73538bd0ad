package replicas

import (
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"golang.org/x/time/rate"

	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
)

// LeaderGroup is a partition group as the leader balancer uses it
// (claims.Group is one).
type LeaderGroup interface {
	// IsLeader reports whether this replica leads the group now.
	IsLeader() bool
	// Leader is the group's leader as this replica knows it, "" when
	// there is none.
	Leader() raft.ServerID
	// Servers is the group's configuration.
	Servers() ([]claims.Server, error)
	// TransferLeadershipTo hands the leadership to voter id at Raft
	// address addr and returns once this replica stepped down, or the
	// transfer failed.
	TransferLeadershipTo(id, addr string) error
}

// LeaderBalancerConfig configures a LeaderBalancer. The node's Config
// documents the shared fields (units, defaults); NewLeaderBalancer
// applies none but Now's.
type LeaderBalancerConfig struct {
	NodeID string
	// Tolerance: a node within -+Tolerance of its fair share is balanced
	// (LeaderBand).
	Tolerance float64
	// Rate bounds the leadership transfers this node starts, per second
	// on average, in bursts of at most Burst; 0 starts none (the node
	// still tells its count, for the others and for Status).
	Rate  float64
	Burst int
	// TargetSettle is how long a node must have been eligible, as this
	// node sees it, before it is handed a leadership (a node that just
	// came back catches up on its groups' logs first).
	TargetSettle time.Duration
	Logger       *slog.Logger

	// Ring is the ring this node works with (nil before the cluster is
	// formed).
	Ring func() *cluster.Ring
	// Groups lists the partition groups on this node, indexed by
	// partition, nil where it has none.
	Groups func() []LeaderGroup
	// Members is gossip's view of the cluster (Membership.Members).
	Members func() []cluster.Member
	// MayLead is this node's clock guard (nil: always): while it refuses,
	// the balancer hands nothing over (the guard hands everything over)
	// and tells the others not to hand it any.
	MayLead func() error
	// Publish gossips this node's LeaderMeta (Membership.UpdateMeta).
	Publish func(cluster.LeaderMeta) error
	// Now is the monotonic clock of the rate limit and of the waits
	// (default time.Now): the balancer only waits, it reads no wall
	// time.
	Now func() time.Time
}

// LeaderLoad is one node's leaderships against its fair share as this
// node last saw them (Status, /metrics).
type LeaderLoad struct {
	Leads    int     // partition groups it leads (see LeaderBalancer)
	Share    float64 // its fair share (0 when not eligible)
	Eligible bool    // it may be handed leaderships
}

// LeaderBalanceStats counts a balancer's transfers.
type LeaderBalanceStats struct {
	Transfers uint64 // leadership transfers started to balance leaderships
	Failures  uint64 // of those, the ones that failed
	Passes    uint64 // passes that found the cluster formed (a ring)
}

// LeaderBalancer spreads this node's partition leaderships over the
// cluster (the rule is DecideLeaderTransfer's). Each Pass, run by the
// node every leader-balance interval:
//
//  1. counts the groups this node leads and, when the count or its
//     clock guard's verdict changed, gossips them (cluster.LeaderMeta);
//  2. builds its view: every other node's count is the higher of what it
//     gossiped (plus the transfers this node made to it since, until it
//     gossips again) and what this node sees in the groups it is a member
//     of; eligible nodes are ring members gossip shows alive (not
//     suspect) that gossiped a count, do not refuse to lead, and have
//     been so for TargetSettle;
//  3. unless this node's clock guard refuses or it is leaving (HandOver),
//     hands leaderships over one
//     at a time, each chosen on the view updated by the last, while the
//     rate limit allows, to voters of the group that no transfer of this
//     node failed to reach in the last leaderFailBackoff.
//
// Passes run one at a time (a Pass waits for the one under way, and for
// HandOver's planning); Loads and Stats are safe at any time.
type LeaderBalancer struct {
	cfg   LeaderBalancerConfig
	limit *rate.Limiter

	// leaving is set by HandOver, for good: the node stops leading.
	// handingOver is set while HandOver runs: until it returns, Pass
	// leaves the leaderships to it.
	leaving, handingOver atomic.Bool

	// passMu is held by Pass and by HandOver's planning; it guards the
	// fields up to mu.
	passMu        sync.Mutex
	published     cluster.LeaderMeta   // the last word gossiped
	pending       []pendingTransfer    // transfers the takers have not gossiped since
	seqs          map[string]uint64    // each up node's gossiped sequence, as of the view
	eligibleSince map[string]time.Time // when each eligible node became so
	failedAt      map[string]time.Time // when a transfer to each node last failed

	mu    sync.Mutex
	loads map[string]LeaderLoad
	stats LeaderBalanceStats
}

// pendingTransfer is a transfer this node made to node to, when to had
// gossiped the word of sequence seq: until to gossips a newer word, its
// gossiped count lacks it.
type pendingTransfer struct {
	to  string
	seq uint64
	at  time.Time
}

// pendingMax bounds how long a transfer is added to its taker's gossiped
// count when the taker gossips nothing newer.
const pendingMax = 10 * time.Second

// leaderFailBackoff is how long a node is not handed leaderships by this
// node after a transfer to it failed.
const leaderFailBackoff = 10 * time.Second

// publishTimeout bounds the wait for a LeaderMeta broadcast (it goes out
// with memberlist's next gossip either way).
const publishTimeout = 500 * time.Millisecond

// NewLeaderBalancer returns a balancer over cfg's sources.
func NewLeaderBalancer(cfg LeaderBalancerConfig) *LeaderBalancer {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	b := &LeaderBalancer{cfg: cfg, eligibleSince: map[string]time.Time{}, failedAt: map[string]time.Time{}}
	if cfg.Rate > 0 {
		b.limit = rate.NewLimiter(rate.Limit(cfg.Rate), max(cfg.Burst, 1))
	}
	return b
}

// Loads returns every node's leaderships against its fair share as the
// last Pass saw them (nil before the first).
func (b *LeaderBalancer) Loads() map[string]LeaderLoad {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.loads
}

// Stats returns the balancer's counters.
func (b *LeaderBalancer) Stats() LeaderBalanceStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// Pass gossips this node's leader count, updates its view and hands
// leaderships over as the rule says (see LeaderBalancer). On a node that
// has handed its leaderships over (HandOver returned: it is stopping), it
// hands over at once any it was given again (handOverAgain).
func (b *LeaderBalancer) Pass() {
	if led := b.pass(); led > 0 && b.handedOver() {
		b.handOverAgain()
	}
}

// pass is Pass but for handOverAgain; it returns how many partitions
// this node leads.
func (b *LeaderBalancer) pass() int {
	b.passMu.Lock()
	defer b.passMu.Unlock()
	r := b.cfg.Ring()
	if r == nil {
		return 0
	}
	b.mu.Lock()
	b.stats.Passes++
	b.mu.Unlock()
	mayLead := b.mayLead()
	groups := b.cfg.Groups()
	seen, led := b.countLocal(groups)
	b.publish(len(led), mayLead)
	v := b.view(r, seen, len(led), mayLead)
	if !mayLead || b.limit == nil || !mayGive(v, FairLeaderShares(v.Cohorts, v.Eligible)) {
		return len(led) // nothing to hand over (and no Raft calls while balanced)
	}
	voters := map[int][]claims.Server{}
	for _, p := range led {
		if v.Moving[p] {
			continue
		}
		servers, err := groups[p].Servers()
		if err != nil {
			continue
		}
		for _, s := range servers {
			if s.Voter && s.ID != b.cfg.NodeID && !b.failedRecently(s.ID) {
				voters[p] = append(voters[p], s)
				v.Led[p] = append(v.Led[p], s.ID)
			}
		}
	}
	for !b.leaving.Load() { // HandOver takes over
		tr, ok := DecideLeaderTransfer(v)
		if !ok {
			return len(led)
		}
		if !groups[tr.Partition].IsLeader() { // lost it meanwhile (an election)
			delete(v.Led, tr.Partition)
			v.Leads[b.cfg.NodeID]--
			continue
		}
		if !b.limit.AllowN(b.cfg.Now(), 1) {
			return len(led)
		}
		i := slices.IndexFunc(voters[tr.Partition], func(s claims.Server) bool { return s.ID == tr.To })
		addr := voters[tr.Partition][i].Address
		err := groups[tr.Partition].TransferLeadershipTo(tr.To, addr)
		b.mu.Lock()
		b.stats.Transfers++
		if err != nil {
			b.stats.Failures++
		}
		b.mu.Unlock()
		delete(v.Led, tr.Partition)
		if err != nil {
			b.cfg.Logger.Warn("handing a leadership over to balance leaderships failed", "partition", tr.Partition, "to", tr.To, "err", err)
			b.failedAt[tr.To] = b.cfg.Now()
			for p, ids := range v.Led {
				v.Led[p] = slices.DeleteFunc(ids, func(id string) bool { return id == tr.To })
			}
			continue
		}
		b.cfg.Logger.Info("handed a leadership over to balance leaderships", "partition", tr.Partition, "to", tr.To,
			"leads", v.Leads[b.cfg.NodeID]-1, "its_leads", v.Leads[tr.To]+1)
		b.pending = append(b.pending, pendingTransfer{to: tr.To, seq: b.seqs[tr.To], at: b.cfg.Now()})
		v.Leads[b.cfg.NodeID]--
		v.Leads[tr.To]++
	}
	return len(led)
}

// mayLead reports whether this node may lead: it is not leaving and its
// clock guard does not refuse.
func (b *LeaderBalancer) mayLead() bool {
	return !b.leaving.Load() && (b.cfg.MayLead == nil || b.cfg.MayLead() == nil)
}

// countLocal counts, in the groups on this node, how many each node leads
// as this node sees it, and lists the partitions this node leads.
func (b *LeaderBalancer) countLocal(groups []LeaderGroup) (seen map[string]int, led []int) {
	seen = map[string]int{}
	for p, g := range groups {
		switch {
		case g == nil:
		case g.IsLeader():
			led = append(led, p)
		default:
			if l := g.Leader(); l != "" {
				seen[string(l)]++
			}
		}
	}
	return seen, led
}

// publish gossips this node's count and verdict when they changed.
func (b *LeaderBalancer) publish(count int, mayLead bool) {
	next := cluster.LeaderMeta{Count: count, NoLead: !mayLead, Seq: b.published.Seq + 1}
	if b.published.Seq > 0 && next.Count == b.published.Count && next.NoLead == b.published.NoLead {
		return
	}
	if err := b.cfg.Publish(next); err != nil {
		// memberlist queued the update; only its broadcast is late.
		b.cfg.Logger.Debug("gossiping this node's leader count", "err", err)
	}
	b.published = next
}

// view builds this Pass's LeaderView (Led left empty) and records the
// loads for Loads.
func (b *LeaderBalancer) view(r *cluster.Ring, seen map[string]int, mine int, mayLead bool) LeaderView {
	now := b.cfg.Now()
	self := b.cfg.NodeID
	v := LeaderView{Self: self, Cohorts: r.Placement.Cohorts, Eligible: map[string]bool{}, Leads: map[string]int{self: mine},
		Led: map[int][]string{}, Moving: map[int]bool{}, Tolerance: b.cfg.Tolerance}
	for p := range r.MovesUnderway() {
		v.Moving[p] = true
	}
	gossiped := map[string]cluster.LeaderMeta{}
	b.seqs = map[string]uint64{}
	for _, m := range b.cfg.Members() {
		if m.ID == self {
			continue
		}
		if m.State.Up() {
			gossiped[m.ID] = m.Leaders
			b.seqs[m.ID] = m.Leaders.Seq
		}
		role, member := r.Role(m.ID)
		if m.State == cluster.StateAlive && m.Leaders.Seq > 0 && !m.Leaders.NoLead && member && role == cluster.RoleMember {
			if _, ok := b.eligibleSince[m.ID]; !ok {
				b.eligibleSince[m.ID] = now
			}
			v.Eligible[m.ID] = now.Sub(b.eligibleSince[m.ID]) >= b.cfg.TargetSettle
		} else {
			delete(b.eligibleSince, m.ID)
		}
	}
	if role, member := r.Role(self); mayLead && member && role == cluster.RoleMember {
		v.Eligible[self] = true
	}
	// Transfers this node made count on top of a taker's gossiped count
	// until it gossips again (or pendingMax passes).
	b.pending = slices.DeleteFunc(b.pending, func(t pendingTransfer) bool {
		g, up := gossiped[t.to]
		return !up || g.Seq != t.seq || now.Sub(t.at) > pendingMax
	})
	extra := map[string]int{}
	for _, t := range b.pending {
		extra[t.to]++
	}
	for id, g := range gossiped {
		v.Leads[id] = max(seen[id], g.Count+extra[id])
	}
	for id, n := range seen {
		if id != self {
			v.Leads[id] = max(v.Leads[id], n)
		}
	}
	shares := FairLeaderShares(v.Cohorts, v.Eligible)
	loads := map[string]LeaderLoad{}
	for id, n := range v.Leads {
		loads[id] = LeaderLoad{Leads: n, Share: shares[id], Eligible: v.Eligible[id]}
	}
	b.mu.Lock()
	b.loads = loads
	b.mu.Unlock()
	return v
}

// failedRecently reports whether a transfer to id failed within
// leaderFailBackoff.
func (b *LeaderBalancer) failedRecently(id string) bool {
	at, ok := b.failedAt[id]
	if ok && b.cfg.Now().Sub(at) >= leaderFailBackoff {
		delete(b.failedAt, id)
		return false
	}
	return ok
}

// LeaderBurst is the burst of the balancer's rate limit for rate
// transfers per second and passes every interval: what a pass may do,
// at least one.
func LeaderBurst(rate float64, interval time.Duration) int {
	return max(1, int(math.Ceil(rate*interval.Seconds())))
}

// LeaderBalanceTuning is the node's setting of its leader balancer (see
// LeaderBalancerConfig for each field).
type LeaderBalanceTuning struct {
	Tolerance    float64
	Rate         float64
	Burst        int
	TargetSettle time.Duration
}

// newLeaderBalancer returns the balancer of this node's groups.
func (h *Host) newLeaderBalancer() *LeaderBalancer {
	t := h.cfg.LeaderBalance
	return NewLeaderBalancer(LeaderBalancerConfig{
		NodeID: h.cfg.NodeID, Tolerance: t.Tolerance, Rate: t.Rate, Burst: t.Burst, TargetSettle: t.TargetSettle,
		Logger: h.cfg.Logger, Ring: h.Ring, Members: h.members.Members, MayLead: h.cfg.MayLead,
		Groups: func() []LeaderGroup {
			gs := h.Groups()
			out := make([]LeaderGroup, len(gs))
			for p, g := range gs {
				if g != nil { // a nil *claims.Group would be a non-nil LeaderGroup
					out[p] = g
				}
			}
			return out
		},
		Publish: func(lm cluster.LeaderMeta) error {
			return h.members.UpdateMeta(func(m *cluster.NodeMeta) { m.Leaders = lm }, publishTimeout)
		},
	})
}

// BalanceLeaders runs one pass of the leader balancer (LeaderBalancer.Pass):
// the node calls it every leader-balance interval, never concurrently.
// On a node that has handed its leaderships over (it is stopping), it
// also hands the meta group's over again if the node was elected its
// leader since.
func (h *Host) BalanceLeaders() {
	h.leaders.Pass()
	if h.leaders.handedOver() && h.handOverMeta() {
		h.cfg.Logger.Info("stopping: handed the meta group's leadership over again (elected after the hand-over)")
	}
}

// LeaderLoads is every node's leaderships against its fair share as the
// last BalanceLeaders saw them (nil before the first).
func (h *Host) LeaderLoads() map[string]LeaderLoad { return h.leaders.Loads() }

// LeaderBalanceStats counts the leader balancer's transfers.
func (h *Host) LeaderBalanceStats() LeaderBalanceStats { return h.leaders.Stats() }
