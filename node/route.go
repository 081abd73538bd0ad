package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// maxHops bounds how often a request is forwarded: a node that does not
// replicate a task's partition forwards to a replica, which forwards to
// the leader.
const maxHops = 2

// hops is how often a request was forwarded already.
func hops[T any](req *connect.Request[T]) int {
	h, _ := strconv.Atoi(req.Header().Get(transport.HeaderHops))
	return h
}

// forwarded returns msg as a request forwarded by this node, hopsSoFar
// forwards after the client's.
func forwarded[T any](msg *T, hopsSoFar int) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set(transport.HeaderHops, strconv.Itoa(hopsSoFar+1))
	return req
}

// routeTarget is where a call on partition p should run: "" for here (this
// node leads p; or it replicates p and no leader is known, or the call
// may not travel further), else the API address of the leader or, when
// this node does not replicate p, of a replica.
func (n *Node) routeTarget(p uint16, hopsSoFar int) string {
	r := n.host.Ring()
	if r == nil || hopsSoFar >= maxHops {
		return ""
	}
	g := n.host.Group(p)
	if g != nil {
		if g.IsLeader() {
			return ""
		}
		if id := string(g.Leader()); id != "" && id != n.cfg.NodeID {
			if nd, ok := r.Node(id); ok {
				return nd.APIAddr
			}
		}
		return ""
	}
	cohort := r.Cohort(int(p))
	alive := n.host.Alive()
	start := rand.IntN(len(cohort))
	for i := range cohort {
		id := string(cohort[(start+i)%len(cohort)])
		if nd, ok := r.Node(id); ok && alive[id] {
			return nd.APIAddr
		}
	}
	nd, _ := r.Node(string(cohort[start]))
	return nd.APIAddr
}

// aliveSet is the ids of the members gossip sees alive (this node too).
func (n *Node) aliveSet() map[string]bool {
	out := map[string]bool{n.cfg.NodeID: true}
	for _, m := range n.host.Members().Members() {
		if m.State.Up() {
			out[m.ID] = true
		}
	}
	return out
}

// forward runs a TaskService call on the node that should answer it for
// task id (see routeTarget). It reports whether it did; when it did not,
// the caller handles the call here. A forward that cannot reach its
// target falls back to here when this node replicates the partition.
func forward[Req, Resp any](n *Node, ctx context.Context, req *connect.Request[Req], id uint64,
	call func(nornv1connect.TaskServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
) (*connect.Response[Resp], bool, error) {
	if id == 0 || n.host.Ring() == nil {
		return nil, false, nil
	}
	p := n.host.Partition(id)
	target := n.routeTarget(p, transport.Hops(req))
	if target == "" {
		return nil, false, nil
	}
	resp, err := call(n.peers.Get(target).Tasks, ctx, transport.Forwarded(req.Msg, transport.Hops(req)))
	if err != nil && unreachable(err) && n.host.Group(p) != nil {
		n.cfg.Logger.Debug("forward failed; handling here", "id", id, "to", target, "err", err)
		return nil, false, nil
	}
	if err != nil {
		return nil, true, err
	}
	return connect.NewResponse(resp.Msg), true, nil
}

// unreachable reports an error that says the other node was not reached
// (or did not answer), as opposed to an answer.
func unreachable(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return true
	}
	if ce.Code() == connect.CodeUnavailable {
		_, quorum := writeFailure(ce)
		return !quorum
	}
	return ce.Code() == connect.CodeDeadlineExceeded || ce.Code() == connect.CodeCanceled
}

// writeFailure returns the WriteFailure detail of an error, if any.
func writeFailure(ce *connect.Error) (*nornv1.WriteFailure, bool) {
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if wf, ok := v.(*nornv1.WriteFailure); ok {
				return wf, true
			}
		}
	}
	return nil, false
}

// readTimeout bounds a replica read.
const readTimeout = 3 * time.Second

