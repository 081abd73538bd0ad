package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// Claim request bounds.
const (
	maxClaimBatch = 1000
	maxWorkerLen  = 256
)

func (s taskService) Claim(ctx context.Context, req *connect.Request[nornv1.ClaimRequest]) (*connect.Response[nornv1.ClaimResponse], error) {
	n, m := s.n, req.Msg
	if err := crdt.ValidateQueue("queue", m.GetQueue()); err != nil {
		return nil, apierr.From(err)
	}
	if w := m.GetWorker(); w == "" || len(w) > maxWorkerLen {
		return nil, apierr.Invalid("worker", "must be 1-%d bytes, got %d", maxWorkerLen, len(w))
	}
	lease, err := n.leaseArg(m.GetLease())
	if err != nil {
		return nil, err
	}
	limit := int(m.GetMax())
	if limit == 0 {
		limit = 1
	}
	if limit > maxClaimBatch {
		return nil, apierr.Invalid("max", "must be at most %d, got %d", maxClaimBatch, limit)
	}
	var wait time.Duration
	if d := m.GetWait(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			return nil, apierr.Invalid("wait", "must be a non-negative duration")
		}
		wait = min(d.AsDuration(), n.cfg.MaxWait)
	}
	// Answer before the caller's deadline rather than after it.
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)-100*time.Millisecond)
	}
	r := n.host.Ring()
	if r == nil {
		return nil, apierr.NotFormed
	}
	// A claim forwarded by another node looks at this node's groups only
	// and does not wait: the forwarding node waits.
	proxied := transport.Hops(req) > 0
	if proxied {
		wait = 0
	}
	// Tasks of partitions this node does not replicate wake no local
	// waiter, and a task can become ready at its leader without a
	// wake-up here (a delayed task promoted there after this node
	// promoted it, before this claim came): a waiting claim looks across
	// the cluster again every ClaimRecheck.
	var recheck <-chan time.Time
	if !proxied && len(r.Nodes) > 1 && wait > 0 {
		t := time.NewTicker(n.cfg.ClaimRecheck)
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
	for {
		woken := n.waiters.wait(m.GetQueue()) // before trying: no lost wake-up
		got, err := n.tryClaim(m.GetQueue(), m.GetWorker(), lease, limit, claimProposeTimeout(ctx))
		if err == nil && len(got) < limit && !proxied && len(r.Nodes) > 1 {
			more, perr := n.proxyClaim(ctx, m, limit-len(got))
			got = append(got, more...)
			if len(got) == 0 && perr != nil && !n.leadsAny() {
				err = perr
			}
		}
		if err != nil || len(got) > 0 || wait <= 0 {
			return connect.NewResponse(&nornv1.ClaimResponse{Tasks: got}), err
		}
		if wokeUp && len(r.Nodes) > 1 {
			settleIn = n.cfg.MonitorInterval
			settle = time.After(settleIn)
		}
		wokeUp = false
		select {
		case <-woken:
			wokeUp = true
		case <-settle:
			settle = nil
			if settleIn < maxSettle*n.cfg.MonitorInterval {
				settleIn *= 2
				settle = time.After(settleIn)
			}
		case <-recheck:
		case <-timer.C:
			wait = 0 // one last try
		case <-ctx.Done():
			return connect.NewResponse(&nornv1.ClaimResponse{}), nil
		case <-n.draining:
			return connect.NewResponse(&nornv1.ClaimResponse{}), nil
		}
	}
}

// maxSettle bounds the looks after one wake-up that found nothing (see
// Claim): at one, two, four and eight monitor intervals.
const maxSettle = 8

// leadsAny reports whether this node leads some partition.
func (n *Node) leadsAny() bool {
	for _, g := range n.host.Groups() {
		if g != nil && g.IsLeader() {
			return true
		}
	}
	return false
}

// proxyTimeout bounds a claim proxied to another node.
const proxyTimeout = 3 * time.Second

