package replicas

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// Handing the leaderships over before a node stops (SIGTERM): without
// it, the partitions the node led have no leader until the others' Raft
// election timeout fires, and their claims answer UNAVAILABLE meanwhile.

// HandOverParallel bounds the leadership transfers HandOver runs at once.
const HandOverParallel = 8

// handOverRetry is how long HandOver waits before it plans again after a
// round that handed nothing over (a transfer already under way, say the
// clock guard's).
const handOverRetry = 100 * time.Millisecond

// HandOverResult is what a hand-over did.
type HandOverResult struct {
	// Led is how many partition groups this node led when it began.
	Led int
	// HandedOver counts the transfers that took effect, Failed the ones
	// that failed (their partitions were planned again, without the
	// voter that failed).
	HandedOver, Failed int
	// Left lists the partitions this node still led when it stopped,
	// and Reason says why ("" when Left is empty).
	Left   []int
	Reason string
	// Meta: this node led the meta group and handed it over.
	Meta bool
}

// handOverPlan is one round of a hand-over: the transfers and the Raft
// address of each target, over the groups as they were listed.
type handOverPlan struct {
	groups    []LeaderGroup
	led       []int
	transfers []LeaderTransfer
	addrs     map[int]string // partition -> its target's Raft address
	reason    string         // why some of led have no transfer
}

// HandOver makes this node stop leading for good (it is about to shut
// down) and hands every partition leadership it holds over, then
// returns:
//
//  1. From now on Pass hands nothing over and gossips that this node
//     may not lead (cluster.LeaderMeta.NoLead, as while its clock guard
//     refuses), so no other node's balancer hands it a leadership; this
//     word is gossiped first (waiting up to publishTimeout for the
//     broadcast).
//  2. It plans a target for each leadership with PlanLeaderHandOver
//     over the balancer's view: voters that are eligible (a node still
//     settling counts), so the nodes that stay end balanced.
//  3. It runs the transfers, at most parallel at once.
//  4. While it still leads a partition (a transfer failed, and its
//     target is left out of the next plans, or another node's balancer
//     handed it one before it heard), it plans again, until ctx ends.
//
// It returns at once when there is nothing to hand over, when no
// partition it leads has a voter that may take it (a cluster of one:
// Reason says so), and when ctx ends; the transfers then under way
// finish or fail by themselves (a group's Shutdown ends its transfer).
// The claim groups keep serving proposals meanwhile (a group refuses
// them only while its own transfer runs). Call it once.
func (b *LeaderBalancer) HandOver(ctx context.Context, parallel int) HandOverResult {
	b.handingOver.Store(true)
	defer b.handingOver.Store(false)
	b.leaving.Store(true)
	parallel = max(parallel, 1)
	var res HandOverResult
	failed := map[string]bool{}
	for round := 0; ; round++ {
		plan := b.planHandOver(failed)
		if round == 0 {
			res.Led = len(plan.led)
		}
		if len(plan.led) == 0 {
			res.Left, res.Reason = nil, ""
			return res
		}
		res.Left, res.Reason = plan.led, plan.reason
		if len(plan.transfers) == 0 {
			return res
		}
		if progress := b.runHandOver(ctx, plan, parallel, failed, &res); !progress && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(handOverRetry):
			}
		}
		if ctx.Err() != nil {
			res.Left, res.Reason = b.stillLed(), ""
			if len(res.Left) > 0 {
				res.Reason = "stopped before every leadership was handed over: " + context.Cause(ctx).Error()
			}
			return res
		}
	}
}

// planHandOver lists the partitions this node leads and plans where
// each goes (see HandOver), leaving out the voters in failed.
func (b *LeaderBalancer) planHandOver(failed map[string]bool) handOverPlan {
	b.passMu.Lock()
	defer b.passMu.Unlock()
	groups := b.cfg.Groups()
	seen, led := b.countLocal(groups)
	plan := handOverPlan{groups: groups, led: led, addrs: map[int]string{}}
	r := b.cfg.Ring()
	if r == nil {
		plan.reason = "the cluster is not formed"
		return plan
	}
	b.publish(len(led), false)
	if len(led) == 0 {
		return plan
	}
	v := b.view(r, seen, len(led), false)
	for id := range v.Eligible {
		v.Eligible[id] = true // settling or not: a transfer waits until its target caught up
	}
	addrs := map[int]map[string]string{}
	others, untried := false, false
	for _, p := range led {
		servers, err := groups[p].Servers()
		if err != nil {
			continue
		}
		for _, s := range servers {
			if !s.Voter || s.ID == b.cfg.NodeID {
				continue
			}
			others = true
			if failed[s.ID] {
				continue
			}
			untried = untried || v.Eligible[s.ID]
			v.Led[p] = append(v.Led[p], s.ID)
			if addrs[p] == nil {
				addrs[p] = map[string]string{}
			}
			addrs[p][s.ID] = s.Address
		}
	}
	plan.transfers = PlanLeaderHandOver(v)
	for _, tr := range plan.transfers {
		plan.addrs[tr.Partition] = addrs[tr.Partition][tr.To]
	}
	switch {
	case len(plan.transfers) == len(led):
	case !others:
		plan.reason = reasonOnlyVoter
	case !untried && len(failed) > 0:
		plan.reason = "the transfers to every voter that may lead failed"
	default:
		plan.reason = "no other voter may lead (alive as gossip sees it, a ring member, its clock in bound, not stopping, telling its leader count)"
	}
	return plan
}

