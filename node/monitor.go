package node

import (
	"context"
	"time"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/replicas"
)

// monitorBatch bounds the claims and delayed tasks one monitor pass handles
// per partition.
const monitorBatch = 256

// monitor runs the leader's periodic duties until Close.
func (n *Node) monitor() { n.every(n.cfg.MonitorInterval, n.monitorOnce) }

// every runs fn now and then every d until Close (a goroutine counted in
// n.stopped).
func (n *Node) every(d time.Duration, fn func()) {
	defer n.stopped.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		fn()
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
	}
}

// monitorOnce does one pass over the partitions this node leads: on a
// new leadership it first extends every live claim to at least now +
// lease grace; then it expires claims past expiry + skew buffer, deletes
// terminal tasks past retention and promotes delayed tasks whose time has
// come.
func (n *Node) monitorOnce() {
	n.monitorMu.Lock()
	defer n.monitorMu.Unlock()
	extended := n.extended
	clockOK := n.clockGuard.State().InBound
	for p, g := range n.host.Groups() {
		if g == nil {
			continue
		}
		// Every replica promotes its delayed tasks, so that waiting
		// claims on every cohort member wake when a task's time comes
		// (storage's OnReady), and a new leader's index is current.
		if _, err := n.store.PromoteDelayed(uint16(p), monitorBatch); err != nil {
			n.cfg.Logger.Warn("promoting delayed tasks failed", "partition", p, "err", err)
		}
		if !g.IsLeader() || !clockOK {
			// A leader whose clock is out of bound is handing its
			// leadership over (the clock guard): no lease work on its clock.
			extended[p] = false
			// Every replica deletes its terminal tasks past retention, so
			// that replicas agree (anti-entropy compares what is kept).
			n.deleteExpiredTasks(uint16(p))
			continue
		}
		if !extended[p] {
			if err := n.extendClaims(uint16(p)); err != nil {
				n.cfg.Logger.Warn("extending claims on leadership failed", "partition", p, "err", err)
				continue // no expiries before the extension is in
			}
			extended[p] = true
		}
		n.expireClaims(uint16(p))
		n.deleteExpiredTasks(uint16(p))
	}
}

// extendClaims proposes OpExtend for the partition's live claims that
// expire before now + lease grace.
func (n *Node) extendClaims(p uint16) error {
	if err := n.host.Group(p).Barrier(replicas.ProposeTimeout); err != nil {
		return err
	}
	now := n.cfg.Clock.Now().UnixMilli()
	minExpiry := now + n.cfg.LeaseGrace.Milliseconds()
	for {
		due, err := n.store.ClaimsExpiring(p, minExpiry-1, monitorBatch)
		if err != nil || len(due) == 0 {
			return err
		}
		cmd := &claims.Command{Op: claims.OpExtend, NowMs: now, MinExpiryMs: minExpiry}
		for _, d := range due {
			cmd.IDs = append(cmd.IDs, d.ID)
		}
		outs, err := n.host.Group(p).Propose(cmd, replicas.ProposeTimeout)
		if err != nil {
			return err
		}
		progressed := false
		for _, o := range outs {
			progressed = progressed || o.Err == nil
		}
		if !progressed || len(due) < monitorBatch {
			return nil
		}
	}
}

// expireClaims ends the partition's claims whose lease plus skew buffer has
// passed on this leader's clock: OpEnd when the task is terminal by now,
// OpExpire otherwise. A claim that reaches max_claims aborts its task.
func (n *Node) expireClaims(p uint16) {
	now := n.cfg.Clock.Now().UnixMilli()
	skew := n.cfg.SkewBuffer.Milliseconds()
	if n.cfg.TestBugs.ExpiryNoSkew {
		skew = 0 // the seeded bug: expire at the expiry itself
	}
	due, err := n.store.ClaimsExpiring(p, now-skew-1, monitorBatch)
	if err != nil {
		n.cfg.Logger.Warn("scanning expired claims failed", "partition", p, "err", err)
		return
	}
	for _, d := range due {
		ts, err := n.coord.Load(d.ID)
		var rec *claims.Record
		if err == nil {
			rec = ts.Claims
		} else {
			rec, _ = n.coord.ClaimRecord(p, d.ID) // claimed before the task reached us
		}
		if rec == nil {
			continue
		}
		c, live := rec.Live()
		if !live {
			continue
		}
		if ts != nil && n.endIfTerminal(ts) {
			continue
		}
		cmd := &claims.Command{Op: claims.OpExpire, NowMs: now, ID: d.ID, Token: c.Token, SkewMs: skew}
		o, err := n.propose(d.ID, cmd)
		if err != nil {
			n.cfg.Logger.Warn("expiring a claim failed", "id", d.ID, "claim", c.Token, "err", err)
			continue
		}
		if o.Dead && ts != nil {
			n.abortDead(ts, rec.MaxClaims)
		}
	}
}

// deleteExpiredTasks deletes the partition's terminal tasks whose terminal
// event is older than the retention (expireBefore: on the leader the claim
// FSM forgets their records first).
func (n *Node) deleteExpiredTasks(p uint16) {
	if err := n.expireBefore(p, n.retentionHorizon()); err != nil {
		n.cfg.Logger.Warn("deleting expired tasks failed", "partition", p, "err", err)
	}
}

// abortDead writes the ABORTED terminal event of a task whose claims
// expired max_claims times.
func (n *Node) abortDead(ts *coord.TaskState, limit uint32) {
	n.abortTask(ts, coord.MaxClaimsError(limit))
}

// abortTask writes an ABORTED terminal event with one server error (the
// task is not claimed by anyone, or its claim just ended) and ends the
// claim FSM's record of it.
func (n *Node) abortTask(ts *coord.TaskState, e *nornv1.TaskError) {
	ev := crdt.Terminal{At: n.hlc.Now(), Kind: crdt.Aborted,
		Errors: []crdt.TaskError{{Code: e.Code, Description: e.Description, Args: e.Args}}}
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.WriteTimeout)
	defer cancel()
	// The claim ends when the event reaches the leader's replica (here).
	if _, err := n.coord.Write(ctx, []*crdt.Task{{ID: ts.Task.ID, Terminals: []crdt.Terminal{ev}}}, 0, []uint64{ts.Task.ID}); err != nil {
		n.cfg.Logger.Warn("aborting a task failed", "id", ts.Task.ID, "code", e.Code, "err", err)
	}
}
