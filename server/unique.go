package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/dispatch"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
	"github.com/norn-dev/norn/transport"
)

// Unique keys (docs/SCHEDULING.md, "Unique tasks"): the Raft group of a
// key's partition decides who holds it (claims.OpUnique); this node
// coordinates: it has the group take the key, reads the holder when the
// key is held, and writes the task once the key is its.

// uniqueGate refuses unique keys (FAILED_PRECONDITION naming field) while
// a ring member has not said it applies them (cluster.FeatureUnique).
func (sv *Server) uniqueGate(field string) error {
	return sv.featureGate(field, cluster.FeatureUnique, "unique keys")
}

// maxUniqueTurns bounds how often one enqueue goes back to the key's
// group: a replace refused because the key changed hands meanwhile.
const maxUniqueTurns = 4

// An enqueue that finds the key held by a task no majority has yet,
// taken less than dispatch.UniqueSettle ago, reads it again,
// uniqueSettleReads times uniqueSettleEvery apart, then answers
// UNAVAILABLE (retry) rather than name a task that may never be stored.
const (
	uniqueSettleReads = 5
	uniqueSettleEvery = 100 * time.Millisecond
)

// defaultPhantomAfter is how old a key's record must be before a holder
// that no majority of its replicas has is taken as gone, when the node
// gives no rejoin limit (Config.UniquePhantomAfter).
const defaultPhantomAfter = time.Hour

// uniqueAnswer is what an enqueue with a unique key gives back.
type uniqueAnswer struct {
	id        uint64
	duplicate bool
	acks      uint32
}

// enqueueUnique enqueues t (prepared: its id and spec set), whose spec
// has a unique key, at write quorum w: the key's group takes the key for
// t, then t is written; or the task holding the key is answered.
func (sv *Server) enqueueUnique(ctx context.Context, t *crdt.Task, w uint32) (uniqueAnswer, error) {
	spec := t.Spec
	p := sv.host.KeyPartition(spec.Queue, spec.UniqueKey)
	if testhooks.Built && sv.cfg.UniqueAfterWrite {
		// The seeded bug: the task is written first, and stays when the
		// key turns out to be held.
		if _, err := sv.coord.Write(ctx, []*crdt.Task{t}, w, []uint64{t.ID}); err != nil {
			return uniqueAnswer{}, err
		}
	}
	op := claims.UniqueOp{Kind: claims.UniqueTake, Queue: spec.Queue, Key: spec.UniqueKey, ID: t.ID,
		Digest: crdt.SpecDigest(spec), WindowMs: spec.UniqueForMs}
	for range maxUniqueTurns {
		outs, err := sv.decideUnique(ctx, p, []claims.UniqueOp{op})
		if err != nil {
			return uniqueAnswer{}, withWriteFailure(err, t.ID, w)
		}
		rec := outs[0].Unique
		if rec == nil {
			return uniqueAnswer{}, errNoRecord(op)
		}
		if outs[0].Err == nil {
			// The key is t's. The spec's creation time is the record's, so
			// that a retry writing it again writes the same spec.
			spec.CreatedAt = crdt.Timestamp{WallMs: rec.CreatedMs}
			acks, err := sv.coord.Write(ctx, []*crdt.Task{t}, w, []uint64{t.ID})
			if err != nil {
				return uniqueAnswer{}, err
			}
			return uniqueAnswer{id: t.ID, acks: acks}, nil
		}
		next, ans, err := sv.heldKey(ctx, t, op, rec, w)
		if next == nil || err != nil {
			return ans, err
		}
		op = *next
	}
	return uniqueAnswer{}, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
		"unique key %q of queue %q changed hands %d times during this enqueue (retry)", spec.UniqueKey, spec.Queue, maxUniqueTurns))
}

