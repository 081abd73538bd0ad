package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/storage"
)

// Unique has partition p's Raft group decide ops (claims.OpUnique, one
// entry) and returns an outcome per op, in order: Err nil when the op
// took effect, claims.ErrUniqueHeld when another task holds the key
// (Outcome.Unique names it). This node must lead p: elsewhere the answer
// is UNAVAILABLE, as for a claim's act.
func (d *Dispatcher) Unique(p uint16, ops []claims.UniqueOp) ([]claims.Outcome, error) {
	g := d.host.Group(p)
	if g == nil || !g.IsLeader() {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"partition %d has no reachable leader here: a unique key is decided by it (retry)", p))
	}
	cmd := &claims.Command{Op: claims.OpUnique, NowMs: d.cfg.Clock.Now().UnixMilli(), Uniques: ops}
	outs, err := g.Propose(cmd, replicas.ProposeTimeout)
	if err != nil {
		return nil, apierr.From(err)
	}
	if len(outs) != len(ops) {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("%d outcomes for %d unique key ops", len(outs), len(ops)))
	}
	for _, o := range outs {
		if o.Err != nil && o.Err != claims.ErrUniqueHeld {
			return nil, apierr.From(o.Err)
		}
	}
	return outs, nil
}

// HolderOf is what ts, a majority read of a unique key's holder, says of
// it (claims.Holder).
func HolderOf(ts *coord.TaskState) claims.Holder {
	life := ts.Life()
	ev, finished := ts.Task.Terminal()
	return claims.Holder{Found: true, Life: life, Finished: finished && ev.Life == life}
}

// UniqueSettle is how long after a key was taken its holder may still be
// on its way to the replicas (the enqueue that took it writing it): no
// one judges a holder no majority has before.
const UniqueSettle = 10 * time.Second

// The sweep of unique key records: every uniqueSweepEvery, the leader of
// each partition reads the holders of up to uniqueSweepBatch of its
// records (from where the last pass stopped) and forgets the records
// whose key is free (claims.UniqueRecord.Free), so that records stay
// bounded by the keys held.
const (
	uniqueSweepEvery = time.Minute
	uniqueSweepBatch = 256
)

// uniqueCursor is where a partition's sweep goes on from.
type uniqueCursor struct{ queue, key string }

// sweepUniques runs SweepUniquesOnce every uniqueSweepEvery until Close.
func (d *Dispatcher) sweepUniques() { d.every(uniqueSweepEvery, d.SweepUniquesOnce) }

// SweepUniquesOnce does one pass of the sweep over the partitions this
// node leads.
func (d *Dispatcher) SweepUniquesOnce() {
	d.sweepMu.Lock()
	defer d.sweepMu.Unlock()
	if d.sweepAt == nil {
		d.sweepAt = map[uint16]uniqueCursor{}
	}
	for p, g := range d.host.Groups() {
		if g != nil && g.IsLeader() {
			d.sweepPartition(uint16(p))
		}
	}
}

// sweepPartition sweeps up to uniqueSweepBatch records of partition p.
func (d *Dispatcher) sweepPartition(p uint16) {
	type held struct {
		queue, key string
		rec        *claims.UniqueRecord
	}
	var recs []held
	cur := d.sweepAt[p]
	n := 0
	err := d.store.ScanUniques(p, cur.queue, cur.key, uniqueSweepBatch, func(q, k string, v []byte) bool {
		cur, n = uniqueCursor{q, k}, n+1
		if r, err := claims.DecodeUniqueRecord(v); err == nil {
			recs = append(recs, held{q, k, r})
		}
		return true
	})
	if err != nil {
		d.cfg.Logger.Warn("scanning unique keys failed", "partition", p, "err", err)
		return
	}
	if n < uniqueSweepBatch { // the end: from the start next time
		cur = uniqueCursor{}
	}
	d.sweepAt[p] = cur
	phantomAfter := time.Hour
	if d.cfg.UniquePhantomAfter != nil {
		phantomAfter = d.cfg.UniquePhantomAfter()
	}
	var ops []claims.UniqueOp
	for _, h := range recs {
		nowMs := d.cfg.Clock.Now().UnixMilli()
		if h.rec.WindowOpen(nowMs) || nowMs-h.rec.CreatedMs < UniqueSettle.Milliseconds() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), d.cfg.WriteTimeout)
		ts, err := d.coord.Read(ctx, h.rec.ID, 0)
		cancel()
		var holder claims.Holder
		switch {
		case err == nil:
			holder = HolderOf(ts)
		case !errors.Is(err, storage.ErrNotFound):
			continue
		}
		if life, free := h.rec.Free(nowMs, holder, phantomAfter.Milliseconds()); free {
			ops = append(ops, claims.UniqueOp{Kind: claims.UniqueForget, Queue: h.queue, Key: h.key, Holder: h.rec.ID, HolderLife: life})
		}
	}
	if len(ops) == 0 {
		return
	}
	if _, err := d.Unique(p, ops); err != nil {
		d.cfg.Logger.Info("forgetting free unique keys failed; the next pass tries again", "partition", p, "keys", len(ops), "err", err)
	}
}