// proxyClaim asks the other live nodes, in random order, for up to limit
// tasks from the partitions they lead. It returns an error only when no
// node answered.
func (n *Node) proxyClaim(ctx context.Context, m *nornv1.ClaimRequest, limit int) ([]*nornv1.ClaimedTask, error) {
	r := n.host.Ring()
	alive := n.host.Alive()
	var out []*nornv1.ClaimedTask
	var lastErr error
	answered := 0
	for _, i := range rand.Perm(len(r.Nodes)) {
		nd := r.Nodes[i]
		if nd.ID == n.cfg.NodeID || !alive[nd.ID] || len(out) >= limit {
			continue
		}
		fwd := &nornv1.ClaimRequest{Queue: m.GetQueue(), Worker: m.GetWorker(), Lease: m.GetLease(), Max: uint32(limit - len(out))}
		cctx, cancel := context.WithTimeout(ctx, proxyTimeout)
		resp, err := n.peers.Get(nd.APIAddr).Tasks.Claim(cctx, transport.Forwarded(fwd, 0))
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		answered++
		out = append(out, resp.Msg.GetTasks()...)
	}
	if answered == 0 {
		why := "no other node is alive"
		if lastErr != nil {
			why = apierr.Message(lastErr)
		}
		return out, connect.NewError(connect.CodeUnavailable, fmt.Errorf("no partition leader reachable: %s", why))
	}
	return out, nil
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

// tryClaim claims up to limit ready tasks of queue: the best heads (priority,
// then age) across the partitions this node leads, one Raft entry per
// partition, proposed concurrently, each within timeout.
func (n *Node) tryClaim(queue, worker string, lease time.Duration, limit int, timeout time.Duration) ([]*nornv1.ClaimedTask, error) {
	var out []*nornv1.ClaimedTask
	for round := 0; round < claimRounds && len(out) < limit; round++ {
		got, contended, err := n.claimRound(queue, worker, lease, limit-len(out), timeout)
		if err != nil && len(out) == 0 && len(got) == 0 {
			return nil, err
		}
		out = append(out, got...)
		if !contended {
			break // nothing more to find
		}
	}
	slices.SortFunc(out, func(a, b *nornv1.ClaimedTask) int {
		return cmp.Or(cmp.Compare(b.Task.Spec.Priority, a.Task.Spec.Priority), cmp.Compare(a.Task.Id, b.Task.Id))
	})
	return out, nil
}

// claimRound picks up to limit candidates and proposes them. contended
// reports that some candidates were skipped because a concurrent claim on
// this node was proposing them, or were refused by the FSM, so another
// round may find more. A partition whose leadership this node lost while
// proposing gives nothing, as one it does not lead.
func (n *Node) claimRound(queue, worker string, lease time.Duration, limit int, timeout time.Duration) (out []*nornv1.ClaimedTask, contended bool, err error) {
	var leading []uint16
	for p, g := range n.host.Groups() {
		if g != nil && g.IsLeader() {
			leading = append(leading, uint16(p))
		}
	}
	heads, err := newHeadMerger(n.store, queue, leading)
	if err != nil {
		return nil, false, apierr.From(err)
	}
	now := n.cfg.Clock.Now().UnixMilli()
	byPart := map[uint16][]claims.Candidate{}
	loaded := map[uint64]*coord.TaskState{} // reused for the claimed tasks' views
	var picked []uint64
	defer func() { n.inflight.release(picked) }()
	// Look past the limit, as heads blocked by dependencies or being
	// claimed concurrently are skipped, but not without bound.
	for examined := 0; len(picked) < limit && examined < 4*limit+256; examined++ {
		p, h, ok := heads.next()
		if !ok {
			if heads.err != nil {
				return nil, false, apierr.From(heads.err)
			}
			break
		}
		if !n.inflight.reserve(h.ID) {
			contended = true
			continue
		}
		if c, ts, ok := n.candidate(h.ID, now); ok {
			byPart[p] = append(byPart[p], c)
			loaded[h.ID] = ts
			picked = append(picked, h.ID)
		} else {
			n.inflight.release([]uint64{h.ID})
		}
	}
	type result struct {
		outs []claims.Outcome
		err  error
	}
	results := make(chan result, len(byPart))
	for p, cands := range byPart {
		cmd := &claims.Command{Op: claims.OpClaim, NowMs: now, Worker: worker, LeaseMs: lease.Milliseconds(), Candidates: cands}
		go func() {
			outs, err := n.host.Group(p).Propose(cmd, timeout)
			if errors.Is(err, claims.ErrOutcomeUnknown) {
				n.cfg.Logger.Warn("a claim's leader was deposed and its fate is unknown: its tasks may stay claimed until the lease ends",
					"partition", p, "tasks", len(cands), "err", err)
			}
			results <- result{outs, err}
		}()
	}
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
			out = append(out, &nornv1.ClaimedTask{Task: n.coord.View(ts), ClaimId: o.Claim.Token, Leader: n.cfg.APIAddr,
				Expiry: timestamppb.New(time.UnixMilli(o.Claim.ExpiryMs))})
		}
	}
	return out, contended, err
}