// heldKey decides what the enqueue of t (op) does about the key held by
// rec: answer the holder (next nil), or send next to the key's group (a
// replace of a holder that is finished, or gone). t is nil for a Retry's
// reacquire (op), which finishes no earlier enqueue.
func (sv *Server) heldKey(ctx context.Context, t *crdt.Task, op claims.UniqueOp, rec *claims.UniqueRecord, w uint32) (next *claims.UniqueOp, ans uniqueAnswer, err error) {
	dup := uniqueAnswer{id: rec.ID, duplicate: true}
	nowMs := sv.cfg.Clock.Now().UnixMilli()
	age := nowMs - rec.CreatedMs
	ts, err := sv.coord.Read(ctx, rec.ID, 0)
	if errors.Is(err, storage.ErrNotFound) && age < dispatch.UniqueSettle.Milliseconds() && (t == nil || rec.Digest != op.Digest) {
		// The enqueue that took the key may be writing its task now.
		for i := 0; i < uniqueSettleReads && errors.Is(err, storage.ErrNotFound); i++ {
			select {
			case <-ctx.Done():
				return nil, dup, withWriteFailure(connect.NewError(connect.CodeUnavailable, ctx.Err()), op.ID, w)
			case <-time.After(uniqueSettleEvery):
			}
			ts, err = sv.coord.Read(ctx, rec.ID, 0)
		}
		if errors.Is(err, storage.ErrNotFound) {
			return nil, dup, withWriteFailure(connect.NewError(connect.CodeUnavailable, fmt.Errorf(
				"unique key %q is being taken by task %d, which no majority of its replicas holds yet (retry)", op.Key, rec.ID)), op.ID, w)
		}
	}
	var h claims.Holder
	switch {
	case errors.Is(err, storage.ErrNotFound):
		if t != nil && rec.Digest == op.Digest && age < sv.phantomAfter().Milliseconds() {
			// The enqueue that took the key wrote nothing a majority
			// has (or is still writing): this spec is its spec; finish
			// it under its id.
			dup.acks, err = sv.finishTaken(ctx, t.Spec, rec, w)
			return nil, dup, err
		}
	case err != nil:
		return nil, dup, withWriteFailure(apierr.From(err), op.ID, w)
	default:
		h = dispatch.HolderOf(ts)
	}
	// Else an enqueue that took the key, failed its write and was never
	// retried holds it until it is past the phantom limit.
	life, free := rec.Free(nowMs, h, sv.phantomAfter().Milliseconds())
	if !free {
		return nil, dup, nil
	}
	return replaceOf(op, rec.ID, life), dup, nil
}

// errNoRecord is the error of a decision that answered no record: the
// group always names the key's holder after a take, replace or
// reacquire.
func errNoRecord(op claims.UniqueOp) error {
	return connect.NewError(connect.CodeInternal, fmt.Errorf("unique key %q of queue %q: the group answered no record", op.Key, op.Queue))
}

// replaceOf is op as a replace of holder, seen finished in life.
func replaceOf(op claims.UniqueOp, holder uint64, life uint32) *claims.UniqueOp {
	op.Kind, op.Holder, op.HolderLife = claims.UniqueReplace, holder, life
	return &op
}

// finishTaken writes, under the id of rec, the task whose enqueue took
// the key and may not have written it: spec, whose digest is rec's (the
// same spec), created when rec was, as that enqueue would have.
func (sv *Server) finishTaken(ctx context.Context, spec *crdt.Spec, rec *claims.UniqueRecord, w uint32) (uint32, error) {
	s := *spec
	s.CreatedAt = crdt.Timestamp{WallMs: rec.CreatedMs}
	return sv.coord.Write(ctx, []*crdt.Task{{ID: rec.ID, Spec: &s}}, w, []uint64{rec.ID})
}

// phantomAfter is Config.UniquePhantomAfter, or its default.
func (sv *Server) phantomAfter() time.Duration {
	if sv.cfg.UniquePhantomAfter != nil {
		return sv.cfg.UniquePhantomAfter()
	}
	return defaultPhantomAfter
}

// withWriteFailure adds to an UNAVAILABLE err the WriteFailure naming
// id, so that the client retries the enqueue with it.
func withWriteFailure(err error, id uint64, w uint32) error {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable {
		return err
	}
	if _, has := coord.WriteFailure(ce); has {
		return err
	}
	if d, derr := connect.NewErrorDetail(&nornv1.WriteFailure{Ids: []uint64{id}, W: w}); derr == nil {
		ce.AddDetail(d)
	}
	return ce
}

// decideUnique has partition p's group decide ops: here when this node
// leads p, else through the leader (PeerService.UniqueKeys).
func (sv *Server) decideUnique(ctx context.Context, p uint16, ops []claims.UniqueOp) ([]claims.Outcome, error) {
	target := sv.coord.RouteTarget(p, 0)
	if target == "" {
		return sv.dispatch.Unique(p, ops)
	}
	req := &nornv1.UniqueKeysRequest{Partition: uint32(p), Ops: make([]*nornv1.UniqueKeyOp, len(ops))}
	for i, op := range ops {
		req.Ops[i] = uniqueOpToAPI(op)
	}
	resp, err := sv.uniqueKeysAt(ctx, target, req, 0)
	if err != nil {
		if coord.Unreachable(err) {
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
				"partition %d's leader (%s) did not answer: a unique key is decided by it (retry): %s", p, target, apierr.Message(err)))
		}
		return nil, err
	}
	if len(resp.Msg.GetResults()) != len(ops) {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("%d results for %d unique key ops", len(resp.Msg.GetResults()), len(ops)))
	}
	outs := make([]claims.Outcome, len(ops))
	for i, r := range resp.Msg.GetResults() {
		outs[i].ID = ops[i].ID
		if !r.GetDone() {
			outs[i].Err = claims.ErrUniqueHeld
		}
		if rr := r.GetRecord(); rr != nil {
			outs[i].Unique = &claims.UniqueRecord{ID: rr.GetId(), Life: rr.GetLife(), CreatedMs: rr.GetCreatedMs(),
				WindowMs: rr.GetWindowMs(), Digest: rr.GetDigest()}
		}
	}
	return outs, nil
}

