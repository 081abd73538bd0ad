package coord

import (
	"context"
	"errors"
	"fmt"
	"time"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"

	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// readTimeout bounds a replica read.
const readTimeout = 3 * time.Second

// Read returns a task's state as r replicas of its partition have it
// (0: a majority), merged by the CRDT join, with the claim record of the
// partition's leader (this node's own when it leads; a replica's record
// when no leader answered). Replicas found behind the merged state are
// repaired in the background. storage.ErrNotFound when no replica that
// answered has the task's spec; UNAVAILABLE when fewer than r answered.
func (c *Coordinator) Read(ctx context.Context, id uint64, r int) (*TaskState, error) {
	rg := c.host.Ring()
	if rg == nil {
		return nil, apierr.NotFormed
	}
	if r == 0 {
		r = rg.Replication/2 + 1
	}
	if r > rg.Replication {
		return nil, apierr.Invalid("r", "%d exceeds the replication factor %d", r, rg.Replication)
	}
	p := c.host.Partition(id)
	g := c.host.Group(p)
	if r == 1 && g != nil && g.LeaderCaughtUp() {
		return c.Load(id) // this replica is enough, and its record is the leader's
	}
	cohort := rg.Cohort(int(p))
	answers := make(chan replicaAnswer, len(cohort))
	for _, member := range cohort {
		go func() {
			a := replicaAnswer{from: string(member)}
			as, err := c.askReplica(ctx, p, string(member), []uint64{id})
			if err == nil {
				a = as[0]
			}
			a.err = err
			answers <- a
		}()
	}
	var got []replicaAnswer
	var lastErr error
	haveLeader := false
	leaderKnown := g == nil || g.Leader() != ""
	for range cohort {
		a := <-answers
		if a.err != nil {
			lastErr = a.err
		} else {
			got = append(got, a)
			haveLeader = haveLeader || a.leader
		}
		// Enough replicas, and the leader's record unless no leader is
		// known here.
		if len(got) >= r && (haveLeader || !leaderKnown) {
			break
		}
	}
	if len(got) < r {
		return nil, readQuorumError(fmt.Sprintf("%d of %d replicas answered (r=%d)", len(got), len(cohort), r), lastErr)
	}
	var merged *crdt.Task
	var record *claims.Record
	for _, a := range got {
		if a.state != nil {
			if merged == nil {
				merged = a.state
			} else if j, _, err := crdt.Join(merged, a.state); err == nil {
				merged = j
			}
		}
		if a.leader || (record == nil && a.record != nil) {
			record = a.record
		}
	}
	if merged == nil || merged.Spec == nil {
		return nil, storage.ErrNotFound
	}
	c.repair(merged, got)
	return &TaskState{P: p, Task: merged, Claims: record, NoLeader: !haveLeader}, nil
}

// askReplica asks one cohort member of partition p for the states of ids
// (all of p) and returns its answers in the order of ids: this node's
// through its store (with its own claim records), another's through
// PeerService.Read (with claim records when it leads p). A task the
// replica does not have is an answer with a nil state.
func (c *Coordinator) askReplica(ctx context.Context, p uint16, member string, ids []uint64) ([]replicaAnswer, error) {
	out := make([]replicaAnswer, len(ids))
	if member == c.cfg.NodeID {
		g := c.host.Group(p)
		leader := g != nil && g.LeaderCaughtUp()
		for i, id := range ids {
			a := &out[i]
			a.from, a.leader = member, leader
			t, err := c.store.TaskState(p, id)
			switch {
			case err == nil:
				a.state = t
			case !errors.Is(err, storage.ErrNotFound):
				return nil, err
			}
			if a.record, err = c.ClaimRecord(p, id); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	nd, ok := c.host.Ring().Node(member)
	if !ok {
		return nil, fmt.Errorf("node %s is not in the ring", member)
	}
	cctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	resp, err := c.peers.Get(nd.APIAddr).Peer.Read(cctx, transport.Request(c.peers, &nornv1.ReadRequest{Ids: ids}))
	if err != nil {
		return nil, err
	}
	rt := resp.Msg.GetTasks()
	if len(rt) != len(ids) {
		return nil, fmt.Errorf("node %s answered %d tasks for %d", member, len(rt), len(ids))
	}
	for i := range ids {
		a := &out[i]
		a.from, a.leader = member, rt[i].GetLeader()
		if len(rt[i].GetState()) > 0 {
			if a.state, err = crdt.Decode(rt[i].GetState()); err != nil {
				return nil, err
			}
		}
		if a.record, err = decodeRecord(rt[i].GetClaimRecord()); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ReadStates returns the CRDT states of ids, all of partition p, as a
// majority of p's replicas have them, merged by the join, in the order of
// ids: nil for a task no replica that answered has. It is the batched
// Read of the dependency checker: claim records are ignored, and the
// leader's answer is not waited for. This node's replica, when it is one, is read and repaired
// before readStates returns; the other replicas found behind are repaired
// in the background, and those that do not answer in time are not waited
// for. UNAVAILABLE when fewer than a majority answered.
func (c *Coordinator) ReadStates(ctx context.Context, p uint16, ids []uint64) ([]*crdt.Task, error) {
	rg := c.host.Ring()
	if rg == nil {
		return nil, apierr.NotFormed
	}
	quorum := rg.Replication/2 + 1
	cohort := rg.Cohort(int(p))
	type batch struct {
		answers []replicaAnswer
		err     error
	}
	batches := make(chan batch, len(cohort))
	local := false
	for _, member := range cohort {
		if string(member) == c.cfg.NodeID {
			local = true
			continue
		}
		go func() {
			as, err := c.askReplica(ctx, p, string(member), ids)
			batches <- batch{as, err}
		}()
	}
	var got [][]replicaAnswer
	var lastErr error
	remote := len(cohort)
	if local {
		// Here, not in a goroutine: nothing reads the store after
		// readStates returns. Always among the answers, even when two
		// peers answer first, so that it is repaired when behind.
		remote--
		as, err := c.askReplica(ctx, p, c.cfg.NodeID, ids)
		if err != nil {
			lastErr = err
		} else {
			got = append(got, as)
		}
	}
	for range remote {
		if len(got) >= quorum {
			break
		}
		b := <-batches
		if b.err != nil {
			lastErr = b.err
			continue
		}
		got = append(got, b.answers)
	}
	if len(got) < quorum {
		return nil, readQuorumError(fmt.Sprintf("%d of %d replicas of partition %d answered", len(got), len(cohort), p), lastErr)
	}
	out := make([]*crdt.Task, len(ids))
	answers := make([]replicaAnswer, len(got))
	var behind []*crdt.Task // this node's replica is behind on these
	for i := range ids {
		var merged *crdt.Task
		for j, as := range got {
			a := as[i]
			answers[j] = a
			if a.state == nil {
				continue
			}
			if merged == nil {
				merged = a.state
			} else if m, _, err := crdt.Join(merged, a.state); err == nil {
				merged = m
			}
		}
		if merged != nil && c.repairPeers(merged, answers) {
			behind = append(behind, merged)
		}
		out[i] = merged
	}
	if len(behind) > 0 {
		c.repairLocal(behind)
	}
	return out, nil
}

// readQuorumError is the UNAVAILABLE of a read that too few replicas
// answered: what answered, and the last error a replica gave (if any).
func readQuorumError(answered string, lastErr error) error {
	msg := "read quorum not reached: " + answered
	if lastErr != nil {
		msg += ": " + apierr.Message(lastErr)
	}
	return connect.NewError(connect.CodeUnavailable, errors.New(msg))
}

// replicaAnswer is one replica's answer to a read.
type replicaAnswer struct {
	from   string // node id
	state  *crdt.Task
	record *claims.Record
	leader bool
	err    error
}

// repair sends the merged state to the replicas whose copy differs from
// it (read repair), in the background: this node's through its store,
// the others' through their replica senders.
func (c *Coordinator) repair(merged *crdt.Task, answers []replicaAnswer) {
	if c.repairPeers(merged, answers) {
		go c.repairLocal([]*crdt.Task{merged})
	}
}

// repairPeers is repair but for this node's replica: it reports whether
// that is behind too, for the caller to repair (repairLocal).
func (c *Coordinator) repairPeers(merged *crdt.Task, answers []replicaAnswer) (localBehind bool) {
	rg := c.host.Ring()
	enc := merged.Encode()
	want := crdt.Digest(enc)
	for _, a := range answers {
		if a.state != nil && crdt.Digest(a.state.Encode()) == want {
			continue
		}
		c.readRepairs.Add(1)
		if a.from == c.cfg.NodeID {
			localBehind = true
			continue
		}
		if nd, ok := rg.Node(a.from); ok {
			c.sender(nd.APIAddr, nd.RaftAddr).send(trace.SpanContext{}, [][]byte{enc}, func(err error) {
				if err != nil {
					c.cfg.Logger.Warn("read repair failed", "id", merged.ID, "node", a.from, "err", err)
				}
			})
		}
	}
	return localBehind
}

// repairLocal merges read states into this node's replicas.
func (c *Coordinator) repairLocal(merged []*crdt.Task) {
	if err := c.MergeLocal(merged); err != nil {
		c.cfg.Logger.Warn("read repair failed", "tasks", len(merged), "err", err)
	}
}

// Lookup returns a task's CRDT state (with its spec): from this node's
// replica when it has the task, else from a majority of its replicas.
// storage.ErrNotFound when none has it.
func (c *Coordinator) Lookup(ctx context.Context, id uint64) (*crdt.Task, error) {
	p := c.host.Partition(id)
	if c.host.ReadsLocally(p) {
		t, err := c.store.TaskState(p, id)
		if err == nil && t.Spec != nil {
			return t, nil
		}
		if err != nil && !errors.Is(err, storage.ErrNotFound) {
			return nil, err
		}
	}
	ts, err := c.Read(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	return ts.Task, nil
}

// decodeRecord decodes a claim record sent by a peer (nil when empty).
func decodeRecord(b []byte) (*claims.Record, error) {
	if len(b) == 0 {
		return nil, nil
	}
	return claims.DecodeRecord(b)
}