// read returns a task's state as r replicas of its partition have it
// (0: a majority), merged by the CRDT join, with the claim record of the
// partition's leader (this node's own when it leads; a replica's record
// when no leader answered). Replicas found behind the merged state are
// repaired in the background. storage.ErrNotFound when no replica that
// answered has the task's spec; UNAVAILABLE when fewer than r answered.
func (n *Node) read(ctx context.Context, id uint64, r int) (*taskState, error) {
	rg := n.host.Ring()
	if rg == nil {
		return nil, apierr.NotFormed
	}
	if r == 0 {
		r = rg.Replication/2 + 1
	}
	if r > rg.Replication {
		return nil, apierr.Invalid("r", "%d exceeds the replication factor %d", r, rg.Replication)
	}
	p := n.host.Partition(id)
	g := n.host.Group(p)
	if r == 1 && g != nil && g.IsLeader() {
		return n.load(id) // this replica is enough, and its record is the leader's
	}
	cohort := rg.Cohort(int(p))
	answers := make(chan replicaAnswer, len(cohort))
	for _, member := range cohort {
		go func() {
			a := replicaAnswer{from: string(member)}
			as, err := n.askReplica(ctx, p, string(member), []uint64{id})
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
	n.repair(merged, got)
	return &taskState{p: p, task: merged, claims: record}, nil
}

// askReplica asks one cohort member of partition p for the states of ids
// (all of p) and returns its answers in the order of ids: this node's
// through its store (with its own claim records), another's through
// PeerService.Read (with claim records when it leads p). A task the
// replica does not have is an answer with a nil state.
func (n *Node) askReplica(ctx context.Context, p uint16, member string, ids []uint64) ([]replicaAnswer, error) {
	out := make([]replicaAnswer, len(ids))
	if member == n.cfg.NodeID {
		g := n.host.Group(p)
		leader := g != nil && g.IsLeader()
		for i, id := range ids {
			a := &out[i]
			a.from, a.leader = member, leader
			t, err := n.store.TaskState(p, id)
			switch {
			case err == nil:
				a.state = t
			case !errors.Is(err, storage.ErrNotFound):
				return nil, err
			}
			if a.record, err = n.claimRecord(p, id); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	nd, ok := n.host.Ring().Node(member)
	if !ok {
		return nil, fmt.Errorf("node %s is not in the ring", member)
	}
	cctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	resp, err := n.peers.Get(nd.APIAddr).Peer.Read(cctx, transport.Request(n.peers, &nornv1.ReadRequest{Ids: ids}))
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

// readStates returns the CRDT states of ids, all of partition p, as a
// majority of p's replicas have them, merged by the join, in the order of
// ids: nil for a task no replica that answered has. It is the batched
// read of the dependency checker: claim records are ignored, and the
// leader's answer is not waited for. This node's replica, when it is one, is read and repaired
// before readStates returns; the other replicas found behind are repaired
// in the background, and those that do not answer in time are not waited
// for. UNAVAILABLE when fewer than a majority answered.
func (n *Node) readStates(ctx context.Context, p uint16, ids []uint64) ([]*crdt.Task, error) {
	rg := n.host.Ring()
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
		if string(member) == n.cfg.NodeID {
			local = true
			continue
		}
		go func() {
			as, err := n.askReplica(ctx, p, string(member), ids)
			batches <- batch{as, err}
		}()
	}
	if local {
		// Here, not in a goroutine: nothing reads the store after
		// readStates returns.
		as, err := n.askReplica(ctx, p, n.cfg.NodeID, ids)
		batches <- batch{as, err}
	}
	var got [][]replicaAnswer
	var lastErr error
	for range cohort {
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
		if merged != nil && n.repairPeers(merged, answers) {
			behind = append(behind, merged)
		}
		out[i] = merged
	}
	if len(behind) > 0 {
		n.repairLocal(behind)
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
func (n *Node) repair(merged *crdt.Task, answers []replicaAnswer) {
	if n.repairPeers(merged, answers) {
		go n.repairLocal([]*crdt.Task{merged})
	}
}

// repairPeers is repair but for this node's replica: it reports whether
// that is behind too, for the caller to repair (repairLocal).
func (n *Node) repairPeers(merged *crdt.Task, answers []replicaAnswer) (localBehind bool) {
	rg := n.host.Ring()
	want := crdt.Digest(merged.Encode())
	for _, a := range answers {
		if a.state != nil && crdt.Digest(a.state.Encode()) == want {
			continue
		}
		n.readRepairs.Add(1)
		if a.from == n.cfg.NodeID {
			localBehind = true
			continue
		}
		if nd, ok := rg.Node(a.from); ok {
			n.sender(nd.APIAddr).send([]*crdt.Task{merged}, func(err error) {
				if err != nil {
					n.cfg.Logger.Warn("read repair failed", "id", merged.ID, "node", a.from, "err", err)
				}
			})
		}
	}
	return localBehind
}

// repairLocal merges read states into this node's replicas.
func (n *Node) repairLocal(merged []*crdt.Task) {
	if err := n.mergeLocal(merged); err != nil {
		n.cfg.Logger.Warn("read repair failed", "tasks", len(merged), "err", err)
	}
}
