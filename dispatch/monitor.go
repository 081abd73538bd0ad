package dispatch

import (
	"context"
	"fmt"
	"time"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
)

// monitorBatch bounds the claims and delayed tasks one monitor pass handles
// per partition.
const monitorBatch = 256

// monitor runs the leader's periodic duties until Close.
func (d *Dispatcher) monitor() { d.every(d.cfg.MonitorInterval, d.MonitorOnce) }

// every runs fn now and then every period until Close (a goroutine
// counted in d.stopped).
func (d *Dispatcher) every(period time.Duration, fn func()) {
	defer d.stopped.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		fn()
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
	}
}

// MonitorOnce does one pass over the partitions this node leads: on a
// new leadership it first extends every live claim to at least now +
// lease grace; then it expires claims past expiry + skew buffer, cancels
// tasks past their deadline, deletes terminal tasks past retention and
// promotes delayed tasks whose time has come.
func (d *Dispatcher) MonitorOnce() {
	d.monitorMu.Lock()
	defer d.monitorMu.Unlock()
	extended := d.extended
	clockOK := d.cfg.ClockInBound == nil || d.cfg.ClockInBound()
	for p, g := range d.host.Groups() {
		if g == nil {
			continue
		}
		// Every replica promotes its delayed tasks, so that waiting
		// claims on every cohort member wake when a task's time comes
		// (storage's OnReady), and a new leader's index is current.
		if _, err := d.store.PromoteDelayed(uint16(p), monitorBatch); err != nil {
			d.cfg.Logger.Warn("promoting delayed tasks failed", "partition", p, "err", err)
		}
		if !g.IsLeader() || !clockOK {
			// A leader whose clock is out of bound is handing its
			// leadership over (the clock guard): no lease work on its clock.
			extended[p] = 0
			// Every replica deletes its terminal tasks past retention, so
			// that replicas agree (anti-entropy compares what is kept).
			d.deleteExpiredTasks(uint16(p))
			continue
		}
		// Read the term before the barrier: a leadership that flips
		// during the extension extends again on the next pass.
		if term := g.Term(); extended[p] != term {
			if err := d.extendClaims(uint16(p)); err != nil {
				d.cfg.Logger.Warn("extending claims on leadership failed", "partition", p, "err", err)
				continue // no expiries before the extension is in
			}
			extended[p] = term
		}
		d.expireClaims(uint16(p))
		d.cancelPastDeadlines(uint16(p))
		d.deleteExpiredTasks(uint16(p))
	}
	d.abortPendingDead()
}

// extendClaims proposes OpExtend for the partition's live claims that
// expire before now + lease grace.
func (d *Dispatcher) extendClaims(p uint16) error {
	if err := d.host.Group(p).Barrier(replicas.ProposeTimeout); err != nil {
		return err
	}
	now := d.cfg.Clock.Now().UnixMilli()
	minExpiry := now + d.cfg.LeaseGrace.Milliseconds()
	for {
		due, err := d.store.ClaimsExpiring(p, minExpiry-1, monitorBatch)
		if err != nil || len(due) == 0 {
			return err
		}
		cmd := &claims.Command{Op: claims.OpExtend, NowMs: now, MinExpiryMs: minExpiry}
		for _, e := range due {
			cmd.IDs = append(cmd.IDs, e.ID)
		}
		outs, err := d.host.Group(p).Propose(cmd, replicas.ProposeTimeout)
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
func (d *Dispatcher) expireClaims(p uint16) {
	now := d.cfg.Clock.Now().UnixMilli()
	skew := max(d.cfg.SkewBuffer, d.host.SkewBuffer()).Milliseconds() // the largest in the cluster: Host.SkewBuffer
	if testhooks.Built && d.cfg.ExpiryNoSkew {
		skew = 0 // the seeded bug: expire at the expiry itself
	}
	due, err := d.store.ClaimsExpiring(p, now-skew-1, monitorBatch)
	if err != nil {
		d.cfg.Logger.Warn("scanning expired claims failed", "partition", p, "err", err)
		return
	}
	for _, e := range due {
		ts, err := d.coord.Load(e.ID)
		var rec *claims.Record
		if err == nil {
			rec = ts.Claims
		} else {
			rec, _ = d.coord.ClaimRecord(p, e.ID) // claimed before the task reached us
		}
		if rec == nil {
			continue
		}
		c, live := rec.Live()
		if !live {
			continue
		}
		if ts != nil {
			// A task terminal without a worker's act (cancelled) or by
			// this claim's own: its claim ends as the task did. A terminal
			// event under another claim (written before the fence) cannot
			// end this one (OpEnd refuses it): the claim expires.
			if ev, terminal := ts.Task.Terminal(); terminal && (ev.Claim == 0 || ev.Claim == c.Token) {
				d.EndIfTerminal(ts)
				continue
			}
		}
		cmd := &claims.Command{Op: claims.OpExpire, NowMs: now, ID: e.ID, Token: c.Token, SkewMs: skew}
		o, err := d.Propose(e.ID, cmd)
		if err != nil {
			d.cfg.Logger.Warn("expiring a claim failed", "id", e.ID, "claim", c.Token, "err", err)
			continue
		}
		if d.cfg.OnExpired != nil {
			d.cfg.OnExpired(queueOf(ts))
		}
		if o.Died != nil {
			// The group merged the DEAD event into the replicas with the
			// expiry; the write takes it to a quorum now, rather than at
			// the followers' next commit notice, and tells the
			// dependants (coord's OnEnded).
			d.writeState(o.Died, "DEAD")
			continue
		}
		if o.Dead {
			if ts == nil {
				// The task's state has not reached this replica: read it
				// from a majority, or the abort would never be written.
				ctx, cancel := context.WithTimeout(context.Background(), d.cfg.WriteTimeout)
				ts, err = d.coord.Read(ctx, e.ID, 0)
				cancel()
				if err != nil {
					d.cfg.Logger.Warn("aborting a task past max_claims: reading it failed; the next pass tries again", "id", e.ID, "err", err)
					d.deadPending[e.ID] = rec.MaxClaims
					continue
				}
			}
			d.abortDead(ts, rec.MaxClaims)
		}
	}
}

// abortPendingDead writes the aborts of tasks past max_claims whose
// state could not be read when their last claim expired: every pass,
// until it is written, while this node leads the task's partition (a
// later leader's FSM record says dead too, but only the expiry that made
// it so writes the abort: see expireClaims).
func (d *Dispatcher) abortPendingDead() {
	for id, limit := range d.deadPending {
		g := d.host.Group(d.host.Partition(id))
		if g == nil || !g.IsLeader() {
			delete(d.deadPending, id)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), d.cfg.WriteTimeout)
		ts, err := d.coord.Read(ctx, id, 0)
		cancel()
		if err != nil {
			continue
		}
		d.abortDead(ts, limit)
		delete(d.deadPending, id)
	}
}

// deleteExpiredTasks deletes the partition's terminal tasks whose terminal
// event is older than their queue's retention (Expire: on the leader the
// claim FSM forgets their records first).
func (d *Dispatcher) deleteExpiredTasks(p uint16) {
	h, _ := d.RetentionHorizons()
	if err := d.Expire(p, h); err != nil {
		d.cfg.Logger.Warn("deleting expired tasks failed", "partition", p, "err", err)
	}
}

// abortDead writes the ABORTED terminal event of a task whose claims
// expired max_claims times.
func (d *Dispatcher) abortDead(ts *coord.TaskState, limit uint32) {
	d.abortTask(ts, coord.MaxClaimsError(limit))
}

// abortTask writes an ABORTED terminal event with one server error (the
// task is not claimed by anyone, or its claim just ended) and ends the
// claim FSM's record of it.
func (d *Dispatcher) abortTask(ts *coord.TaskState, e *nornv1.TaskError) {
	ev := crdt.Terminal{At: d.cfg.HLC.Now(), Kind: crdt.Aborted, Life: ts.Life(),
		Errors: []crdt.TaskError{{Code: e.Code, Description: e.Description, Args: e.Args}}}
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.WriteTimeout)
	defer cancel()
	// The claim ends when the event reaches the leader's replica (here).
	if _, err := d.coord.Write(ctx, []*crdt.Task{{ID: ts.Task.ID, Terminals: []crdt.Terminal{ev}}}, 0, []uint64{ts.Task.ID}); err != nil {
		d.cfg.Logger.Warn("aborting a task failed", "id", ts.Task.ID, "code", e.Code, "err", err)
	} else if d.cfg.OnAborted != nil {
		d.cfg.OnAborted(queueOf(ts))
	}
}

