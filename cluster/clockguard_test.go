package cluster

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestJudgeClock(t *testing.T) {
	const max = 500 * time.Millisecond
	s := time.Second
	ms := time.Millisecond
	for _, tc := range []struct {
		name     string
		others   []time.Duration
		alone    bool
		offset   time.Duration
		peers    int
		inBound  bool
		unjudged bool
	}{
		{"alone: a cluster of one", nil, true, 0, 0, true, false},
		{"no peer measured", nil, false, 0, 0, false, true},
		{"one peer, close: two of three serve", []time.Duration{300 * ms}, false, -300 * ms, 1, true, false},
		{"one peer, just in bound", []time.Duration{-max}, false, max, 1, true, false},
		{"one peer, 10 s ahead", []time.Duration{10 * s}, false, -10 * s, 1, false, false},
		{"one peer, 600 ms behind", []time.Duration{-600 * ms}, false, 600 * ms, 1, false, false},
		{"in sync", []time.Duration{10 * ms, -20 * ms}, false, 0, 2, true, false},
		{"this node 3 s ahead", []time.Duration{-3 * s, -3*s + 100*ms}, false, 3*s - 100*ms, 2, false, false},
		{"this node 3 s behind", []time.Duration{3 * s, 3 * s}, false, -3 * s, 2, false, false},
		{"another node off: the median is not", []time.Duration{0, 30 * s}, false, 0, 2, true, false},
		{"just in bound", []time.Duration{-max, -max}, false, max, 2, true, false},
		{"four clocks: mean of the middle two", []time.Duration{-2 * s, -2 * s, 5 * s}, false, s, 3, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := JudgeClock(tc.others, max, tc.alone)
			if c.Offset != tc.offset || c.Peers != tc.peers || c.Known != (tc.peers > 0) || c.InBound != tc.inBound || c.Unjudged != tc.unjudged {
				t.Fatalf("JudgeClock(%v, alone %v) = %+v, want offset %v peers %d in bound %v unjudged %v",
					tc.others, tc.alone, c, tc.offset, tc.peers, tc.inBound, tc.unjudged)
			}
		})
	}
}

// TestJudgeClockPairwiseBound: in a cluster of three, any two nodes that
// both judge their clocks in bound are at most MinSkewBuffer(max) apart,
// whatever each node measures (both peers, one, none: a node down or cut
// off, links cut one way only) and however each estimate errs within
// MaxOffsetError. This is what the skew buffer must cover. (The rule
// before issue 41 judged a node with fewer than two measured peers in
// bound: clocks 10 s apart with the third node down both led.)
func TestJudgeClockPairwiseBound(t *testing.T) {
	const max = 500 * time.Millisecond
	rng := rand.New(rand.NewPCG(41, 3))
	span := int64(4 * max)
	errOf := func() time.Duration { return time.Duration(rng.Int64N(int64(2*MaxOffsetError)+1)) - MaxOffsetError }
	for i := range 200000 {
		var clocks [3]time.Duration
		for k := range clocks {
			clocks[k] = time.Duration(rng.Int64N(2*span+1) - span)
		}
		var in [3]bool
		var views [3][]time.Duration
		for k := range clocks {
			for j := range clocks {
				if j != k && rng.IntN(4) != 0 { // k measures j, 3 times in 4
					views[k] = append(views[k], clocks[j]-clocks[k]+errOf())
				}
			}
			in[k] = JudgeClock(slices.Clone(views[k]), max, false).InBound
		}
		for a := range clocks {
			for b := a + 1; b < len(clocks); b++ {
				if d := clocks[a] - clocks[b]; in[a] && in[b] && (d > MinSkewBuffer(max) || d < -MinSkewBuffer(max)) {
					t.Fatalf("case %d: clocks %v, views %v: nodes %d and %d both in bound, %v apart (MinSkewBuffer %v)",
						i, clocks, views, a, b, d, MinSkewBuffer(max))
				}
			}
		}
	}
}

func TestMinSkewBuffer(t *testing.T) {
	if got, want := MinSkewBuffer(500*time.Millisecond), 1100*time.Millisecond; got != want {
		t.Fatalf("MinSkewBuffer(500ms) = %v, want %v", got, want)
	}
}

// guardClock is the (fake, in a synctest bubble) time shifted by an
// offset that can change: this node's wall clock.
type guardClock struct{ off atomic.Int64 }

