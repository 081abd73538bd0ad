package dispatch

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
)

// ClaimRequest is a claim whose fields the API edge has validated.
type ClaimRequest struct {
	// Msg is the request as the worker sent it (its queue, worker and
	// lease travel on with claims proxied to other nodes).
	Msg *nornv1.ClaimRequest
	// Lease is Msg's lease, defaulted and bounded.
	Lease time.Duration
	// Max is how many tasks to claim at most (at least 1).
	Max int
	// Wait is how long to long-poll for work, bounded by MaxWait and
	// the caller's deadline.
	Wait time.Duration
	// Proxied marks a claim another node forwarded: it looks at this
	// node's groups only and does not wait (the forwarding node waits).
	Proxied bool
	// Floor, when set, is the lowest priority a proxied claim takes: the
	// forwarding node weighed this node's heads against the others'
	// and asks for those that made the cut (remote.go).
	Floor *int32
	// IDs, when set, are the tasks a proxied claim takes, and no other:
	// the forwarding node picked these of this node's heads by their
	// fairness keys (fair.go), which this node's own pick could not
	// reproduce. Those no longer claimable here are left out.
	IDs []uint64
	// Hops is how often the claim was forwarded so far: a claim of a
	// limited queue on its way to the queue's owner (limits.go) is not
	// Proxied.
	Hops int
}

// claimArgs is what every round of one claim works with.
type claimArgs struct {
	msg     *nornv1.ClaimRequest // queue, worker and lease, as sent on to other leaders
	lease   time.Duration
	timeout time.Duration // bounds the proposals
	floor   *int32        // ClaimRequest.Floor
	ids     []uint64      // ClaimRequest.IDs
	across  bool          // weigh the other leaders' heads (remote.go)
}

// Claim claims up to req.Max ready tasks of a queue for a worker: the
// best of the partitions this node leads and, on a cluster of several
// nodes, of the partitions the other nodes lead (remote.go); when none is
// ready it waits up to req.Wait for one. It returns what it claimed,
// possibly nothing.
func (d *Dispatcher) Claim(ctx context.Context, req ClaimRequest) ([]*nornv1.ClaimedTask, error) {
	m, limit, wait := req.Msg, req.Max, req.Wait
	r := d.host.Ring()
	if r == nil {
		return nil, apierr.NotFormed
	}
	// A claim forwarded by another node looks at this node's groups only
	// and does not wait: the forwarding node waits.
	proxied := req.Proxied
	if proxied {
		wait = 0
	}
	lim := d.limitsOf(m.GetQueue())
	owner := false
	if lim.active() && !proxied {
		got, forwarded, err := d.claimViaOwner(ctx, req)
		if forwarded {
			return got, err
		}
		owner = true
	}
	a := claimArgs{msg: m, lease: req.Lease, floor: req.Floor, ids: req.IDs, across: !proxied && len(r.Nodes) > 1}
	if a.ids != nil {
		a.floor = nil // the ids were weighed; their priorities are not known before they are read
	}
	// Tasks of partitions this node does not replicate wake no local
	// waiter, and a task can become ready at its leader without a
	// wake-up here (a delayed task promoted there after this node
	// promoted it, before this claim came): a waiting claim looks across
	// the cluster again every ClaimRecheck.
	// The owner of a limited queue at its cap learns of ends elsewhere
	// from the other leaders' reports, and of its own without a wake-up:
	// it looks again every limitRecheck.
	var recheck <-chan time.Time
	if !proxied && (len(r.Nodes) > 1 || owner) && wait > 0 {
		every := d.cfg.ClaimRecheck
		if owner {
			every = min(every, limitRecheck)
		}
		t := time.NewTicker(every)
		defer t.Stop()
		recheck = t.C
	}
	timer := time.NewTimer(max(wait, 0))
	defer timer.Stop()
	// A replica can see a task become ready before the partition's
	// leader does (a follower applies a yield, or promotes a delayed
	// task, before the leader): a wake-up that finds nothing looks again
	// a monitor interval later, by which time the leader normally has
	// too, and then at doubling intervals up to maxSettle intervals.
	var settle <-chan time.Time
	var settleIn time.Duration // the delay of the pending look
	wokeUp := false
	// While some partition that holds ready tasks of the queue has no
	// reachable leader (an election, a leader that died), the claim looks
	// again every monitor interval; if its wait ends so, it answers
	// UNAVAILABLE rather than an empty list that a worker would take for
	// an empty queue.
	var leaderPoll *time.Ticker
	defer func() {
		if leaderPoll != nil {
			leaderPoll.Stop()
		}
	}()
	for {
		woken := d.waiters.wait(m.GetQueue()) // before trying: no lost wake-up
		if d.paused(m.GetQueue()) {
			// Paused: nothing to claim until it is resumed (every node
			// wakes its waiters when it applies new settings).
			if wait <= 0 {
				return nil, nil
			}
			select {
			case <-woken:
			case <-timer.C:
				wait = 0
			case <-ctx.Done():
				return nil, nil
			case <-d.draining:
				return nil, nil
			}
			continue
		}
		a.timeout = claimProposeTimeout(ctx)
		n, lmt := limit, (*limiter)(nil)
		if owner {
			var err error
			if n, lmt, err = d.acquire(ctx, m.GetQueue(), lim, limit); err != nil {
				return nil, apierr.From(err)
			}
		}
		var got []*nornv1.ClaimedTask
		var view *headsView
		var err error
		var reach claimReach
		if n > 0 {
			got, view, err = d.tryClaim(ctx, a, n)
			if a.across && err == nil {
				got, reach = d.claimOlder(ctx, m, n, got, view)
			}
		}
		if lmt != nil {
			d.release(lmt, n, got)
		}
		if err != nil || len(got) > 0 {
			return got, err
		}
		// Nothing claimed: is the queue empty, or out of reach? A claim
		// the cap or the rate held back (n == 0) asked no leader: its
		// answer is nothing (docs/JOBQUEUE.md "Waiting"), not the
		// leaders it did not ask taken for unreachable.
		var why error
		if n > 0 {
			why = d.outOfReach(m.GetQueue(), reach, proxied)
		}
		if wait <= 0 {
			return nil, why
		}
		if why != nil && leaderPoll == nil {
			leaderPoll = time.NewTicker(d.cfg.MonitorInterval)
		}
		var leaderPollC <-chan time.Time
		if leaderPoll != nil {
			leaderPollC = leaderPoll.C
		}
		if wokeUp && len(r.Nodes) > 1 {
			settleIn = d.cfg.MonitorInterval
			settle = time.After(settleIn)
		}
		wokeUp = false
		select {
		case <-woken:
			wokeUp = true
		case <-settle:
			settle = nil
			if settleIn < maxSettle*d.cfg.MonitorInterval {
				settleIn *= 2
				settle = time.After(settleIn)
			}
		case <-recheck:
		case <-leaderPollC:
		case <-timer.C:
			wait = 0 // one last try
		case <-ctx.Done():
			return nil, nil
		case <-d.draining:
			return nil, nil
		}
	}
}

