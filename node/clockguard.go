package node

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// clockCheck is this node's clock judged against the cluster's (DESIGN
// section 4, clock sync): its offset from the median of the alive nodes'
// clocks, this one included, as gossip probes measure them.
type clockCheck struct {
	Offset  time.Duration // this node's clock minus the median
	Known   bool          // at least three clocks measured (this one and two others)
	InBound bool          // |Offset| <= max, or not Known (nothing to judge by)
}

// judgeClock judges this node's clock from the others' offsets (their
// clock minus this node's). With fewer than two others there is no
// majority to tell which clock is off: the node stays in bound.
func judgeClock(others []time.Duration, max time.Duration) clockCheck {
	if len(others) < 2 {
		return clockCheck{InBound: true}
	}
	med := median(append([]time.Duration{0}, others...))
	off := -med
	return clockCheck{Offset: off, Known: true, InBound: off <= max && off >= -max}
}

// median of ds (sorted in place): the middle one, or the mean of the two
// middle ones.
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	k := len(ds)
	if k%2 == 1 {
		return ds[k/2]
	}
	return ds[k/2-1] + (ds[k/2]-ds[k/2-1])/2
}

// clockGuard keeps this node's clock check current and, while the clock
// is out of bound, hands over every leadership the node holds (claims
// refuses its proposals meanwhile: mayLead).
type clockGuard struct {
	mu           sync.Mutex
	check        clockCheck
	wall, mono   time.Time       // when check was made: the wall clock (no monotonic reading) and time.Now()
	transferring map[uint16]bool // leadership transfers under way
	outOfBound   uint64          // times the clock went out of bound (metric)
	transfers    uint64          // leadership transfers started for the clock (metric)
}

// peerOffsets returns the clock offsets gossip has measured for the other
// alive members (their clock minus this node's).
func (n *Node) peerOffsets() []time.Duration {
	var out []time.Duration
	for _, m := range n.members.Members() {
		if m.ID != n.cfg.NodeID && m.State.Up() && m.OffsetKnown {
			out = append(out, m.ClockOffset)
		}
	}
	return out
}

// checkClock judges the clock again (every monitor pass), logs a change
// and, while out of bound, hands over the leaderships this node holds.
func (n *Node) checkClock() {
	c := judgeClock(n.peerOffsets(), n.cfg.MaxClockOffset)
	g := &n.clockGuard
	g.mu.Lock()
	prev := g.check
	g.check = c
	g.wall, g.mono = n.cfg.Clock.Now().Round(0), time.Now()
	if prev.InBound && !c.InBound {
		g.outOfBound++
	}
	g.mu.Unlock()
	switch {
	case prev.InBound && !c.InBound:
		n.cfg.Logger.Error("this node's clock is out of bound: handing over its leaderships and leading nothing until it is back",
			"offset_from_median", c.Offset, "max_clock_offset", n.cfg.MaxClockOffset)
	case !prev.InBound && c.InBound:
		n.cfg.Logger.Warn("this node's clock is back in bound: it may lead again", "offset_from_median", c.Offset)
	}
	if !c.InBound {
		n.handOverLeaderships()
	}
}

// handOverLeaderships starts a leadership transfer for every partition
// this node leads that has none under way.
func (n *Node) handOverLeaderships() {
	g := &n.clockGuard
	for p, grp := range n.groupList() {
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
				n.cfg.Logger.Warn("handing over a leadership (clock out of bound) failed; trying again", "partition", p, "err", err)
			}
			g.mu.Lock()
			delete(g.transferring, uint16(p))
			g.mu.Unlock()
		}()
	}
}

// clockState returns the last clock check.
func (n *Node) clockState() clockCheck {
	n.clockGuard.mu.Lock()
	defer n.clockGuard.mu.Unlock()
	return n.clockGuard.check
}

// clockNow is the last clock check corrected by how far this node's own
// clock has stepped since (its wall clock against the monotonic one): a
// step shows at once, not at the next monitor pass.
func (n *Node) clockNow() clockCheck {
	n.clockGuard.mu.Lock()
	c, wall, mono := n.clockGuard.check, n.clockGuard.wall, n.clockGuard.mono
	n.clockGuard.mu.Unlock()
	if !c.Known {
		return c // nothing to judge by (a step alone does not say which clock is right)
	}
	step := n.cfg.Clock.Now().Round(0).Sub(wall) - time.Since(mono)
	max := n.cfg.MaxClockOffset
	c.Offset += step
	c.InBound = c.Offset <= max && c.Offset >= -max
	return c
}

// mayLead refuses claim proposals while the clock is out of bound
// (claims.GroupConfig.MayLead), including right after a step of this
// node's clock that the monitor has not judged yet.
func (n *Node) mayLead() error {
	if c := n.clockNow(); !c.InBound {
		return fmt.Errorf("this node's clock is %s from the cluster median, beyond max_clock_offset %s: it leads nothing until it is back in bound",
			c.Offset.Round(time.Millisecond), n.cfg.MaxClockOffset)
	}
	return nil
}
