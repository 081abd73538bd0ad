package coord

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
)

// checkEpoch refuses a write of partition p from a caller whose ring
// (epoch) is older than what r, this node's ring, knows of p:
//   - p's move under way started at a later epoch: the caller would not
//     write to the move's target, and the handoff could lose the write;
//   - p's cohort changed at a later epoch (Ring.CohortEpoch, a finished
//     move): the caller writes to the old cohort and would count the acks
//     of a replica that no longer owns p (and drops it once it learns the
//     ring) towards its quorum.
//
// Either refusal is UNAVAILABLE and carries staleRingRefusal: the caller
// takes this node's ring and writes again (WriteEach).
func (c *Coordinator) checkEpoch(epoch uint64, r *cluster.Ring, moving map[int]*cluster.Move, p uint16) error {
	if m := moving[int(p)]; m != nil && epoch < m.Epoch {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"partition %d is moving since ring epoch %d and %s (epoch %d); retry once it has the new ring",
			p, m.Epoch, staleRingRefusal, epoch))
	}
	if ce := r.CohortEpoch(int(p)); epoch < ce {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"partition %d's cohort changed at ring epoch %d and %s (epoch %d); retry once it has the new ring",
			p, ce, staleRingRefusal, epoch))
	}
	return nil
}

// maxReplicate bounds the tasks of one Replicate call.
const maxReplicate = 10_000

// DropReplicateEvery is how often DropReplicatedWrite drops a Replicate.
const DropReplicateEvery = 20

// Replicate merges the task states a peer replicates to this node
// (PeerService.Replicate); epoch is the caller's ring epoch. Every state
// is decoded and validated like a client's request, and refused when its
// partition is not replicated here, or moves or changed its cohort since
// a ring newer than the caller's (checkEpoch).
func (c *Coordinator) Replicate(epoch uint64, states [][]byte) error {
	r := c.host.Ring()
	if r == nil {
		return apierr.NotFormed
	}
	if len(states) == 0 || len(states) > maxReplicate {
		return apierr.Invalid("tasks", "must hold 1 to %d tasks, got %d", maxReplicate, len(states))
	}
	// A newer ring makes this node pull it.
	if epoch > r.Epoch {
		c.host.KickReconcile()
	}
	moving := r.MovesUnderway()
	tasks := make([]*crdt.Task, len(states))
	for i, b := range states {
		t, err := crdt.Decode(b)
		if err != nil {
			return apierr.Invalid(fmt.Sprintf("tasks[%d]", i), "%v", err)
		}
		if err := t.Validate(c.cfg.Limits); err != nil {
			return apierr.Invalid(fmt.Sprintf("tasks[%d]", i), "%v", err)
		}
		p := c.host.Partition(t.ID)
		if c.host.Group(p) == nil {
			// The caller's ring and this node's disagree (a partition
			// moves): retryable, and the caller's next ring will tell.
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf(
				"tasks[%d]: partition %d is not replicated on %s (ring epoch %d)", i, p, c.cfg.NodeID, r.Epoch))
		}
		if err := c.checkEpoch(epoch, r, moving, p); err != nil {
			return err
		}
		tasks[i] = t
	}
	if testhooks.Built && c.cfg.DropReplicatedWrite && c.replicatesIn.Add(1)%DropReplicateEvery == 0 {
		return nil // the seeded bug: acknowledged, not stored
	}
	return c.mergeEncoded(tasks, states) // canonical: they decoded
}

// MaxRead bounds the ids of one Read call.
const MaxRead = 1000

// ReadReplica answers a peer's read of ids from this node's replicas
// (PeerService.Read): each task's state, with its claim record when this
// node leads the task's partition.
func (c *Coordinator) ReadReplica(ids []uint64) ([]*nornv1.ReplicaTask, error) {
	if c.host.Ring() == nil {
		return nil, apierr.NotFormed
	}
	if len(ids) == 0 || len(ids) > MaxRead {
		return nil, apierr.Invalid("ids", "must hold 1 to %d ids, got %d", MaxRead, len(ids))
	}
	out := make([]*nornv1.ReplicaTask, len(ids))
	for i, id := range ids {
		p := c.host.Partition(id)
		g := c.host.Group(p)
		if g == nil {
			return nil, c.NotReplicated(fmt.Sprintf("ids[%d]", i), p)
		}
		rt := &nornv1.ReplicaTask{Leader: g.LeaderCaughtUp()}
		t, err := c.store.TaskState(p, id)
		switch {
		case err == nil:
			rt.State = t.Encode()
		case !errors.Is(err, storage.ErrNotFound):
			return nil, apierr.From(err)
		}
		if rt.Leader {
			rec, err := c.store.ClaimFSMRecord(p, id)
			switch {
			case err == nil:
				rt.ClaimRecord = rec
			case !errors.Is(err, storage.ErrNotFound):
				return nil, apierr.From(err)
			}
		}
		out[i] = rt
	}
	return out, nil
}