func uniqueOpToAPI(op claims.UniqueOp) *nornv1.UniqueKeyOp {
	return &nornv1.UniqueKeyOp{Kind: nornv1.UniqueKeyOp_Kind(op.Kind), Queue: op.Queue, Key: op.Key, Id: op.ID,
		Digest: op.Digest, WindowMs: op.WindowMs, Holder: op.Holder, HolderLife: op.HolderLife, Life: op.Life}
}

// maxUniqueOps bounds a UniqueKeys call.
const maxUniqueOps = 10_000

// UniqueKeys has this node's group of the request's partition decide its
// ops, or forwards them to the leader it knows.
func (s peerService) UniqueKeys(ctx context.Context, req *connect.Request[nornv1.UniqueKeysRequest]) (*connect.Response[nornv1.UniqueKeysResponse], error) {
	return servePeer(s.sv, req, func(m *nornv1.UniqueKeysRequest) (*nornv1.UniqueKeysResponse, error) {
		sv := s.sv
		if sv.host.Ring() == nil {
			return nil, apierr.NotFormed
		}
		if p := m.GetPartition(); p >= uint32(sv.host.Ring().Placement.P()) {
			return nil, apierr.Invalid("partition", "%d is not below the partition count %d", p, sv.host.Ring().Placement.P())
		}
		if n := len(m.GetOps()); n == 0 || n > maxUniqueOps {
			return nil, apierr.Invalid("ops", "must hold 1-%d ops, got %d", maxUniqueOps, n)
		}
		ops := make([]claims.UniqueOp, len(m.GetOps()))
		for i, o := range m.GetOps() {
			field := fmt.Sprintf("ops[%d]", i)
			if o.GetKind() < nornv1.UniqueKeyOp_KIND_TAKE || o.GetKind() > nornv1.UniqueKeyOp_KIND_FORGET {
				return nil, apierr.Invalid(field+".kind", "unknown kind %v", o.GetKind())
			}
			if err := crdt.ValidateQueue(field+".queue", o.GetQueue()); err != nil {
				return nil, apierr.From(err)
			}
			spec := crdt.Spec{Queue: o.GetQueue(), UniqueKey: o.GetKey(), UniqueForMs: o.GetWindowMs()}
			if o.GetKey() == "" {
				return nil, apierr.Invalid(field+".key", "required")
			}
			if err := spec.Validate(sv.cfg.Limits); err != nil {
				return nil, apierr.Invalid(field, "%v", err)
			}
			if o.GetKind() != nornv1.UniqueKeyOp_KIND_FORGET && o.GetId() == 0 {
				return nil, apierr.Invalid(field+".id", "required")
			}
			ops[i] = claims.UniqueOp{Kind: claims.UniqueKind(o.GetKind()), Queue: o.GetQueue(), Key: o.GetKey(), ID: o.GetId(),
				Digest: o.GetDigest(), WindowMs: o.GetWindowMs(), Holder: o.GetHolder(), HolderLife: o.GetHolderLife(), Life: o.GetLife()}
		}
		p := uint16(m.GetPartition())
		if target := sv.coord.RouteTarget(p, transport.Hops(req)); target != "" {
			resp, err := sv.uniqueKeysAt(ctx, target, m, transport.Hops(req))
			if err != nil {
				return nil, err
			}
			return resp.Msg, nil
		}
		outs, err := sv.dispatch.Unique(p, ops)
		if err != nil {
			return nil, err
		}
		resp := &nornv1.UniqueKeysResponse{Results: make([]*nornv1.UniqueKeyResult, len(outs))}
		for i, o := range outs {
			r := &nornv1.UniqueKeyResult{Done: o.Err == nil}
			if u := o.Unique; u != nil {
				r.Record = &nornv1.UniqueKeyRecord{Id: u.ID, Life: u.Life, CreatedMs: u.CreatedMs, WindowMs: u.WindowMs, Digest: u.Digest}
			}
			resp.Results[i] = r
		}
		return resp, nil
	})
}