// outOfReach is why a claim that asked the leaders found nothing, when it
// was not that the queue is empty: partitions holding ready tasks without
// a reachable leader (here or at a node it asked), or no node to ask.
func (d *Dispatcher) outOfReach(queue string, reach claimReach, proxied bool) error {
	if parts := d.stranded(queue, reach.answered, proxied); len(parts) > 0 {
		return strandedError(queue, parts)
	}
	if reach.strandedElsewhere != nil {
		return reach.strandedElsewhere
	}
	return reach.unreachable
}

// maxSettle bounds the looks after one wake-up that found nothing (see
// Claim): at one, two, four and eight monitor intervals.
const maxSettle = 8

// paused reports whether queue is paused (Config.Paused).
func (d *Dispatcher) paused(queue string) bool { return d.cfg.Paused != nil && d.cfg.Paused(queue) }

// leadsAny reports whether this node leads some partition.
func (d *Dispatcher) leadsAny() bool {
	for _, g := range d.host.Groups() {
		if g != nil && g.IsLeader() {
			return true
		}
	}
	return false
}

// claimReach is what a claim across the cluster learned of the other
// nodes: the ones it heard from (answered), and why it may have found
// nothing: a node's partitions without a reachable leader
// (strandedElsewhere), or no node to ask (unreachable).
type claimReach struct {
	answered                       map[string]bool
	strandedElsewhere, unreachable error
}

// claimOlder ends a claim across the cluster that got got from the
// view's leaders: nodes of an older version, which cannot report their
// heads, are asked for what is left, as they were before; and it tells
// what the claim learned of the other nodes.
func (d *Dispatcher) claimOlder(ctx context.Context, m *nornv1.ClaimRequest, limit int, got []*nornv1.ClaimedTask, view *headsView) ([]*nornv1.ClaimedTask, claimReach) {
	reach := claimReach{answered: view.answered}
	lastErr := view.lastErr
	if len(got) < limit && len(view.legacy) > 0 {
		more, answered, stranded, err := d.proxyClaim(ctx, m, limit-len(got), view.legacy)
		got = append(got, more...)
		for id := range answered {
			reach.answered[id] = true
		}
		reach.strandedElsewhere = stranded
		lastErr = cmp.Or(err, lastErr)
	}
	if reach.strandedElsewhere == nil && len(view.stranded) > 0 {
		reach.strandedElsewhere = strandedError(m.GetQueue(), view.stranded)
	}
	if len(got) == 0 && len(reach.answered) == 0 && !d.leadsAny() {
		reach.unreachable = noLeaderReachable(lastErr)
	}
	return got, reach
}

