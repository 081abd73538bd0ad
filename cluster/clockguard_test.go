package cluster

import (
	"errors"
	"log/slog"
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
	for _, tc := range []struct {
		name    string
		others  []time.Duration
		offset  time.Duration
		known   bool
		inBound bool
	}{
		{"alone", nil, 0, false, true},
		{"one other: no majority", []time.Duration{10 * s}, 0, false, true},
		{"in sync", []time.Duration{10 * time.Millisecond, -20 * time.Millisecond}, 0, true, true},
		{"this node 3 s ahead", []time.Duration{-3 * s, -3*s + 100*time.Millisecond}, 3*s - 100*time.Millisecond, true, false},
		{"this node 3 s behind", []time.Duration{3 * s, 3 * s}, -3 * s, true, false},
		{"another node off: the median is not", []time.Duration{0, 30 * s}, 0, true, true},
		{"just in bound", []time.Duration{-max, -max}, max, true, true},
		{"four clocks: mean of the middle two", []time.Duration{-2 * s, -2 * s, 5 * s}, s, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := JudgeClock(tc.others, max)
			if c.Offset != tc.offset || c.Known != tc.known || c.InBound != tc.inBound {
				t.Fatalf("JudgeClock(%v) = %+v, want offset %v known %v in bound %v", tc.others, c, tc.offset, tc.known, tc.inBound)
			}
		})
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