// writeState writes a task state the claim FSM decided (what) to the
// task's replicas at the default quorum.
func (d *Dispatcher) writeState(t *crdt.Task, what string) {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.WriteTimeout)
	defer cancel()
	if _, err := d.coord.Write(ctx, []*crdt.Task{t}, 0, []uint64{t.ID}); err != nil {
		d.cfg.Logger.Warn("writing a task's state failed; anti-entropy carries it", "id", t.ID, "state", what, "err", err)
	}
}

// queueOf is ts's queue, "" when ts is nil or its spec unknown here.
func queueOf(ts *coord.TaskState) string {
	if ts == nil || ts.Task == nil || ts.Task.Spec == nil {
		return ""
	}
	return ts.Task.Spec.Queue
}

// RetentionHorizon is now minus the node's retention (Unix ms): terminal
// tasks of a queue without a retention of its own that ended before it
// are deleted.
func (d *Dispatcher) RetentionHorizon() int64 {
	return d.cfg.Clock.Now().Add(-d.cfg.Retention).UnixMilli()
}

// RetentionHorizons are the horizons of every queue: now minus the
// node's retention, and minus their own for the queues that have one;
// and the version of the queue settings they come from.
func (d *Dispatcher) RetentionHorizons() (storage.Horizons, uint64) {
	now := d.cfg.Clock.Now()
	h := storage.Horizons{Default: now.Add(-d.cfg.Retention).UnixMilli()}
	if d.cfg.QueueRetention == nil {
		return h, 0
	}
	rs, v := d.cfg.QueueRetention()
	if len(rs) > 0 {
		h.Queues = make(map[string]int64, len(rs))
		for q, r := range rs {
			h.Queues[q] = now.Add(-r).UnixMilli()
		}
	}
	return h, v
}

// Expire deletes partition p's terminal tasks past their queue's horizon
// in h. On the partition's leader the claim FSM forgets their records
// first, through Raft; other replicas delete their task states alone.
// Anti-entropy calls it too (antientropy.ReplicaConfig.Expire), so that
// both sides of an exchange compare what they keep at common horizons.
func (d *Dispatcher) Expire(p uint16, h storage.Horizons) error {
	var forget func([]uint64) error
	if g := d.host.Group(p); g != nil && g.IsLeader() {
		forget = func(ids []uint64) error {
			cmd := &claims.Command{Op: claims.OpForget, NowMs: d.cfg.Clock.Now().UnixMilli(), IDs: ids}
			if _, err := g.Propose(cmd, replicas.ProposeTimeout); err != nil {
				return fmt.Errorf("forgetting expired tasks: %w", err)
			}
			return nil
		}
	}
	_, err := d.store.DeleteExpired(p, h, monitorBatch, forget)
	return err
}