// claimProposeTimeout bounds a claim's proposals: replicas.ProposeTimeout, or less
// to answer before the request's deadline (a deposed leader waits for its
// claim's fate, see claims.Group.Propose).
func claimProposeTimeout(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(min(replicas.ProposeTimeout, time.Until(dl)-100*time.Millisecond), time.Millisecond)
	}
	return replicas.ProposeTimeout
}

// claimRounds bounds how often tryClaim picks again when candidates were
// taken by concurrent claims meanwhile.
const claimRounds = 3

// tryClaim claims up to limit ready tasks of a.msg's queue: the best
// heads (priority, then age) across the partitions this node leads and,
// when a.across, the heads the other leaders reported (view, from the
// last round), one Raft entry per partition, proposed concurrently, each
// within a.timeout.
func (d *Dispatcher) tryClaim(ctx context.Context, a claimArgs, limit int) (out []*nornv1.ClaimedTask, view *headsView, err error) {
	for round := 0; round < claimRounds && len(out) < limit; round++ {
		var rivals []*rival
		if a.across {
			view = d.remote.view(ctx, a.msg.GetQueue(), limit-len(out))
			if testhooks.Built && d.cfg.ClaimLocalFirst {
				view = d.remote.olderOnly()
			}
			rivals = view.rivals
		}
		got, contended, err := d.claimRound(ctx, a, limit-len(out), rivals)
		if err != nil && len(out) == 0 && len(got) == 0 {
			return nil, view, err
		}
		out = append(out, got...)
		if !contended {
			break // nothing more to find
		}
	}
	d.fairServed(a.msg.GetQueue(), out)
	slices.SortFunc(out, func(a, b *nornv1.ClaimedTask) int {
		return cmp.Or(cmp.Compare(b.Task.Spec.Priority, a.Task.Spec.Priority), cmp.Compare(a.Task.Id, b.Task.Id))
	})
	return out, view, nil
}

// leading returns the partitions this node leads.
func (d *Dispatcher) leading() []uint16 {
	var out []uint16
	for p, g := range d.host.Groups() {
		if g != nil && g.IsLeader() {
			out = append(out, uint16(p))
		}
	}
	return out
}

