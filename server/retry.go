package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"connectrpc.com/connect"

	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/dispatch"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
)

// retryFromAPI validates and converts the RetryPolicy at parent.leaf (its
// path in the request, "task" and "retry"); nil for none.
func (sv *Server) retryFromAPI(parent, leaf string, r *nornv1.RetryPolicy) (*crdt.RetryPolicy, error) {
	if r == nil {
		return nil, nil
	}
	field := parent + "." + leaf // built only for a policy: an enqueue's hot path
	p := &crdt.RetryPolicy{MaxAttempts: r.GetMaxAttempts(), MultiplierMilli: 1000}
	ms := func(name string, d *durationpb.Duration) (int64, error) {
		if d == nil {
			return 0, nil
		}
		if err := d.CheckValid(); err != nil {
			return 0, apierr.Invalid(field+"."+name, "%v", err)
		}
		v := d.AsDuration()
		if v <= 0 {
			return 0, apierr.Invalid(field+"."+name, "must be positive, got %s (leave it unset for no wait)", v)
		}
		if v > crdt.MaxBackoffMs*time.Millisecond {
			return 0, apierr.Invalid(field+"."+name, "must be at most 720h (30 days), got %s", v)
		}
		return max(v.Milliseconds(), 1), nil
	}
	var err error
	if p.InitialMs, err = ms("initialBackoff", r.GetInitialBackoff()); err != nil {
		return nil, err
	}
	if p.MaxMs, err = ms("maxBackoff", r.GetMaxBackoff()); err != nil {
		return nil, err
	}
	switch {
	case r.GetMaxBackoff() == nil:
		p.MaxMs = p.InitialMs
	case p.MaxMs < p.InitialMs:
		return nil, apierr.Invalid(field+".maxBackoff", "%s is below initialBackoff %s",
			r.GetMaxBackoff().AsDuration(), r.GetInitialBackoff().AsDuration())
	}
	if m := r.GetMultiplier(); m != 0 {
		if math.IsNaN(m) || m < 1 || m > crdt.MaxMultiplierMilli/1000 {
			return nil, apierr.Invalid(field+".multiplier", "must be from 1 to %d, got %v", crdt.MaxMultiplierMilli/1000, m)
		}
		p.MultiplierMilli = uint32(math.Round(m * 1000))
	}
	if j := r.GetJitter(); j != 0 {
		if math.IsNaN(j) || j < 0 || j > 1 {
			return nil, apierr.Invalid(field+".jitter", "must be from 0 to 1, got %v", j)
		}
		p.JitterMilli = uint32(math.Round(j * 1000))
	}
	if err := p.Validate(); err != nil { // the bounds above cover it; a second guard
		return nil, apierr.Invalid(field, "%v", err)
	}
	return p, sv.retriesGate(field)
}

// retriesGate refuses retries (FAILED_PRECONDITION naming field) while
// a ring member has not said it applies them (cluster.FeatureRetries): a
// node of an older build cannot read their Raft entries, records or task
// encodings, and would stop on the first one (a rolling upgrade under
// way: finish it).
func (sv *Server) retriesGate(field string) error {
	return sv.featureGate(field, cluster.FeatureRetries, "retries")
}

// featureGate refuses a call that uses feature (what names it) with
// FAILED_PRECONDITION naming field while a ring member has not said, in
// gossip, that it has the feature.
func (sv *Server) featureGate(field string, feature uint64, what string) error {
	if sv.host == nil {
		return nil
	}
	lacking := sv.host.Lacking(feature)
	if len(lacking) == 0 {
		return nil
	}
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
		"%s: %s need every node of the cluster on a build that has them; %s not (yet: a rolling upgrade under way?), as gossip last saw",
		field, what, strings.Join(lacking, ", ")))
}

// retryPolicyOf is the policy a retryable abort of a task with spec
// (nil: not known here) fails under: its own, or the node's default,
// whose max attempts are the spec's max_claims when it sets them (the
// same budget).
func (sv *Server) retryPolicyOf(spec *crdt.Spec) *crdt.RetryPolicy {
	if spec != nil && spec.Retry != nil {
		return spec.Retry
	}
	p := sv.cfg.DefaultRetry
	if spec != nil && spec.MaxClaims > 0 {
		p.MaxAttempts = spec.MaxClaims
	}
	return &p
}