// candidate checks a ready-index head before it is proposed: not
// terminal, no live claim, its time has come and its dependencies are
// completed. A dependant of a failed dependency is aborted here.
func (n *Node) candidate(id uint64, nowMs int64) (claims.Candidate, *coord.TaskState, bool) {
	ts, err := n.coord.Load(id)
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
	}
	spec := ts.Task.Spec
	if spec.NotBeforeMs > nowMs {
		return claims.Candidate{}, nil, false
	}
	if len(spec.DependsOn) > 0 {
		done, failed := n.depsState(spec.DependsOn)
		if failed != 0 {
			n.abortTask(ts, coord.DependencyFailedError(failed))
		}
		if !done {
			return claims.Candidate{}, nil, false
		}
	}
	return claims.Candidate{ID: id, NotBeforeMs: spec.NotBeforeMs, MaxClaims: spec.MaxClaims}, ts, true
}

// inflightSet holds the ids this node's claims are proposing right now, so
// that concurrent claims pick different tasks instead of racing for the
// same heads (the FSM would refuse all but one).
type inflightSet struct {
	mu  sync.Mutex
	ids map[uint64]struct{}
}

func (s *inflightSet) reserve(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = map[uint64]struct{}{}
	}
	if _, busy := s.ids[id]; busy {
		return false
	}
	s.ids[id] = struct{}{}
	return true
}

func (s *inflightSet) release(ids []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		delete(s.ids, id)
	}
}

// loadClaimed loads task id for a call made under claim claimID (Renew,
// Yield, Update, Complete, Abort), where a refusal must rest on the
// partition's authoritative claim state, not on a replica that is behind.
// The local replica is believed when it shows claimID live or the task
// terminal. Otherwise, on the partition's leader, it waits until the claim
// FSM has applied every committed entry (a new leader may not have applied
// its predecessor's yet) and, when the task's state has not reached this
// replica (a write with W < N skipped it, or a power loss took it), reads
// it from a majority of replicas. A replica that is not the leader (the
// call could not reach one) cannot refute the claim: UNAVAILABLE, which
// the caller may retry.
func (n *Node) loadClaimed(ctx context.Context, id, claimID uint64) (*coord.TaskState, error) {
	ts, err := n.coord.Load(id)
	if err == nil && claimDecided(ts, claimID) {
		return ts, nil
	}
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		return nil, err
	}
	p := n.host.Partition(id)
	g := n.host.Group(p)
	if g == nil {
		return ts, err
	}
	if !g.IsLeader() {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"claim %d of task %d cannot be checked: partition %d has no reachable leader", claimID, id, p))
	}
	if err := g.Barrier(replicas.ProposeTimeout); err != nil {
		return nil, apierr.From(err)
	}
	ts, err = n.coord.Load(id)
	if errors.Is(err, storage.ErrNotFound) {
		// The read merges a majority's states with this leader's record
		// and repairs this replica in the background.
		return n.coord.Read(ctx, id, 0)
	}
	return ts, err
}

// claimDecided reports whether ts settles a call under claimID without
// looking further: the claim is live, or the task is terminal.
func claimDecided(ts *coord.TaskState, claimID uint64) bool {
	if _, terminal := ts.Task.Terminal(); terminal {
		return true
	}
	if ts.Claims != nil {
		if c, ok := ts.Claims.Live(); ok && c.Token == claimID {
			return true
		}
	}
	return false
}
