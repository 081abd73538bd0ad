package cluster

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// ClockCheck is this node's clock judged against the cluster's (DESIGN
// section 4, clock sync), from the clock offsets gossip probes measured
// (JudgeClock has the rule).
type ClockCheck struct {
	// Offset is this node's clock minus the median of the measured
	// clocks, this one included (two or more peers measured), or minus
	// its one measured peer's clock. Valid only if Known.
	Offset time.Duration
	Peers  int  // peers whose offsets the check judged by
	Known  bool // Peers >= 1: Offset means something
	// InBound: |Offset| <= max, or the node is alone (it knows no other
	// member: every lease is granted and expired on its clock).
	InBound bool
	// Stepped: this node's clock stepped by more than the max offset,
	// and fewer than two peers' clocks (or its one peer's) have been
	// sampled since: out of bound until they have (the older estimates
	// may predate the peers' own steps).
	Stepped bool
	// Unjudged: the node knows other members but has measured none of
	// their clocks (they are down or cut off, or their probes were too
	// slow to judge by): out of bound, since nothing says its clock is
	// near theirs.
	Unjudged bool
}

// MaxOffsetError bounds the error of every clock offset estimate the
// guard judges by. An estimate is off by at most half the round trip of
// the probe it came from (Member.OffsetError); the guard leaves out
// estimates with a larger bound, as if the peer were not measured.
const MaxOffsetError = 50 * time.Millisecond

// ClockMeasurementError is how far two nodes' judgements of their clocks
// can be off together: each by MaxOffsetError.
const ClockMeasurementError = 2 * MaxOffsetError

// MinSkewBuffer is the pairwise clock offset the guard admits when its
// max offset is maxOffset: two nodes that both judge their clocks in
// bound can be 2 × maxOffset apart (one maxOffset behind the median,
// the other ahead of it), plus ClockMeasurementError. A lease granted on
// the slow one and expired on the fast one ends that much early on the
// fast one's clock, so the skew buffer must be larger
// (node.Config.Validate enforces it).
func MinSkewBuffer(maxOffset time.Duration) time.Duration {
	return 2*maxOffset + ClockMeasurementError
}

// JudgeClock judges this node's clock from the others' offsets (their
// clock minus this node's; each off by at most MaxOffsetError) against
// max:
//
//   - two or more: this node's offset from the median of all the clocks,
//     this one included;
//   - one: its offset from that peer's clock (pairwise), so that with one
//     node of three down the other two still lead while their clocks are
//     within max of each other;
//   - none: in bound only when alone (the node knows no other member);
//     otherwise Unjudged, out of bound.
//
// With three nodes, any two nodes that both judge themselves in bound
// are at most MinSkewBuffer(max) apart: both within max (+ the error)
// of the same median; or one within max of a peer and the other within
// max of the median of the three, which lies between them or is one of
// them; or each within max of a common peer. (With five nodes, two nodes
// that measure different subsets of the others can judge by different
// medians; docs/OPERATIONS.md, Time.)
func JudgeClock(others []time.Duration, max time.Duration, alone bool) ClockCheck {
	switch len(others) {
	case 0:
		return ClockCheck{InBound: alone, Unjudged: !alone}
	case 1:
		off := -others[0]
		return ClockCheck{Offset: off, Peers: 1, Known: true, InBound: off <= max && off >= -max}
	}
	med := Median(append([]time.Duration{0}, others...))
	off := -med
	return ClockCheck{Offset: off, Peers: len(others), Known: true, InBound: off <= max && off >= -max}
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
	// the alive nodes' clocks, or from its one measured peer's (the
	// node's MaxClockOffset); a step of its own clock beyond it makes the
	// node wait for fresh peer offsets.
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
	steppedAt    time.Time       // when this node's own clock step was seen (monotonic), zero when settled
	unjudgedAt   time.Time       // since when the check has been Unjudged (monotonic), zero when it is not
	transferring map[uint16]bool // leadership transfers under way
	outOfBound   uint64          // times the clock went out of bound, measured (metric)
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
	OutOfBound uint64     // times the clock went out of bound (measured: not Unjudged)
	Transfers  uint64     // leadership transfers started for the clock
}

// Stats returns the last check and the guard's counters.
func (g *ClockGuard) Stats() ClockGuardStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return ClockGuardStats{Check: g.check, OutOfBound: g.outOfBound, Transfers: g.transfers}
}

// PeerOffsets returns the clock offsets gossip has measured for the other
// alive members (their clock minus this node's) within MaxOffsetError,
// and of those the ones sampled after since; alone is true when gossip
// knows no other member that has not left.
func (g *ClockGuard) PeerOffsets(since time.Time) (all, fresh []time.Duration, alone bool) {
	alone = true
	for _, m := range g.cfg.Members() {
		if m.ID == g.cfg.NodeID || m.State == StateLeft {
			continue
		}
		alone = false
		if m.State.Up() && m.OffsetKnown && m.OffsetError <= MaxOffsetError {
			all = append(all, m.ClockOffset)
			if m.OffsetAt.After(since) {
				fresh = append(fresh, m.ClockOffset)
			}
		}
	}
	return all, fresh, alone
}

