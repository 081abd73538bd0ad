package cluster

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// ClockCheck is this node's clock judged against the cluster's (DESIGN
// section 4, clock sync): its offset from the median of the alive nodes'
// clocks, this one included, as gossip probes measure them.
type ClockCheck struct {
	Offset  time.Duration // this node's clock minus the median
	Known   bool          // at least three clocks measured (this one and two others)
	InBound bool          // |Offset| <= max, or not Known (nothing to judge by)
	// Stepped: this node's clock stepped by more than the max offset,
	// and fewer than two peers' clocks have been sampled since:
	// out of bound until they have (the older estimates may predate the
	// peers' own steps).
	Stepped bool
}

// JudgeClock judges this node's clock from the others' offsets (their
// clock minus this node's). With fewer than two others there is no
// majority to tell which clock is off: the node stays in bound.
func JudgeClock(others []time.Duration, max time.Duration) ClockCheck {
	if len(others) < 2 {
		return ClockCheck{InBound: true}
	}
	med := Median(append([]time.Duration{0}, others...))
	off := -med
	return ClockCheck{Offset: off, Known: true, InBound: off <= max && off >= -max}
}

// Median of ds (sorted in place): the middle one, or the mean of the two
// middle ones.
func Median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	k := len(ds)
	if k%2 == 1 {
		return ds[k/2]
	}
	return ds[k/2-1] + (ds[k/2]-ds[k/2-1])/2
}

// Leader is a Raft group this node may lead (claims.Group is one).
type Leader interface {
	IsLeader() bool
	// TransferLeadership hands the leadership over to another voter and
	// returns when it has, or failed to.
	TransferLeadership() error
}

// ClockGuardConfig configures a ClockGuard. The node's Config documents
// the shared fields (units, defaults); NewClockGuard applies none.
type ClockGuardConfig struct {
	NodeID string
	// MaxOffset is how far this node's clock may be from the median of
	// the alive nodes' clocks (the node's MaxClockOffset); a step of its
	// own clock beyond it makes the node wait for fresh peer offsets.
	MaxOffset time.Duration
	// Clock is this node's wall clock; its steps are measured against the
	// monotonic clock.
	Clock  Clock
	Logger *slog.Logger
	// Members is gossip's view of the cluster with the members' clock
	// offsets (Membership.Members). Called by Check only.
	Members func() []Member
	// Groups lists the partition groups on this node, indexed by
	// partition, nil where it has none: Check hands over the leaderships
	// among them while the clock is out of bound.
	Groups func() []Leader
}

// ClockGuard keeps this node's clock check current and, while the clock
// is out of bound, hands over every leadership the node holds (claims
// refuses its proposals meanwhile: MayLead).
type ClockGuard struct {
	cfg ClockGuardConfig

	mu           sync.Mutex
	check        ClockCheck
	wall, mono   time.Time       // when check was made: the wall clock (no monotonic reading) and time.Now()
	peers        int             // peers with a measured offset at check
	steppedAt    time.Time       // when this node's own clock step was seen (monotonic), zero when settled
	transferring map[uint16]bool // leadership transfers under way
	outOfBound   uint64          // times the clock went out of bound (metric)
	transfers    uint64          // leadership transfers started for the clock (metric)
}

// NewClockGuard returns a guard that judges the clock in bound until its
// first Check.
func NewClockGuard(cfg ClockGuardConfig) *ClockGuard {
	return &ClockGuard{cfg: cfg, check: ClockCheck{InBound: true}}
}

// ClockGuardStats is a ClockGuard's state for the node's metrics.
type ClockGuardStats struct {
	Check      ClockCheck // the last check
	OutOfBound uint64     // times the clock went out of bound
	Transfers  uint64     // leadership transfers started for the clock
}

// Stats returns the last check and the guard's counters.
func (g *ClockGuard) Stats() ClockGuardStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return ClockGuardStats{Check: g.check, OutOfBound: g.outOfBound, Transfers: g.transfers}
}

// PeerOffsets returns the clock offsets gossip has measured for the other
// alive members (their clock minus this node's), and of those the ones
// sampled after since.
func (g *ClockGuard) PeerOffsets(since time.Time) (all, fresh []time.Duration) {
	for _, m := range g.cfg.Members() {
		if m.ID != g.cfg.NodeID && m.State.Up() && m.OffsetKnown {
			all = append(all, m.ClockOffset)
			if m.OffsetAt.After(since) {
				fresh = append(fresh, m.ClockOffset)
			}
		}
	}
	return all, fresh
}

// stepSince is how far this node's wall clock has moved against the
// monotonic one since wall and mono were read together (0 for a steady
// clock).
func (g *ClockGuard) stepSince(wall, mono time.Time) time.Duration {
	return g.cfg.Clock.Now().Round(0).Sub(wall) - time.Since(mono)
}

// stepSettleMax bounds how long a node whose clock stepped waits for
// fresh peer offsets before it judges by the ones it has.
const stepSettleMax = 30 * time.Second