// claimRound picks up to limit candidates, from this node's heads and
// from the other leaders' (rivals, merged in claim order), and proposes
// this node's while it asks the other leaders for theirs. contended
// reports that some candidates were skipped because a concurrent claim
// on this node was proposing them, or were refused by the FSM, or that a
// leader gave fewer than it reported, so another round may find more. A
// partition whose leadership this node lost while proposing gives
// nothing, as one it does not lead.
// ctx is the request's, for its trace only: the proposals are bounded by
// a.timeout.
func (d *Dispatcher) claimRound(ctx context.Context, a claimArgs, limit int, rivals []*rival) (out []*nornv1.ClaimedTask, contended bool, err error) {
	queue := a.msg.GetQueue()
	if d.paused(queue) {
		return nil, false, nil // paused since the claim began, or a forwarded claim
	}
	var heads *headMerger
	if a.ids != nil {
		heads = d.idsMerger(a.ids)
	} else if heads, err = newHeadMerger(d.store, queue, d.leading()); err != nil {
		return nil, false, apierr.From(err)
	} else {
		heads.fair = d.fairFor(queue, heads.keyed || rivalsKeyed(rivals))
	}
	fv := heads.fair
	now := d.cfg.Clock.Now().UnixMilli()
	byPart := map[uint16][]claims.Candidate{}
	loaded := map[uint64]*coord.TaskState{} // reused for the claimed tasks' views
	var picked []uint64
	defer func() { d.inflight.release(picked) }()
	allotted := 0 // heads of the rivals taken
	// Look past the limit, as heads blocked by dependencies or being
	// claimed concurrently are skipped, but not without bound.
	for examined := 0; len(picked)+allotted < limit && examined < 4*limit+256; examined++ {
		h, ok := heads.peek()
		if ok && a.floor != nil && h.Priority < *a.floor {
			ok = false // below what the forwarding node asked for
		}
		// Another leader may hold better heads than it reported.
		floor := floorOf(rivals)
		if ok && h.Priority < floor {
			ok = false
		}
		if rv, j := bestRival(rivals, fv); rv != nil {
			if rh := rv.heads[j]; rh.Priority >= floor && (!ok || remoteFirst(rh, h, fv)) {
				if fv != nil {
					fv.pick(rh)
				}
				rv.take(j)
				allotted++
				continue
			}
		}
		if !ok {
			if heads.err != nil {
				return nil, false, apierr.From(heads.err)
			}
			break
		}
		p, h, _ := heads.next()
		if !d.inflight.reserve(h.ID) {
			contended = true
			continue
		}
		if c, ts, ok := d.candidate(h.ID, now); ok && (a.ids == nil || queueOf(ts) == queue) {
			// (A task named by ClaimRequest.IDs must be of the claim's
			// queue: the caller's grant is on that queue alone.)
			byPart[p] = append(byPart[p], c)
			loaded[h.ID] = ts
			picked = append(picked, h.ID)
		} else {
			d.inflight.release([]uint64{h.ID})
		}
	}
	type result struct {
		outs []claims.Outcome
		err  error
	}
	results := make(chan result, len(byPart))
	for p, cands := range byPart {
		cmd := &claims.Command{Op: claims.OpClaim, NowMs: now, Worker: a.msg.GetWorker(), LeaseMs: a.lease.Milliseconds(), Candidates: cands}
		go func() {
			outs, err := d.host.Group(p).ProposeContext(ctx, cmd, a.timeout)
			if errors.Is(err, claims.ErrOutcomeUnknown) {
				d.cfg.Logger.WarnContext(ctx, "a claim's leader was deposed and its fate is unknown: its tasks may stay claimed until the lease ends",
					"partition", p, "tasks", len(cands), "err", err)
			}
			results <- result{outs, err}
		}()
	}
	remote := d.claimRivals(ctx, a, rivals, fv != nil)
	for range byPart {
		r := <-results
		if errors.Is(r.err, claims.ErrNotLeader) {
			continue // the partition has no leader here now
		}
		if r.err != nil {
			err = apierr.From(r.err) // the rest stays ready
			continue
		}
		for _, o := range r.outs {
			if o.Err != nil {
				contended = true
				continue
			}
			// The task's state is as candidate read it; only its claim
			// record changed.
			ts := loaded[o.ID]
			ts.Claims = o.Record
			out = append(out, &nornv1.ClaimedTask{Task: d.coord.View(ts), ClaimId: o.Claim.Token, Leader: d.cfg.APIAddr,
				Expiry: timestamppb.New(time.UnixMilli(o.Claim.ExpiryMs))})
		}
	}
	got, short := remote()
	return append(out, got...), contended || short, err
}

// candidate checks a ready-index head before it is proposed: not
// terminal, no live claim, its time has come and its dependencies are
// completed. A dependant of a failed dependency is aborted here.
func (d *Dispatcher) candidate(id uint64, nowMs int64) (claims.Candidate, *coord.TaskState, bool) {
	ts, err := d.coord.Load(id)
	if err != nil {
		return claims.Candidate{}, nil, false // index ahead of the task
	}
	if _, terminal := ts.Task.Terminal(); terminal {
		return claims.Candidate{}, nil, false
	}
	if ts.Claims != nil {
		if _, live := ts.Claims.Live(); live || ts.Claims.Done() {
			return claims.Candidate{}, nil, false
		}
		if at := ts.Claims.RetryAtMs; at > nowMs {
			// In a retry's backoff, which the index here missed (the
			// claim ended before the task reached this replica): the
			// index catches up.
			if err := d.store.DelayTasks(d.host.Partition(id), []storage.ClaimMark{{ID: id, ExpiryMs: at}}); err != nil {
				d.cfg.Logger.Warn("delaying a task in a retry's backoff failed", "id", id, "err", err)
			}
			return claims.Candidate{}, nil, false
		}
	}
	spec := ts.Task.Spec
	if spec.NotBeforeMs > nowMs {
		return claims.Candidate{}, nil, false
	}
	if spec.DeadlineMs != 0 && nowMs >= spec.DeadlineMs && !(testhooks.Built && d.cfg.DeadlineUnfenced) {
		return claims.Candidate{}, nil, false // the monitor cancels it
	}
	if len(spec.DependsOn) > 0 {
		done, failed := d.depsState(spec.DependsOn)
		if failed != 0 {
			d.abortTask(ts, coord.DependencyFailedError(failed))
		}
		if !done {
			return claims.Candidate{}, nil, false
		}
	}
	return claims.Candidate{ID: id, NotBeforeMs: spec.NotBeforeMs, MaxClaims: spec.MaxClaims, Retry: spec.Retry, DeadlineMs: spec.DeadlineMs}, ts, true
}