// stepSince is how far this node's wall clock has moved against the
// monotonic one since wall and mono were read together (0 for a steady
// clock).
func (g *ClockGuard) stepSince(wall, mono time.Time) time.Duration {
	return g.cfg.Clock.Now().Round(0).Sub(wall) - time.Since(mono)
}

// unjudgedHandOverAfter is how long an Unjudged node keeps its
// leaderships (refusing proposals) before it hands them over: a node
// that has just started or restarted measures its first peer within a
// probe interval or two, and the others may be just as blind, so an
// immediate hand-over would only move leaderships about.
const unjudgedHandOverAfter = 5 * time.Second

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
	steppedAt := g.steppedAt
	g.mu.Unlock()
	all, fresh, alone := g.PeerOffsets(steppedAt)
	c := JudgeClock(all, g.cfg.MaxOffset, alone)
	if !steppedAt.IsZero() {
		switch {
		case len(all) == 0, mono.Sub(steppedAt) > stepSettleMax:
			steppedAt = time.Time{} // no peer to wait for, or no fresh offsets for too long
		case len(fresh) >= min(2, len(all)):
			c, steppedAt = JudgeClock(fresh, g.cfg.MaxOffset, alone), time.Time{}
		default:
			c = ClockCheck{Offset: c.Offset, Peers: c.Peers, Known: c.Known, Stepped: true}
		}
	}
	g.mu.Lock()
	prev := g.check
	g.check, g.wall, g.mono, g.steppedAt = c, wall, mono, steppedAt
	switch {
	case !c.Unjudged:
		g.unjudgedAt = time.Time{}
	case g.unjudgedAt.IsZero():
		g.unjudgedAt = mono
	}
	handOver := !c.InBound && (!c.Unjudged || mono.Sub(g.unjudgedAt) > unjudgedHandOverAfter)
	if prev.InBound && !c.InBound && !c.Unjudged {
		g.outOfBound++
	}
	g.mu.Unlock()
	switch {
	case prev.InBound && !c.InBound && c.Stepped:
		g.cfg.Logger.Error("this node's clock stepped: handing over its leaderships and leading nothing until its peers' clocks are measured again",
			"max_clock_offset", g.cfg.MaxOffset)
	case prev.InBound && !c.InBound && c.Unjudged:
		g.cfg.Logger.Warn("this node has measured no peer's clock (its peers are down or cut off, or their probes too slow to judge by): handing over its leaderships and leading nothing until it has",
			"max_clock_offset", g.cfg.MaxOffset)
	case prev.InBound && !c.InBound && c.Peers == 1:
		g.cfg.Logger.Error("this node's clock is out of bound from its one measured peer's: handing over its leaderships and leading nothing until it is back",
			"offset_from_peer", c.Offset, "max_clock_offset", g.cfg.MaxOffset)
	case prev.InBound && !c.InBound:
		g.cfg.Logger.Error("this node's clock is out of bound: handing over its leaderships and leading nothing until it is back",
			"offset_from_median", c.Offset, "max_clock_offset", g.cfg.MaxOffset)
	case !prev.InBound && c.InBound:
		g.cfg.Logger.Warn("this node's clock is back in bound: it may lead again", "offset", c.Offset, "peers_measured", c.Peers)
	}
	if handOver {
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
	c, wall, mono := g.check, g.wall, g.mono
	g.mu.Unlock()
	if c.Peers == 0 || mono.IsZero() {
		return c // alone, or unjudged: a step changes nothing
	}
	step := g.stepSince(wall, mono)
	if step > g.stepLimit() || step < -g.stepLimit() {
		return ClockCheck{Offset: c.Offset + step, Peers: c.Peers, Known: c.Known, Stepped: true}
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
	switch {
	case c.InBound:
		return nil
	case c.Unjudged:
		return fmt.Errorf("this node has measured no peer's clock (its peers are down or cut off, or their probes too slow to judge by): it leads nothing until it has (max_clock_offset %s)",
			g.cfg.MaxOffset)
	case c.Peers == 1:
		return fmt.Errorf("this node's clock is %s from its one measured peer's, beyond max_clock_offset %s: it leads nothing until it is back in bound",
			c.Offset.Round(time.Millisecond), g.cfg.MaxOffset)
	}
	return fmt.Errorf("this node's clock is %s from the cluster median, beyond max_clock_offset %s: it leads nothing until it is back in bound",
		c.Offset.Round(time.Millisecond), g.cfg.MaxOffset)
}