// runHandOver runs plan's transfers, at most parallel at once, and
// records them in res and the targets that failed in failed, until
// they are done or ctx ends (the transfers under way then go on alone).
// It reports whether a transfer took effect or a target failed.
func (b *LeaderBalancer) runHandOver(ctx context.Context, plan handOverPlan, parallel int, failed map[string]bool, res *HandOverResult) (progress bool) {
	type outcome struct {
		tr  LeaderTransfer
		err error
	}
	results := make(chan outcome, len(plan.transfers))
	sem := make(chan struct{}, parallel)
	started := 0
	collect := func(o outcome) {
		switch {
		case o.err == nil:
			res.HandedOver++
			progress = true
			b.cfg.Logger.Debug("handed a leadership over before stopping", "partition", o.tr.Partition, "to", o.tr.To)
		case errors.Is(o.err, errNotLeading), errors.Is(o.err, raft.ErrLeadershipTransferInProgress):
			// Lost it meanwhile, or another transfer of it runs: the
			// next plan sees.
		default:
			res.Failed++
			progress = true
			failed[o.tr.To] = true
			b.cfg.Logger.Warn("handing a leadership over before stopping failed; planning it again without that voter",
				"partition", o.tr.Partition, "to", o.tr.To, "err", o.err)
		}
	}
	for _, tr := range plan.transfers {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return progress
		}
		started++
		g, addr := plan.groups[tr.Partition], plan.addrs[tr.Partition]
		go func() {
			defer func() { <-sem }()
			if !g.IsLeader() {
				results <- outcome{tr, errNotLeading}
				return
			}
			results <- outcome{tr, g.TransferLeadershipTo(tr.To, addr)}
		}()
	}
	for ; started > 0; started-- {
		select {
		case o := <-results:
			collect(o)
		case <-ctx.Done():
			return progress
		}
	}
	return progress
}

// handOverAgainTimeout bounds one round of handOverAgain.
const handOverAgainTimeout = 10 * time.Second

// handedOver reports whether HandOver has run and returned: the node is
// stopping.
func (b *LeaderBalancer) handedOver() bool { return b.leaving.Load() && !b.handingOver.Load() }

// handOverAgain hands over, in one round, the leaderships a stopping node
// was given after HandOver returned: Raft has no "may not campaign", so a
// follower whose election timer fires before the new leader's heartbeat
// arrives (a loaded machine) can win an election while the node waits to
// close (found by the node test TestHandOverBeforeStop under load: the
// stopping node led a partition again for 12 s). Pass runs it, every
// leader-balance interval, until the node closes.
func (b *LeaderBalancer) handOverAgain() {
	failed := map[string]bool{}
	plan := b.planHandOver(failed)
	if len(plan.transfers) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handOverAgainTimeout)
	defer cancel()
	var res HandOverResult
	b.runHandOver(ctx, plan, HandOverParallel, failed, &res)
	b.cfg.Logger.Info("stopping: handed over leaderships given back after the hand-over (elected again)",
		"led", len(plan.led), "transfers", res.HandedOver, "failed", res.Failed)
}

// reasonOnlyVoter is HandOverResult.Reason when no partition this node
// leads has another voter (a cluster of one).
const reasonOnlyVoter = "this node is the only voter of the partitions it leads"

// errNotLeading marks a planned transfer whose group this node no longer
// led when its turn came.
var errNotLeading = errors.New("replicas: no longer the leader")

// stillLed lists the partitions this node leads now.
func (b *LeaderBalancer) stillLed() []int {
	_, led := b.countLocal(b.cfg.Groups())
	return led
}

// HandOver stops this node leading for good and hands its partition
// leaderships over (LeaderBalancer.HandOver) and, at the same time, its
// leadership of the meta group, if it has it and the group has another
// voter (to the most up-to-date one, as Raft chooses). It logs what it did
// and returns when done or when ctx ends.
func (h *Host) HandOver(ctx context.Context) HandOverResult {
	start := time.Now()
	meta := make(chan bool, 1)
	go func() { meta <- h.handOverMeta() }()
	res := h.leaders.HandOver(ctx, HandOverParallel)
	select {
	case res.Meta = <-meta:
	case <-ctx.Done():
	}
	took := time.Since(start).Round(time.Millisecond)
	switch {
	case res.Led == 0 && len(res.Left) == 0:
		h.cfg.Logger.Info("stopping: no partition leadership to hand over", "meta_handed_over", res.Meta, "took", took)
	case res.HandedOver == 0 && res.Reason == reasonOnlyVoter:
		h.cfg.Logger.Info("stopping: no leadership to hand over: "+res.Reason, "led", res.Led, "took", took)
	case len(res.Left) == 0:
		h.cfg.Logger.Info("stopping: handed every partition leadership over", "led", res.Led, "transfers", res.HandedOver,
			"failed", res.Failed, "meta_handed_over", res.Meta, "took", took)
	default:
		h.cfg.Logger.Warn("stopping: some partition leaderships were not handed over; their other voters elect new leaders after the Raft timeout",
			"led", res.Led, "left", len(res.Left), "reason", res.Reason, "transfers", res.HandedOver, "failed", res.Failed,
			"meta_handed_over", res.Meta, "took", took)
	}
	return res
}

// handOverMeta hands the meta group's leadership over when this node has
// it and the group has another voter; it reports whether it did.
func (h *Host) handOverMeta() bool {
	if h.meta == nil || !h.meta.IsLeader() {
		return false
	}
	voters, err := h.meta.Voters()
	if err != nil || !slices.ContainsFunc(voters, func(id string) bool { return id != h.cfg.NodeID }) {
		return false
	}
	if err := h.meta.TransferLeadership(); err != nil {
		h.cfg.Logger.Warn("handing the meta group's leadership over before stopping failed", "err", err)
		return false
	}
	return true
}
