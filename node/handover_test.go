package node

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestHandOverBeforeStop: a node of a balanced 3-node cluster that hands
// its leaderships over (as nornd does on SIGTERM) leads nothing when
// HandOver returns, and every partition soon has a leader on the two
// others, as both see it. The survivors end balanced, it hands the meta
// group over too, and their balancers, passes later, have handed it
// nothing back (it gossiped that it may not lead). Closed then, it leads
// nothing, and the survivors go on leading every partition.
func TestHandOverBeforeStop(t *testing.T) {
	const partitions = 16
	ms := testClusterWith(t, 3, func(_ int, cfg *Config) {
		cfg.Partitions = partitions
		cfg.LeaderBalanceInterval = 100 * time.Millisecond
		cfg.LeaderBalanceRate = 20
	})
	// Balanced: each within its band of 16/3 (5 or 6).
	waitFor(t, 30*time.Second, "leaderships balanced", func() bool {
		for _, m := range ms {
			if k := leads(m); k < 5 || k > 6 {
				return false
			}
		}
		return true
	})
	// Stop the meta group's leader, to see that one handed over too.
	var gone *member
	var stay []*member
	for _, m := range ms {
		if gone == nil && m.node.host.Meta().IsLeader() {
			gone = m
		} else {
			stay = append(stay, m)
		}
	}
	if gone == nil {
		t.Fatal("no node leads the meta group")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := gone.node.HandOver(ctx)
	t.Logf("%s: %+v", gone.cfg.NodeID, res)
	if len(res.Left) != 0 || res.Reason != "" || res.Led == 0 || res.HandedOver < res.Led || !res.Meta {
		t.Fatalf("hand-over result %+v, want everything handed over, the meta group too", res)
	}
	if k := leads(gone); k != 0 {
		t.Fatalf("%s leads %d partitions after its hand-over", gone.cfg.NodeID, k)
	}
	// A transfer returns once the old leader stepped down; its target
	// wins the vote a moment later (5 s was too short once in CI, on a
	// loaded machine: the stopping node had been elected again, and kept
	// the leadership, before handOverAgain).
	var amiss error
	waitFor(t, 15*time.Second, "every partition led by a survivor, as both survivors see it", func() bool {
		amiss = ledBy(stay, partitions)
		if amiss != nil {
			t.Logf("%s: %v", time.Now().Format("15:04:05.000"), amiss)
		}
		return amiss == nil
	})
	for _, m := range stay {
		if l := m.node.host.Meta().Leader(); l != stay[0].cfg.NodeID && l != stay[1].cfg.NodeID {
			t.Fatalf("%s sees %q lead the meta group", m.cfg.NodeID, l)
		}
		// The survivors' share is 8 each now, band [7, 9].
		if k := leads(m); k < 7 || k > 9 {
			t.Fatalf("after the hand-over %s leads %d of %d, want 7 to 9", m.cfg.NodeID, k, partitions)
		}
	}

	// Three passes of each survivor's balancer after it saw the stopping
	// node as not eligible: it leads nothing. (On a loaded machine it may
	// win an election while it waits to close, since Raft has no "may not
	// campaign": its own balancer hands such a leadership over again at
	// its next pass, 100 ms here. The survivors' balancers hand it none:
	// replicas.TestLeaderBalancerHandOver.)
	handedBack := func() {
		if k := leads(gone); k != 0 {
			t.Logf("%s leads %d partitions again while stopping", gone.cfg.NodeID, k)
			waitFor(t, 3*time.Second, gone.cfg.NodeID+" to hand over the leaderships it was given again", func() bool { return leads(gone) == 0 })
		}
	}
	start := map[string]uint64{}
	waitFor(t, 10*time.Second, "the survivors' balancers to see "+gone.cfg.NodeID+" not eligible", func() bool {
		handedBack()
		for _, m := range stay {
			l, ok := m.node.host.LeaderLoads()[gone.cfg.NodeID]
			if !ok || l.Eligible {
				return false
			}
		}
		for _, m := range stay {
			start[m.cfg.NodeID] = m.node.host.LeaderBalanceStats().Passes
		}
		return true
	})
	waitFor(t, 10*time.Second, "three more passes of the survivors' balancers", func() bool {
		handedBack()
		for _, m := range stay {
			if m.node.host.LeaderBalanceStats().Passes < start[m.cfg.NodeID]+3 {
				return false
			}
		}
		return true
	})
	// It leads nothing as it closes. (Right after, a survivor may still
	// see an election under way: on a loaded machine the two survivors'
	// heartbeats can lapse, which the stopping node's own used to cover.
	// The survivors lead every partition again soon, without it.)
	handedBack()
	gone.stop()
	waitFor(t, 15*time.Second, "every partition led by a survivor after "+gone.cfg.NodeID+" closed", func() bool {
		amiss = ledBy(stay, partitions)
		if amiss != nil {
			t.Logf("%s: %v", time.Now().Format("15:04:05.000"), amiss)
		}
		return amiss == nil
	})
}

// ledBy returns nil when each of ms sees every partition's leader among
// ms, and one of ms leads it; otherwise what is amiss.
func ledBy(ms []*member, partitions int) error {
	ids := map[string]bool{}
	for _, m := range ms {
		ids[m.cfg.NodeID] = true
	}
	for p := range partitions {
		leaders := 0
		for _, m := range ms {
			g := m.node.group(uint16(p))
			if g == nil {
				return fmt.Errorf("%s has no group of partition %d", m.cfg.NodeID, p)
			}
			if l := string(g.Leader()); !ids[l] {
				return fmt.Errorf("%s sees %q lead partition %d", m.cfg.NodeID, l, p)
			}
			if g.IsLeader() {
				leaders++
			}
		}
		if leaders != 1 {
			return fmt.Errorf("partition %d: %d leaders among the survivors", p, leaders)
		}
	}
	return nil
}

// TestHandOverAlone: a cluster of one has no one to hand its leaderships
// to: HandOver returns at once (long before its deadline) and says why.
func TestHandOverAlone(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := h.node.HandOver(ctx)
	if ctx.Err() != nil {
		t.Fatal("HandOver waited for its deadline")
	}
	if res.Led != 8 || len(res.Left) != 8 || !strings.Contains(res.Reason, "only voter") || res.Meta {
		t.Fatalf("result %+v, want 8 led and left: the only voter", res)
	}
}
