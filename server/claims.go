package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/dispatch"
	"github.com/norn-dev/norn/transport"
)

// Claim request bounds.
const (
	maxClaimBatch = 1000
	maxWorkerLen  = 256
)

func (s taskService) Claim(ctx context.Context, req *connect.Request[nornv1.ClaimRequest]) (*connect.Response[nornv1.ClaimResponse], error) {
	sv, m := s.sv, req.Msg
	start := time.Now()
	if err := crdt.ValidateQueue("queue", m.GetQueue()); err != nil {
		return nil, apierr.From(err)
	}
	if w := m.GetWorker(); w == "" || len(w) > maxWorkerLen {
		return nil, apierr.Invalid("worker", "must be 1-%d bytes, got %d", maxWorkerLen, len(w))
	}
	lease, err := sv.leaseOf(m.GetQueue(), m.GetLease())
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
		wait = min(d.AsDuration(), sv.cfg.MaxWait)
	}
	// Answer before the caller's deadline rather than after it.
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)-100*time.Millisecond)
	}
	// A claim another node proxied (a partial claim of what this node
	// leads), unless it is a worker's claim of a limited queue passed
	// on toward the queue's owner.
	proxied := transport.Hops(req) > 0 && req.Header().Get(transport.HeaderClaimOwner) == ""
	var floor *int32
	if f := req.Header().Get(transport.HeaderClaimFloor); f != "" && proxied {
		v, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, apierr.Invalid(transport.HeaderClaimFloor, "must be a priority, got %q", f)
		}
		floor = new(int32(v))
	}
	var ids []uint64
	if s := req.Header().Get(transport.HeaderClaimIDs); s != "" && proxied {
		var err error
		if ids, err = transport.ParseIDs(s, limit); err != nil {
			return nil, apierr.Invalid(transport.HeaderClaimIDs, "%v", err)
		}
	}
	got, err := sv.dispatch.Claim(ctx, dispatch.ClaimRequest{Msg: m, Lease: lease, Max: limit, Wait: wait,
		Proxied: proxied, Floor: floor, IDs: ids, Hops: transport.Hops(req)})
	if len(got) > 0 && ctx.Err() != nil {
		// The caller left (cancelled, or its deadline passed) before the
		// answer: it will never learn of these claims, and the tasks
		// would wait out their leases. A caller that cancels a claim
		// and then yields a task it held (a worker shutting down) needs
		// this: the yield readies the task after the cancel reached this
		// node, and the claim still waiting may take it.
		s.giveBack(ctx, got)
		return nil, connect.NewError(connect.CodeCanceled, fmt.Errorf("the claim's caller left before its answer (%w); %d claimed tasks given back", context.Cause(ctx), len(got)))
	}
	if err == nil && transport.Hops(req) == 0 {
		sv.events.Claimed(m.GetQueue(), got, sv.cfg.Clock.Now(), time.Since(start))
	}
	return connect.NewResponse(&nornv1.ClaimResponse{Tasks: got}), err
}

// giveBackTimeout bounds the yields of claims whose caller left.
const giveBackTimeout = 5 * time.Second

// giveBack yields the claims of got, whose caller is gone, through each
// task's leader like a worker's Yield. One that fails is logged: its
// lease expires then, as it would have.
func (s taskService) giveBack(ctx context.Context, got []*nornv1.ClaimedTask) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	for _, ct := range got {
		id := ct.GetTask().GetId()
		if _, err := s.Yield(ctx, connect.NewRequest(&nornv1.YieldRequest{Id: id, ClaimId: ct.GetClaimId()})); err != nil {
			s.sv.cfg.Logger.Warn("a claim's caller left; could not give its task back (the lease will expire)", "task", id, "claim", ct.GetClaimId(), "err", err)
		}
	}
}

// leaseOf is the lease a claim or renew of queue asks for with d: d
// validated, or when nil the queue's default lease (bounded by this
// node's maximum), or the node's.
func (sv *Server) leaseOf(queue string, d *durationpb.Duration) (time.Duration, error) {
	if d != nil {
		return sv.leaseArg("lease", d)
	}
	if ms := sv.queueSettings(queue).DefaultLeaseMs; ms > 0 {
		return min(time.Duration(ms)*time.Millisecond, sv.cfg.MaxLease), nil
	}
	return sv.cfg.DefaultLease, nil
}

// leaseArg validates the lease duration d at field; nil means the
// node's default.
func (sv *Server) leaseArg(field string, d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return sv.cfg.DefaultLease, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, apierr.Invalid(field, "%v", err)
	}
	l := d.AsDuration()
	if l <= 0 || l > sv.cfg.MaxLease {
		return 0, apierr.Invalid(field, "must be in (0, %s], got %s", apierr.Duration(sv.cfg.MaxLease), apierr.Duration(l))
	}
	if l < time.Millisecond {
		return 0, apierr.Invalid(field, "must be at least 0.001s, got %s", apierr.Duration(l))
	}
	return l, nil
}

func requireClaim(id, claimID uint64) error {
	if id == 0 {
		return apierr.Invalid("id", "required")
	}
	if claimID == 0 {
		return apierr.Invalid("claimId", "required")
	}
	return nil
}