func (c *guardClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// guardMembers is gossip's view as the guard reads it: this node "a" and
// peers whose offsets the test sets.
type guardMembers struct {
	mu sync.Mutex
	ms []Member
}

// set makes the peers' offsets offs, sampled at (monotonic).
func (g *guardMembers) set(at time.Time, offs ...time.Duration) {
	ms := []Member{{NodeMeta: NodeMeta{ID: "a"}, State: StateAlive, OffsetKnown: true}}
	for i, off := range offs {
		ms = append(ms, Member{NodeMeta: NodeMeta{ID: string(rune('b' + i))}, State: StateAlive,
			ClockOffset: off, OffsetKnown: true, OffsetAt: at})
	}
	g.mu.Lock()
	g.ms = ms
	g.mu.Unlock()
}

func (g *guardMembers) get() []Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ms
}

// fakeLeader is a partition group: a transfer returns err (and leaves it
// the leader) once release, if set, is closed.
type fakeLeader struct {
	leader    bool
	err       error
	release   chan struct{}
	transfers atomic.Int32
}

func (l *fakeLeader) IsLeader() bool { return l.leader }

func (l *fakeLeader) TransferLeadership() error {
	l.transfers.Add(1)
	if l.release != nil {
		<-l.release
	}
	return l.err
}

func newGuard(clk Clock, members *guardMembers, groups ...Leader) *ClockGuard {
	return NewClockGuard(ClockGuardConfig{NodeID: "a", MaxOffset: 500 * time.Millisecond, Clock: clk,
		Logger: slog.New(slog.DiscardHandler), Members: members.get, Groups: func() []Leader { return groups }})
}

// TestClockGuardHandsOverLeaderships: out of bound, the guard starts one
// transfer per partition it leads and none for one already under way,
// tries a failed one again at the next check, and refuses to lead until
// the clock is back in bound.
func TestClockGuardHandsOverLeaderships(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		members := &guardMembers{}
		members.set(time.Now(), 10*time.Millisecond, -20*time.Millisecond)
		failing := &fakeLeader{leader: true, err: errors.New("no other voter")}
		slow := &fakeLeader{leader: true, release: make(chan struct{})}
		follower := &fakeLeader{}
		g := newGuard(&guardClock{}, members, failing, follower, nil, slow)
		if err := g.MayLead(); err != nil {
			t.Fatalf("before the first check: %v", err)
		}
		g.Check()
		synctest.Wait()
		if st := g.Stats(); !st.Check.InBound || !st.Check.Known || st.Transfers != 0 {
			t.Fatalf("in sync: %+v", st)
		}

		members.set(time.Now(), -3*time.Second, -3*time.Second) // this node 3 s ahead
		g.Check()
		synctest.Wait()
		st := g.Stats()
		if st.Check.InBound || st.Check.Offset != 3*time.Second || st.OutOfBound != 1 || st.Transfers != 2 {
			t.Fatalf("3 s ahead: %+v", st)
		}
		if failing.transfers.Load() != 1 || slow.transfers.Load() != 1 || follower.transfers.Load() != 0 {
			t.Fatalf("transfers: %d, %d, follower %d", failing.transfers.Load(), slow.transfers.Load(), follower.transfers.Load())
		}
		if err := g.MayLead(); err == nil || !strings.Contains(err.Error(), "3s from the cluster median, beyond max_clock_offset 500ms") {
			t.Fatalf("MayLead out of bound: %v", err)
		}

		g.Check()
		synctest.Wait()
		if st := g.Stats(); st.OutOfBound != 1 || st.Transfers != 3 || failing.transfers.Load() != 2 || slow.transfers.Load() != 1 {
			t.Fatalf("second check: %+v, transfers %d and %d", st, failing.transfers.Load(), slow.transfers.Load())
		}
		close(slow.release)
		synctest.Wait()

		members.set(time.Now(), 0, 0)
		g.Check()
		g.Check()
		synctest.Wait()
		if st := g.Stats(); !st.Check.InBound || st.Transfers != 3 {
			t.Fatalf("back in bound: %+v", st)
		}
		if err := g.MayLead(); err != nil {
			t.Fatalf("MayLead back in bound: %v", err)
		}
	})
}

