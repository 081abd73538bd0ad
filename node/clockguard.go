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
	// Stepped: this node's clock stepped by more than the max offset,
	// and fewer than two peers' clocks have been sampled since:
	// out of bound until they have (the older estimates may predate the
	// peers' own steps).
	Stepped bool
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
	peers        int             // peers with a measured offset at check
	steppedAt    time.Time       // when this node's own clock step was seen (monotonic), zero when settled
	transferring map[uint16]bool // leadership transfers under way
	outOfBound   uint64          // times the clock went out of bound (metric)
	transfers    uint64          // leadership transfers started for the clock (metric)
}

// peerOffsets returns the clock offsets gossip has measured for the other
// alive members (their clock minus this node's), and of those the ones
// sampled after since.
func (n *Node) peerOffsets(since time.Time) (all, fresh []time.Duration) {
	for _, m := range n.host.Members().Members() {
		if m.ID != n.cfg.NodeID && m.State.Up() && m.OffsetKnown {
			all = append(all, m.ClockOffset)
			if m.OffsetAt.After(since) {
				fresh = append(fresh, m.ClockOffset)
			}
		}
	}
	return all, fresh
}

// clockLoop judges the clock every monitor interval until Close, apart
// from the monitor, whose passes can wait on Raft for seconds.
func (n *Node) clockLoop() {
	defer n.stopped.Done()
	t := time.NewTicker(n.cfg.MonitorInterval)
	defer t.Stop()
	for {
		n.checkClock()
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
	}
}

// stepSince is how far this node's wall clock has moved against the
// monotonic one since wall and mono were read together (0 for a steady
// clock).
func (n *Node) stepSince(wall, mono time.Time) time.Duration {
	return n.cfg.Clock.Now().Round(0).Sub(wall) - time.Since(mono)
}

// stepSettleMax bounds how long a node whose clock stepped waits for
// fresh peer offsets before it judges by the ones it has.
const stepSettleMax = 30 * time.Second

// stepLimit is how far this node's own clock may step between two
// judgements before it waits for fresh peer offsets (Stepped): a smaller
// step is judged at once on the corrected offsets.
func (n *Node) stepLimit() time.Duration { return n.cfg.MaxClockOffset }

// checkClock judges the clock again (clockLoop), logs a change
// and, while out of bound, hands over the leaderships this node holds.
func (n *Node) checkClock() {
	g := &n.clockGuard
	wall, mono := n.cfg.Clock.Now().Round(0), time.Now()
	g.mu.Lock()
	if !g.mono.IsZero() {
		if step := wall.Sub(g.wall) - mono.Sub(g.mono); step > n.stepLimit() || step < -n.stepLimit() {
			g.steppedAt = mono
		}
	}
	steppedAt, prevPeers := g.steppedAt, g.peers
	g.mu.Unlock()
	all, fresh := n.peerOffsets(steppedAt)
	c := judgeClock(all, n.cfg.MaxClockOffset)
	if !steppedAt.IsZero() {
		switch {
		case len(fresh) >= 2:
			c, steppedAt = judgeClock(fresh, n.cfg.MaxClockOffset), time.Time{}
		case len(all) < 2 && prevPeers < 2, mono.Sub(steppedAt) > stepSettleMax:
			steppedAt = time.Time{} // nothing to judge by, or no fresh offsets for too long
		default:
			c = clockCheck{Offset: c.Offset, Stepped: true}
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
		n.cfg.Logger.Error("this node's clock stepped: handing over its leaderships and leading nothing until its peers' clocks are measured again",
			"max_clock_offset", n.cfg.MaxClockOffset)
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
	for p, grp := range n.host.Groups() {
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
	c, wall, mono, peers := n.clockGuard.check, n.clockGuard.wall, n.clockGuard.mono, n.clockGuard.peers
	n.clockGuard.mu.Unlock()
	if peers < 2 || mono.IsZero() {
		return c // nothing to judge by (a step alone does not say which clock is right)
	}
	step := n.stepSince(wall, mono)
	if step > n.stepLimit() || step < -n.stepLimit() {
		return clockCheck{Offset: c.Offset + step, Stepped: true}
	}
	if c.Known {
		max := n.cfg.MaxClockOffset
		c.Offset += step
		c.InBound = c.Offset <= max && c.Offset >= -max
	}
	return c
}

// mayLead refuses claim proposals while the clock is out of bound
// (claims.GroupConfig.MayLead), including right after a step of this
// node's clock that the monitor has not judged yet.
func (n *Node) mayLead() error {
	c := n.clockNow()
	if c.Stepped {
		return fmt.Errorf("this node's clock stepped: it leads nothing until its peers' clocks are measured again (max_clock_offset %s)", n.cfg.MaxClockOffset)
	}
	if !c.InBound {
		return fmt.Errorf("this node's clock is %s from the cluster median, beyond max_clock_offset %s: it leads nothing until it is back in bound",
			c.Offset.Round(time.Millisecond), n.cfg.MaxClockOffset)
	}
	return nil
}