func (s taskService) Renew(ctx context.Context, req *connect.Request[nornv1.RenewRequest]) (*connect.Response[nornv1.RenewResponse], error) {
	sv, m := s.sv, req.Msg
	if err := requireClaim(m.GetId(), m.GetClaimId()); err != nil {
		return nil, err
	}
	if resp, done, err := coord.Forward(sv.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Renew); done {
		return resp, err
	}
	if _, err := sv.leaseArg("lease", m.GetLease()); err != nil {
		return nil, err
	}
	ts, err := sv.dispatch.LoadClaimed(ctx, m.GetId(), m.GetClaimId())
	if err != nil {
		return nil, apierr.From(err)
	}
	lease, _ := sv.leaseOf(queueOf(ts.Task), m.GetLease()) // validated above
	if dispatch.TerminalSettles(ts, m.GetClaimId()) {
		// A terminal copy that does not settle the claim (a revival this
		// replica has not applied) is left to the group.
		sv.dispatch.EndIfTerminal(ts)
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d is terminal", m.GetId()))
	}
	o, err := sv.dispatch.Propose(m.GetId(), &claims.Command{Op: claims.OpRenew, NowMs: sv.cfg.Clock.Now().UnixMilli(),
		ID: m.GetId(), Token: m.GetClaimId(), LeaseMs: lease.Milliseconds()})
	if errors.Is(err, claims.ErrClaimSuperseded) {
		var ce *connect.Error
		if errors.As(err, &ce) {
			err = ce.Unwrap() // the FSM's words, without a second code
		}
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("claimId: %d is not the live claim of task %d (%w)", m.GetClaimId(), m.GetId(), err))
	}
	if err != nil {
		return nil, err
	}
	sv.events.Renewed(queueOf(ts.Task))
	return connect.NewResponse(&nornv1.RenewResponse{Expiry: timestamppb.New(time.UnixMilli(o.Claim.ExpiryMs))}), nil
}

func (s taskService) Update(ctx context.Context, req *connect.Request[nornv1.UpdateRequest]) (*connect.Response[nornv1.UpdateResponse], error) {
	sv, m := s.sv, req.Msg
	if _, err := sv.coord.Quorum(m.GetW()); err != nil {
		return nil, err
	}
	if err := requireClaim(m.GetId(), m.GetClaimId()); err != nil {
		return nil, err
	}
	if resp, done, err := coord.Forward(sv.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Update); done {
		return resp, err
	}
	if m.GetSeq() == 0 {
		return nil, apierr.Invalid("seq", "must be at least 1")
	}
	u := crdt.Update{Claim: m.GetClaimId(), Seq: m.GetSeq(), Progress: m.GetProgress(), Message: m.GetMessage(), Data: m.GetData()}
	if len(u.Data) == 0 {
		u.Data = nil
	}
	if err := u.Validate(sv.cfg.Limits); err != nil {
		return nil, apierr.From(err)
	}
	u.At = sv.hlc.Now()
	res, err := sv.decide(ctx, []dispatch.Act{{ID: m.GetId(), ClaimID: m.GetClaimId(), End: claims.EndNone,
		State: &crdt.Task{ID: m.GetId(), Updates: []crdt.Update{u}}}}, m.GetW())
	if err != nil {
		return nil, err
	}
	if res[0].err != nil {
		return nil, res[0].err
	}
	return connect.NewResponse(&nornv1.UpdateResponse{Acks: res[0].acks}), nil
}

func (s taskService) Yield(ctx context.Context, req *connect.Request[nornv1.YieldRequest]) (*connect.Response[nornv1.YieldResponse], error) {
	sv, m := s.sv, req.Msg
	if err := requireClaim(m.GetId(), m.GetClaimId()); err != nil {
		return nil, err
	}
	if resp, done, err := coord.Forward(sv.coord, ctx, req, m.GetId(), nornv1connect.TaskServiceClient.Yield); done {
		return resp, err
	}
	if p := m.GetProgress(); math.IsNaN(p) || p < 0 || p > 1 {
		return nil, apierr.Invalid("progress", "must be in [0, 1], got %v", p)
	}
	act := dispatch.Act{ID: m.GetId(), ClaimID: m.GetClaimId(), End: claims.EndYielded}
	if p := m.GetProgress(); p > 0 {
		// The progress is an update under the claim, written with the
		// yield: after the claim's updates this replica holds.
		seq := uint64(1)
		if ts, err := sv.coord.Load(m.GetId()); err == nil {
			for _, u := range ts.Task.Updates {
				if u.Claim == m.GetClaimId() {
					seq = max(seq, u.Seq+1)
				}
			}
		}
		act.State = &crdt.Task{ID: m.GetId(), Updates: []crdt.Update{{Claim: m.GetClaimId(), Seq: seq, At: sv.hlc.Now(), Progress: p}}}
	}
	res, err := sv.decide(ctx, []dispatch.Act{act}, 0)
	if err != nil {
		return nil, err
	}
	if res[0].err != nil {
		return nil, res[0].err
	}
	return connect.NewResponse(&nornv1.YieldResponse{}), nil
}