// TestClockGuardStep: a step of this node's clock shows in MayLead at
// once; the next check waits (Stepped) until two peers have been sampled
// since the step, or stepSettleMax has passed, before it judges.
func TestClockGuardStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk, members := &guardClock{}, &guardMembers{}
		members.set(time.Now(), 0, 0)
		g := newGuard(clk, members)
		g.Check()
		if c := g.Current(); !c.InBound || !c.Known || c.Stepped {
			t.Fatalf("steady: %+v", c)
		}

		time.Sleep(time.Second)
		clk.off.Store(int64(27 * time.Second))
		if c := g.Current(); !c.Stepped || c.Offset != 27*time.Second {
			t.Fatalf("right after the step: %+v", c)
		}
		if err := g.MayLead(); err == nil || !strings.Contains(err.Error(), "stepped") {
			t.Fatalf("MayLead right after the step: %v", err)
		}
		// Gossip corrects the old estimates by the step: they say 27 s
		// ahead, but they predate the step.
		members.set(time.Now().Add(-time.Second), -27*time.Second, -27*time.Second)
		g.Check()
		if st := g.Stats(); !st.Check.Stepped || st.Check.InBound || st.OutOfBound != 1 {
			t.Fatalf("stepped, no fresh offsets: %+v", st)
		}

		time.Sleep(time.Second)
		members.set(time.Now(), -27*time.Second, -27*time.Second)
		g.Check()
		if c := g.State(); c.Stepped || c.InBound || c.Offset != 27*time.Second {
			t.Fatalf("fresh offsets: %+v", c)
		}
		if err := g.MayLead(); err == nil || !strings.Contains(err.Error(), "27s from the cluster median") {
			t.Fatalf("MayLead 27 s ahead: %v", err)
		}

		// Back: the clock steps again, and no fresh offset comes for
		// longer than stepSettleMax: the guard judges by the ones it has.
		clk.off.Store(0)
		members.set(time.Now(), 0, 0)
		g.Check()
		if c := g.State(); !c.Stepped {
			t.Fatalf("stepped back: %+v", c)
		}
		time.Sleep(stepSettleMax + time.Second)
		g.Check()
		if c := g.State(); c.Stepped || !c.InBound {
			t.Fatalf("after stepSettleMax: %+v", c)
		}
		if err := g.MayLead(); err != nil {
			t.Fatalf("MayLead back in bound: %v", err)
		}
	})
}

// setMembers makes gossip's view this node "a" and others.
func (g *guardMembers) setMembers(others ...Member) {
	ms := append([]Member{{NodeMeta: NodeMeta{ID: "a"}, State: StateAlive, OffsetKnown: true}}, others...)
	g.mu.Lock()
	g.ms = ms
	g.mu.Unlock()
}

// measured is a member of id measured at off (its clock minus this node's)
// from a probe whose error bound is errBound, sampled at.
func measured(id string, state MemberState, off, errBound time.Duration, at time.Time) Member {
	return Member{NodeMeta: NodeMeta{ID: id}, State: state, ClockOffset: off, OffsetKnown: true, OffsetError: errBound, OffsetAt: at}
}

// TestClockGuardOnePeer: with one node of three down, the guard judges
// this node's clock against its one measured peer's: it leads while the
// two are within the max offset of each other, and hands over its
// leaderships and refuses proposals (naming the peer rule) beyond it.
// Before issue 41 a node with one measured peer was in bound whatever
// the offset.
func TestClockGuardOnePeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		members := &guardMembers{}
		leader := &fakeLeader{leader: true, err: errors.New("no other voter")}
		g := newGuard(&guardClock{}, members, leader)
		members.setMembers(measured("b", StateAlive, 400*time.Millisecond, time.Millisecond, time.Now()),
			measured("c", StateDead, 0, time.Millisecond, time.Now()))
		g.Check()
		synctest.Wait()
		if st := g.Stats(); !st.Check.InBound || st.Check.Peers != 1 || st.Check.Offset != -400*time.Millisecond || st.Transfers != 0 {
			t.Fatalf("one peer 400 ms ahead: %+v", st)
		}
		if err := g.MayLead(); err != nil {
			t.Fatalf("MayLead with one peer in bound: %v", err)
		}

		members.setMembers(measured("b", StateAlive, 900*time.Millisecond, time.Millisecond, time.Now()),
			measured("c", StateDead, 0, time.Millisecond, time.Now()))
		g.Check()
		synctest.Wait()
		if st := g.Stats(); st.Check.InBound || st.Check.Peers != 1 || st.OutOfBound != 1 || st.Transfers != 1 {
			t.Fatalf("one peer 900 ms ahead: %+v", st)
		}
		if err := g.MayLead(); err == nil || !strings.Contains(err.Error(), "-900ms from its one measured peer's, beyond max_clock_offset 500ms") {
			t.Fatalf("MayLead out of bound from one peer: %v", err)
		}
	})
}