// stepLimit is how far this node's own clock may step between two
// judgements before it waits for fresh peer offsets (Stepped): a smaller
// step is judged at once on the corrected offsets.
func (g *ClockGuard) stepLimit() time.Duration { return g.cfg.MaxOffset }

// Check judges the clock again (the node runs it every monitor
// interval, apart from the monitor), logs a change and, while out of
// bound, hands over the leaderships this node holds.
func (g *ClockGuard) Check() {
	wall, mono := g.cfg.Clock.Now().Round(0), time.Now()
	g.mu.Lock()
	if !g.mono.IsZero() {
		if step := wall.Sub(g.wall) - mono.Sub(g.mono); step > g.stepLimit() || step < -g.stepLimit() {
			g.steppedAt = mono
		}
	}
	steppedAt, prevPeers := g.steppedAt, g.peers
	g.mu.Unlock()
	all, fresh := g.PeerOffsets(steppedAt)
	c := JudgeClock(all, g.cfg.MaxOffset)
	if !steppedAt.IsZero() {
		switch {
		case len(fresh) >= 2:
			c, steppedAt = JudgeClock(fresh, g.cfg.MaxOffset), time.Time{}
		case len(all) < 2 && prevPeers < 2, mono.Sub(steppedAt) > stepSettleMax:
			steppedAt = time.Time{} // nothing to judge by, or no fresh offsets for too long
		default:
			c = ClockCheck{Offset: c.Offset, Stepped: true}
		}
	}
	g.mu.Lock()
	prev := g.check
	g.check, g.wall, g.mono, g.peers, g.steppedAt = c, wall, mono, len(all), steppedAt
	if prev.InBound && !c.InBound {
		g.outOfBound++
	}
	g.mu.Unlock()
	switch {
	case prev.InBound && !c.InBound && c.Stepped:
		g.cfg.Logger.Error("this node's clock stepped: handing over its leaderships and leading nothing until its peers' clocks are measured again",
			"max_clock_offset", g.cfg.MaxOffset)
	case prev.InBound && !c.InBound:
		g.cfg.Logger.Error("this node's clock is out of bound: handing over its leaderships and leading nothing until it is back",
			"offset_from_median", c.Offset, "max_clock_offset", g.cfg.MaxOffset)
	case !prev.InBound && c.InBound:
		g.cfg.Logger.Warn("this node's clock is back in bound: it may lead again", "offset_from_median", c.Offset)
	}
	if !c.InBound {
		g.handOverLeaderships()
	}
}

// handOverLeaderships starts a leadership transfer for every partition
// this node leads that has none under way.
func (g *ClockGuard) handOverLeaderships() {
	for p, grp := range g.cfg.Groups() {
		if grp == nil || !grp.IsLeader() {
			continue
		}
		g.mu.Lock()
		if g.transferring == nil {
			g.transferring = map[uint16]bool{}
		}
		busy := g.transferring[uint16(p)]
		if !busy {
			g.transferring[uint16(p)] = true
			g.transfers++
		}
		g.mu.Unlock()
		if busy {
			continue
		}
		go func() {
			err := grp.TransferLeadership()
			if err != nil {
				g.cfg.Logger.Warn("handing over a leadership (clock out of bound) failed; trying again", "partition", p, "err", err)
			}
			g.mu.Lock()
			delete(g.transferring, uint16(p))
			g.mu.Unlock()
		}()
	}
}

// State returns the last clock check.
func (g *ClockGuard) State() ClockCheck {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.check
}

// Current is the last clock check corrected by how far this node's own
// clock has stepped since (its wall clock against the monotonic one): a
// step shows at once, not at the next Check.
func (g *ClockGuard) Current() ClockCheck {
	g.mu.Lock()
	c, wall, mono, peers := g.check, g.wall, g.mono, g.peers
	g.mu.Unlock()
	if peers < 2 || mono.IsZero() {
		return c // nothing to judge by (a step alone does not say which clock is right)
	}
	step := g.stepSince(wall, mono)
	if step > g.stepLimit() || step < -g.stepLimit() {
		return ClockCheck{Offset: c.Offset + step, Stepped: true}
	}
	if c.Known {
		max := g.cfg.MaxOffset
		c.Offset += step
		c.InBound = c.Offset <= max && c.Offset >= -max
	}
	return c
}

// MayLead refuses claim proposals while the clock is out of bound
// (claims.GroupConfig.MayLead), including right after a step of this
// node's clock that Check has not judged yet.
func (g *ClockGuard) MayLead() error {
	c := g.Current()
	if c.Stepped {
		return fmt.Errorf("this node's clock stepped: it leads nothing until its peers' clocks are measured again (max_clock_offset %s)", g.cfg.MaxOffset)
	}
	if !c.InBound {
		return fmt.Errorf("this node's clock is %s from the cluster median, beyond max_clock_offset %s: it leads nothing until it is back in bound",
			c.Offset.Round(time.Millisecond), g.cfg.MaxOffset)
	}
	return nil
}