// failAttempt has the attempt of task id under claim claimID fail with
// ev's errors (a retryable abort): decided by the partition's group like
// a complete (decide), which delays the task by its backoff or makes it
// dead. It returns the acks and the task's queue.
func (sv *Server) failAttempt(ctx context.Context, id, claimID uint64, w uint32, ev crdt.Terminal) (uint32, string, error) {
	if err := requireClaim(id, claimID); err != nil {
		return 0, "", err
	}
	if err := sv.retriesGate("retry"); err != nil {
		return 0, "", err
	}
	ev.Claim = claimID
	if err := ev.Validate(sv.cfg.Limits); err != nil {
		return 0, "", apierr.From(err)
	}
	var spec *crdt.Spec
	if ts, err := sv.coord.Load(id); err == nil {
		spec = ts.Task.Spec
	}
	act := dispatch.Act{ID: id, ClaimID: claimID, End: claims.EndFailed, Retry: sv.retryPolicyOf(spec),
		State: &crdt.Task{ID: id, Failures: []crdt.Failure{{Claim: claimID, At: sv.hlc.Now(), Errors: ev.Errors}}}}
	res, err := sv.decide(ctx, []dispatch.Act{act}, w)
	if err != nil {
		return 0, "", err
	}
	return res[0].acks, res[0].queue, res[0].err
}

func (s taskService) Retry(ctx context.Context, req *connect.Request[nornv1.RetryRequest]) (*connect.Response[nornv1.RetryResponse], error) {
	sv, m := s.sv, req.Msg
	if m.GetId() == 0 {
		return nil, apierr.Invalid("id", "required")
	}
	if _, err := sv.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	if resp, done, err := coord.Forward(sv.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Retry); done {
		return resp, err
	}
	if err := sv.retriesGate("id"); err != nil {
		return nil, err
	}
	ts, err := sv.coord.Load(m.GetId())
	if errors.Is(err, storage.ErrNotFound) {
		ts, err = sv.coord.Read(ctx, m.GetId(), 0) // only a majority can say it does not exist
	}
	if err != nil {
		return nil, apierr.From(err)
	}
	if _, terminal := ts.Task.Terminal(); !terminal {
		// This replica may have missed a cancel acked at w < N: a
		// majority has it.
		if fresh, err := sv.coord.Read(ctx, m.GetId(), 0); err == nil {
			ts = fresh
		}
	}
	life := ts.Life()
	if m.Life != nil {
		switch want := m.GetLife(); {
		case want > life:
			return nil, apierr.Invalid("life", "%d is ahead of the task's life %d", want, life)
		case want < life:
			// Retried already: its state is written again (so that it
			// reaches the quorum the first answer may have missed).
			acks, err := sv.coord.Write(ctx, []*crdt.Task{ts.Task}, m.GetW(), []uint64{m.GetId()})
			if err != nil {
				return nil, err
			}
			return connect.NewResponse(&nornv1.RetryResponse{Life: life, Acks: acks}), nil
		}
	}
	prev, terminal := ts.Task.Terminal()
	switch {
	case !terminal:
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"task %d is not terminal (%v): only a DEAD, ABORTED or CANCELLED task is retried", m.GetId(), ts.Status(sv.cfg.Clock.Now().UnixMilli(), nil)))
	case prev.Kind == crdt.Completed && !(testhooks.Built && sv.cfg.RetryCompleted):
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"task %d was COMPLETED: its result was accepted, so it is not retried (enqueue it again)", m.GetId()))
	case ts.Task.Spec != nil && ts.Task.Spec.DeadlineMs != 0 && sv.cfg.Clock.Now().UnixMilli() >= ts.Task.Spec.DeadlineMs:
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"task %d passed its deadline (%s): a retry would be cancelled at once (enqueue it again with a later one)",
			m.GetId(), time.UnixMilli(ts.Task.Spec.DeadlineMs).UTC().Format(time.RFC3339Nano)))
	}
	if ts.Claims == nil || !ts.Claims.Done() {
		// The claim FSM learns the end first (a cancel it has not
		// recorded yet), so that it agrees the task is terminal.
		sv.dispatch.EndNow(m.GetId(), prev)
	}
	if err := sv.reacquireUnique(ctx, m.GetId(), life+1, ts.Task.Spec); err != nil {
		return nil, err
	}
	state, repeated, err := sv.dispatch.Revive(m.GetId(), life+1)
	if err != nil {
		return nil, err
	}
	if repeated {
		state = ts.Task
	}
	acks, err := sv.coord.Write(ctx, []*crdt.Task{state}, m.GetW(), []uint64{m.GetId()})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.RetryResponse{Life: life + 1, Acks: acks}), nil
}