// TestClockGuardUnjudged: a node that knows other members but has
// measured none of them (down, cut off, or probes slower than
// MaxOffsetError allows) leads nothing until it has, and hands its
// leaderships over once that has lasted unjudgedHandOverAfter; a node
// alone in gossip (a cluster of one, or every other member left) leads.
func TestClockGuardUnjudged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		members := &guardMembers{}
		leader := &fakeLeader{leader: true, err: errors.New("no other voter")}
		g := newGuard(&guardClock{}, members, leader)
		members.setMembers()
		g.Check()
		if err := g.MayLead(); err != nil {
			t.Fatalf("alone: %v", err)
		}
		members.setMembers(measured("b", StateLeft, 0, 0, time.Now()))
		g.Check()
		if err := g.MayLead(); err != nil {
			t.Fatalf("alone, the other left: %v", err)
		}

		members.setMembers(measured("b", StateDead, 0, time.Millisecond, time.Now()),
			measured("c", StateAlive, 0, MaxOffsetError+time.Millisecond, time.Now()))
		g.Check()
		synctest.Wait()
		st := g.Stats()
		if st.Check.InBound || !st.Check.Unjudged || st.Check.Known || st.OutOfBound != 0 || st.Transfers != 0 {
			t.Fatalf("one peer dead, the other's probes too slow: %+v", st)
		}
		if err := g.MayLead(); err == nil || !strings.Contains(err.Error(), "measured no peer's clock") {
			t.Fatalf("MayLead unjudged: %v", err)
		}
		// It keeps its leaderships (refusing proposals) for
		// unjudgedHandOverAfter, then hands them over.
		time.Sleep(unjudgedHandOverAfter)
		g.Check()
		synctest.Wait()
		if st := g.Stats(); st.Transfers != 0 {
			t.Fatalf("unjudged for unjudgedHandOverAfter: %+v", st)
		}
		time.Sleep(time.Millisecond)
		g.Check()
		synctest.Wait()
		if st := g.Stats(); st.Transfers != 1 || leader.transfers.Load() != 1 {
			t.Fatalf("unjudged for longer: %+v", st)
		}

		members.setMembers(measured("b", StateDead, 0, time.Millisecond, time.Now()),
			measured("c", StateAlive, 10*time.Millisecond, MaxOffsetError, time.Now()))
		g.Check()
		if err := g.MayLead(); err != nil {
			t.Fatalf("a prompt probe of c: %v", err)
		}
	})
}

// TestClockGuardStepOnePeer: after a step of this node's clock, a node
// with one measured peer waits for a fresh sample of that peer, then
// judges by it.
func TestClockGuardStepOnePeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk, members := &guardClock{}, &guardMembers{}
		g := newGuard(clk, members)
		members.setMembers(measured("b", StateAlive, 0, time.Millisecond, time.Now()), measured("c", StateDead, 0, 0, time.Now()))
		g.Check()
		if c := g.Current(); !c.InBound || c.Peers != 1 {
			t.Fatalf("steady: %+v", c)
		}
		time.Sleep(time.Second)
		clk.off.Store(int64(5 * time.Second))
		if c := g.Current(); !c.Stepped {
			t.Fatalf("right after the step: %+v", c)
		}
		members.setMembers(measured("b", StateAlive, -5*time.Second, time.Millisecond, time.Now().Add(-time.Second)), measured("c", StateDead, 0, 0, time.Now()))
		g.Check()
		if c := g.State(); !c.Stepped || c.InBound {
			t.Fatalf("stepped, no fresh sample of b: %+v", c)
		}
		time.Sleep(time.Second)
		members.setMembers(measured("b", StateAlive, -5*time.Second, time.Millisecond, time.Now()), measured("c", StateDead, 0, 0, time.Now()))
		g.Check()
		if c := g.State(); c.Stepped || c.InBound || c.Offset != 5*time.Second {
			t.Fatalf("fresh sample of b: %+v", c)
		}
	})
}