// uniqueFromAPI validates and converts TaskSpec.unique_key and
// unique_for at field.
func (sv *Server) uniqueFromAPI(field string, s *nornv1.TaskSpec) (key string, forMs int64, err error) {
	d := s.GetUniqueFor()
	if s.GetUniqueKey() == "" {
		if d != nil {
			return "", 0, apierr.Invalid(field+".uniqueFor", "needs %s.uniqueKey", field)
		}
		return "", 0, nil
	}
	if d != nil {
		if err := d.CheckValid(); err != nil {
			return "", 0, apierr.Invalid(field+".uniqueFor", "%v", err)
		}
		v := d.AsDuration()
		if v < time.Second || v > crdt.MaxUniqueForMs*time.Millisecond {
			return "", 0, apierr.Invalid(field+".uniqueFor", "must be 1s to 8784h (366 days), got %s (leave it unset to hold the key until the task is finished)", v)
		}
		forMs = v.Milliseconds()
	}
	return s.GetUniqueKey(), forMs, sv.uniqueGate(field + ".uniqueKey")
}

// enqueueUniques enqueues the tasks of a batch that have a unique key
// (enqueueUnique, concurrently) and returns the others, to write as
// usual; dups (nil when no task has a key) says which ids it set to a
// duplicate's; acks is the least of theirs (0 when none was written).
func (sv *Server) enqueueUniques(ctx context.Context, tasks []*crdt.Task, ids []uint64, w uint32) (rest []*crdt.Task, dups []bool, acks uint32, err error) {
	var idx []int
	for i, t := range tasks {
		if t.Spec.UniqueKey != "" {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return tasks, nil, 0, nil
	}
	answers := make([]uniqueAnswer, len(idx))
	errs := make([]error, len(idx))
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for k, i := range idx {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			answers[k], errs[k] = sv.enqueueUnique(ctx, tasks[i], w)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, nil, 0, sv.coord.QuorumError(ids, 0, w, err)
		}
	}
	dups = make([]bool, len(tasks))
	acks = ^uint32(0)
	for k, i := range idx {
		ids[i], dups[i] = answers[k].id, answers[k].duplicate
		if !answers[k].duplicate {
			acks = min(acks, answers[k].acks)
		}
	}
	if acks == ^uint32(0) {
		acks = 0
	}
	rest = make([]*crdt.Task, 0, len(tasks)-len(idx))
	for _, t := range tasks {
		if t.Spec.UniqueKey == "" {
			rest = append(rest, t)
		}
	}
	return rest, dups, acks, nil
}

// reacquireUnique has the key of task id (spec's; nothing to do without
// one) held by it again in life, before a Retry revives it to that life:
// FAILED_PRECONDITION when another task took the key meanwhile.
func (sv *Server) reacquireUnique(ctx context.Context, id uint64, life uint32, spec *crdt.Spec) error {
	if spec == nil || spec.UniqueKey == "" {
		return nil
	}
	op := claims.UniqueOp{Kind: claims.UniqueReacquire, Queue: spec.Queue, Key: spec.UniqueKey, ID: id, Life: life,
		Digest: crdt.SpecDigest(spec), WindowMs: spec.UniqueForMs}
	p := sv.host.KeyPartition(spec.Queue, spec.UniqueKey)
	for range maxUniqueTurns {
		outs, err := sv.decideUnique(ctx, p, []claims.UniqueOp{op})
		if err != nil {
			return err
		}
		rec := outs[0].Unique
		if rec == nil {
			return errNoRecord(op)
		}
		if outs[0].Err == nil {
			return nil
		}
		next, _, err := sv.heldKey(ctx, nil, op, rec, 0)
		if err != nil {
			return err
		}
		if next == nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
				"task %d's unique key %q is held by task %d, enqueued since: a retry would make two tasks with one key (retry once task %d is finished, or enqueue again)",
				id, spec.UniqueKey, rec.ID, rec.ID))
		}
		op = *next
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf(
		"task %d's unique key %q changed hands %d times during this retry (retry)", id, spec.UniqueKey, maxUniqueTurns))
}

// uniqueKeysAt calls PeerService.UniqueKeys at target, as this node, the
// request's hopsSoFar-th forward.
func (sv *Server) uniqueKeysAt(ctx context.Context, target string, m *nornv1.UniqueKeysRequest, hopsSoFar int) (*connect.Response[nornv1.UniqueKeysResponse], error) {
	req := transport.Request(sv.peers, m)
	req.Header().Set(transport.HeaderHops, strconv.Itoa(hopsSoFar+1))
	return sv.peers.Get(target).Peer.UniqueKeys(ctx, req)
}
