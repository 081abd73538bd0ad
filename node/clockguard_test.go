package node

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/claims"
)

// shiftClock is the system clock shifted by an offset that can change.
type shiftClock struct{ off atomic.Int64 }

func (c *shiftClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

func leads(m *member) int {
	k := 0
	for _, g := range m.node.groupList() {
		if g != nil && g.IsLeader() {
			k++
		}
	}
	return k
}

// TestClockOutOfBoundGivesUpLeaderships: a node whose clock is pushed
// beyond max_clock_offset from the others hands over every leadership
// within seconds, refuses claim proposals, reports unhealthy, and leads
// nothing while out of bound even when leaderships are pushed to it; back
// in bound, it is healthy and may lead again.
func TestClockOutOfBoundGivesUpLeaderships(t *testing.T) {
	clk := &shiftClock{}
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		cfg.MaxClockOffset = 500 * time.Millisecond
		if i == 0 {
			cfg.Clock = clk
		}
	})
	skewed := ms[0]
	// Give the skewed node some leaderships to lose.
	waitFor(t, 20*time.Second, "n1 to lead a partition", func() bool {
		if leads(skewed) > 0 {
			return true
		}
		for _, m := range ms[1:] {
			for _, g := range m.node.groupList() {
				if g != nil && g.IsLeader() {
					go g.TransferLeadership()
					return false
				}
			}
		}
		return false
	})
	waitFor(t, 10*time.Second, "n1 to measure both other clocks", func() bool {
		all, _, _ := skewed.node.clockGuard.PeerOffsets(time.Time{})
		return len(all) >= 2
	})
	clk.off.Store(int64(3 * time.Second))
	waitFor(t, 10*time.Second, "n1 to lead no partition", func() bool { return leads(skewed) == 0 })
	status := func() *nornv1.StatusResponse {
		r, err := skewed.node.server.AdminService().Status(context.Background(), connect.NewRequest(&nornv1.StatusRequest{SkipCounts: true}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg
	}
	st := status()
	if st.Healthy || len(st.Problems) == 0 {
		t.Fatalf("n1 out of bound reports healthy=%v problems=%v", st.Healthy, st.Problems)
	}
	if err := skewed.node.clockGuard.MayLead(); err == nil {
		t.Fatal("n1 out of bound may lead")
	}
	// Its groups refuse proposals for the clock (as a leader would).
	_, err := skewed.node.group(0).Propose(&claims.Command{Op: claims.OpExtend, NowMs: 1}, time.Second)
	if !errors.Is(err, claims.ErrNotLeader) || !strings.Contains(err.Error(), "max_clock_offset") {
		t.Fatalf("proposal on the skewed node: %v", err)
	}
	// Leaderships pushed to it come back to the others, and claims through
	// it are served by them meanwhile.
	for range 3 {
		for _, m := range ms[1:] {
			for _, g := range m.node.groupList() {
				if g != nil && g.IsLeader() {
					g.TransferLeadership()
					break
				}
			}
		}
		waitFor(t, 10*time.Second, "n1 to hand back what it got", func() bool { return leads(skewed) == 0 })
	}
	id, _ := enqueueEverywhere(t, ms, "clockq")
	resp, err := skewed.api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{Queue: "clockq", Worker: "w", Max: 1}))
	if err != nil || len(resp.Msg.Tasks) != 1 || resp.Msg.Tasks[0].Task.Id != id {
		t.Fatalf("claim through the skewed node: %v %v", resp, err)
	}
	if l := nodeIDAt(ms, resp.Msg.Tasks[0].Leader); l == "n1" || l == "" {
		t.Fatalf("claim granted by %q, want another node", l)
	}
	clk.off.Store(0)
	waitFor(t, 10*time.Second, "n1 back in bound", func() bool { return skewed.node.clockGuard.MayLead() == nil })
	st = status()
	if !st.Healthy || len(st.Problems) != 0 {
		t.Fatalf("n1 back in bound reports healthy=%v problems=%v", st.Healthy, st.Problems)
	}
	for _, ns := range st.Nodes {
		if ns.MedianOffset == nil {
			t.Fatalf("no median offset for %s", ns.Id)
		}
	}
}

// TestClockStepWithStalePeerOffset: a node whose clock steps right after
// a peer's clock stepped back (its estimate of that peer still predates
// the peer's step) must not judge itself in bound on the stale estimate:
// with n3's old +60 s and its own +27 s, the median would be itself.
func TestClockStepWithStalePeerOffset(t *testing.T) {
	c1, c3 := &shiftClock{}, &shiftClock{}
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		cfg.MaxClockOffset = 500 * time.Millisecond
		switch i {
		case 0:
			cfg.Clock = c1
		case 2:
			cfg.Clock = c3
		}
	})
	n1 := ms[0].node
	c3.off.Store(int64(60 * time.Second))
	waitFor(t, 20*time.Second, "n1 to see n3 60 s ahead, and n2", func() bool {
		seen := 0
		for _, m := range n1.host.Members().Members() {
			if m.ID == "n3" && m.OffsetKnown && m.ClockOffset > 59*time.Second || m.ID == "n2" && m.OffsetKnown {
				seen++
			}
		}
		return seen == 2 && n1.clockGuard.State().Known
	})
	c3.off.Store(0)
	c1.off.Store(int64(27 * time.Second))
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if err := n1.clockGuard.MayLead(); err == nil {
			t.Fatalf("n1, 27 s ahead, may lead (last check %+v; members %+v)", n1.clockGuard.State(), n1.host.Members().Members())
		}
		time.Sleep(20 * time.Millisecond)
	}
	c1.off.Store(0)
	waitFor(t, 10*time.Second, "n1 back in bound", func() bool { return n1.clockGuard.MayLead() == nil })
}

// TestSkewBufferLargestInCluster: each node gossips its skew buffer, and
// every node's leader expiries wait the largest (a rolling change that
// lowers the buffer on some nodes first leaves the others' in force).
func TestSkewBufferLargestInCluster(t *testing.T) {
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		if i == 2 {
			cfg.SkewBuffer = 5 * time.Second
		}
	})
	waitFor(t, 10*time.Second, "every node to wait the largest skew buffer", func() bool {
		for _, m := range ms {
			if m.node.host.SkewBuffer() != 5*time.Second {
				return false
			}
		}
		return true
	})
}
