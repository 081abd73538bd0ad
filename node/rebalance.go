package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/transport"
)

// The rebalance driver runs on the meta group's leader. It starts queued
// moves within the throttle (MaxMovesPerNode), drives each move under way
// through the epoch handoff, one idempotent step at a time, and removes
// decommissioned and dead nodes once they hold nothing. Every step's
// outcome is recorded in the ring through the meta group, so a new meta
// leader (or a restarted one) resumes where the last one stopped: the
// steps check the partition group's actual configuration before they
// change it.
//
// A move of partition p from A to B (DESIGN section 4):
//
//	filling      the ring names B a replica of p (writes go to the cohort
//	             and B, and need a quorum of both the old and the new
//	             cohort). Once every live replica runs with that ring (a
//	             replica refuses writes from older rings), B must complete
//	             an anti-entropy exchange of p with every live member of
//	             the cohort (A included unless dead) that started after
//	             that point.
//	catching-up  p's leader has added B as a non-voter; B applies the log
//	             up to the leader's last index.
//	promoted     B votes; if A leads p it hands the leadership over; then
//	             A is removed from p's group.
//	done         the ring has B in A's place. A, a zombie since its
//	             removal (it can neither lead nor commit anything), drops
//	             its replica when it sees this ring.

// moveStepTimeout bounds one step's calls; movePoll is how often a move
// that waits (for a fill, a catch-up) looks again.
const (
	moveStepTimeout = 10 * time.Second
	movePoll        = 200 * time.Millisecond
	driverInterval  = 500 * time.Millisecond
	autoInterval    = 2 * time.Second
)

// driver is the rebalance driver's state on this node.
type driver struct {
	mu       sync.Mutex
	running  map[int]bool   // partitions whose move has a goroutine
	fillFrom map[int]uint64 // B's anti-entropy round once every replica had the move's ring, by partition
	// catchUpTo is, by partition, the leader's last index at the previous
	// catch-up poll.
	catchUpTo map[int]uint64
	// down is, by ring node, since when it is down (gossip), as the
	// driver's passes saw it.
	down map[string]time.Time
	// autoAt is when autoRebalance last looked, autoErr its last error
	// (logged once); only the driver loop uses them.
	autoAt  time.Time
	autoErr string
	kick    chan struct{}
}

// kickDriver asks the driver for a pass now (never blocks).
func (n *Node) kickDriver() {
	select {
	case n.drv.kick <- struct{}{}:
	default:
	}
}

// driveLoop runs the driver's passes while this node leads the meta group,
// until Close.
func (n *Node) driveLoop() {
	defer n.stopped.Done()
	t := time.NewTicker(driverInterval)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		case <-n.drv.kick:
		}
		if n.host.Meta().IsLeader() {
			n.drivePass()
		} else {
			n.drv.mu.Lock()
			clear(n.drv.down) // a leader again starts counting afresh
			n.drv.mu.Unlock()
		}
	}
}

// drivePass starts the queued moves the throttle allows, a goroutine for
// each move under way that has none, and removes leaving and dead nodes
// that hold nothing.
func (n *Node) drivePass() {
	r := n.host.Meta().Ring()
	if r == nil {
		return
	}
	n.drv.mu.Lock()
	now := time.Now()
	for _, nd := range r.Nodes {
		switch _, seen := n.drv.down[nd.ID]; {
		case n.host.Up(nd.ID):
			delete(n.drv.down, nd.ID)
		case !seen:
			n.drv.down[nd.ID] = now
		}
	}
	n.drv.mu.Unlock()
	if n.cfg.AutoRebalance {
		n.autoRebalance(r)
	}
	if err := n.startQueued(); err != nil {
		n.cfg.Logger.Warn("starting queued moves failed", "err", err)
	}
	r = n.host.Meta().Ring()
	for p := range r.MovesUnderway() {
		n.drv.mu.Lock()
		if n.drv.running[p] {
			n.drv.mu.Unlock()
			continue
		}
		n.drv.running[p] = true
		n.drv.mu.Unlock()
		n.stopped.Add(1)
		go n.driveMove(p)
	}
	if err := n.removeEmptied(); err != nil {
		n.cfg.Logger.Warn("removing emptied nodes failed", "err", err)
	}
}

// autoRebalance (AutoRebalance) plans and applies a placement change when
// no move is queued or under way and ring r has a member dead (as the
// driver saw) for AutoDeadAfter, which is removed as by Remove with dead,
// or else a live member that holds nothing (it joined), which a rebalance
// gives replicas to. It looks at most every autoInterval.
func (n *Node) autoRebalance(r *cluster.Ring) {
	if time.Since(n.drv.autoAt) < autoInterval {
		return
	}
	n.drv.autoAt = time.Now()
	for _, m := range r.Moves {
		if !m.State.Ended() {
			return
		}
	}
	name, role, why := "", "", ""
	for _, nd := range r.Nodes {
		if nd.Role != cluster.RoleMember && nd.Role != cluster.RoleDraining {
			continue
		}
		if down := n.downFor(nd.ID); down >= n.cfg.AutoDeadAfter {
			name, role, why = nd.ID, cluster.RoleDead, fmt.Sprintf("%s dead for %s", nd.ID, down.Round(time.Second))
			break
		}
		if why == "" && nd.Role == cluster.RoleMember && r.Holds(nd.ID) == 0 && n.host.Up(nd.ID) {
			why = nd.ID + " holds nothing"
		}
	}
	if why == "" {
		return
	}
	plan, err := n.plan(name, role, true)
	if err != nil {
		if msg := apierr.Message(err); msg != n.drv.autoErr {
			n.drv.autoErr = msg
			n.cfg.Logger.Warn("auto rebalance failed", "why", why, "err", msg)
		}
		return
	}
	n.drv.autoErr = ""
	if len(plan.GetMoves()) > 0 || role != "" {
		n.cfg.Logger.Info("auto rebalance", "why", why, "moves", len(plan.GetMoves()), "epoch", plan.GetRingEpoch())
	}
}

// downFor returns how long node id has been down as the driver saw it
// (0 while it is up, or since this node leads the meta group).
func (n *Node) downFor(id string) time.Duration {
	n.drv.mu.Lock()
	defer n.drv.mu.Unlock()
	if since, ok := n.drv.down[id]; ok {
		return time.Since(since)
	}
	return 0
}

func targetDownMsg(id string, down, timeout time.Duration) string {
	return fmt.Sprintf("target %s down for %s (-move-target-timeout %s)", id, down.Round(time.Second), timeout)
}

// editRing applies edit to a copy of the meta group's current ring with
// the next epoch and proposes it; edit returns false to propose nothing.
// It retries when another proposal won the epoch.
func (n *Node) editRing(edit func(r *cluster.Ring) (bool, error)) (*cluster.Ring, error) {
	n.placeMu.Lock()
	defer n.placeMu.Unlock()
	for attempt := 0; ; attempt++ {
		cur := n.host.Meta().Ring()
		if cur == nil {
			return nil, apierr.NotFormed
		}
		next := cur.Next()
		ok, err := edit(next)
		if err != nil || !ok {
			return cur, err
		}
		err = n.host.Meta().ProposeRing(next, replicas.ProposeTimeout)
		if err == nil {
			n.host.KickReconcile()
			return next, nil
		}
		if !errors.Is(err, cluster.ErrStaleEpoch) || attempt == 3 {
			return cur, err
		}
	}
}

// startQueued starts queued moves, in plan order, while neither end has
// MaxMovesPerNode moves under way, the partition has none, and the target
// is up. A queued move that no longer matches its partition's cohort
// fails.
func (n *Node) startQueued() error {
	var started []cluster.Move
	_, err := n.editRing(func(r *cluster.Ring) (bool, error) {
		started = started[:0]
		busy := map[string]int{}
		for _, m := range r.Moves {
			if m.State.Active() {
				busy[m.From]++
				busy[m.To]++
			}
		}
		changed := false
		for i := range r.Moves {
			m := &r.Moves[i]
			if m.State != cluster.MoveQueued {
				continue
			}
			if !r.Hosts(m.Partition, m.From) || r.Hosts(m.Partition, m.To) {
				m.State, m.Error, changed = cluster.MoveFailed, "the partition's cohort changed since the plan", true
				continue
			}
			if _, ok := r.Node(m.To); !ok {
				m.State, m.Error, changed = cluster.MoveFailed, "the target left the ring", true
				continue
			}
			if down := n.downFor(m.To); down >= n.cfg.MoveTargetTimeout {
				m.State, m.Error, changed = cluster.MoveFailed, targetDownMsg(m.To, down, n.cfg.MoveTargetTimeout), true
				continue
			}
			if r.ActiveMove(m.Partition) != nil || busy[m.From] >= n.cfg.MaxMovesPerNode ||
				busy[m.To] >= n.cfg.MaxMovesPerNode || !n.host.Up(m.To) {
				continue
			}
			m.State, m.Epoch, m.Error, changed = cluster.MoveFilling, r.Epoch, "", true
			started = append(started, *m)
			busy[m.From]++
			busy[m.To]++
		}
		return changed, nil
	})
	if err == nil {
		for _, m := range started {
			n.cfg.Logger.Info("partition move started", "partition", m.Partition, "from", m.From, "to", m.To)
		}
	}
	return err
}

// driveMove drives partition p's move under way until it is done, this
// node stops leading the meta group, or the node closes.
func (n *Node) driveMove(p int) {
	defer n.stopped.Done()
	defer func() {
		n.drv.mu.Lock()
		delete(n.drv.running, p)
		delete(n.drv.fillFrom, p)
		delete(n.drv.catchUpTo, p)
		n.drv.mu.Unlock()
	}()
	backoff := movePoll
	for {
		select {
		case <-n.stop:
			return
		default:
		}
		if !n.host.Meta().IsLeader() {
			return
		}
		r := n.host.Meta().Ring()
		m := r.ActiveMove(p)
		if m == nil {
			return
		}
		if down := n.downFor(m.To); m.State.CanRollBack() && down >= n.cfg.MoveTargetTimeout {
			n.rollBack(p, targetDownMsg(m.To, down, n.cfg.MoveTargetTimeout))
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), moveStepTimeout)
		progressed, err := n.stepMove(ctx, r, *m)
		cancel()
		wait := movePoll
		if err != nil {
			n.noteMoveError(p, *m, err)
			wait, backoff = backoff, min(2*backoff, 5*time.Second)
		} else {
			backoff = movePoll
			if progressed {
				wait = 0
			}
		}
		select {
		case <-n.stop:
			return
		case <-time.After(wait):
		}
	}
}

// noteMoveError records a step's error in the move (shown by status), once
// per distinct message.
func (n *Node) noteMoveError(p int, m cluster.Move, err error) {
	msg := apierr.Message(err)
	if m.Error == msg {
		return
	}
	n.cfg.Logger.Warn("partition move step failed; retrying", "partition", p, "from", m.From, "to", m.To,
		"state", m.State, "err", msg)
	_, _ = n.editRing(func(r *cluster.Ring) (bool, error) {
		cur := r.ActiveMove(p)
		if cur == nil || cur.State != m.State || cur.Error == msg {
			return false, nil
		}
		cur.Error = msg
		return true, nil
	})
}

// rollBack starts rolling partition p's move back, for why, unless it is
// promoted.
func (n *Node) rollBack(p int, why string) {
	_, err := n.editRing(func(r *cluster.Ring) (bool, error) {
		return r.RollBack(p, why), nil
	})
	if err != nil {
		n.cfg.Logger.Warn("rolling a partition move back failed", "partition", p, "err", err)
		return
	}
	n.cfg.Logger.Warn("rolling a partition move back", "partition", p, "why", why)
}

// cancelMoves gives up every move not promoted yet (Ring.CancelMoves) and
// returns the moves as they stand after.
func (n *Node) cancelMoves() (*nornv1.Plan, error) {
	var cancelled int
	next, err := n.editRing(func(r *cluster.Ring) (bool, error) {
		cancelled = r.CancelMoves("cancelled")
		return cancelled > 0, nil
	})
	if err != nil {
		return nil, err
	}
	out := &nornv1.Plan{RingEpoch: next.Epoch}
	for _, m := range next.Moves {
		out.Moves = append(out.Moves, moveStatus(m))
	}
	loads := next.Loads(next.Placement)
	out.Loads = nodeLoads(next, loads, loads)
	if cancelled > 0 {
		n.kickDriver()
		n.cfg.Logger.Info("moves cancelled", "moves", cancelled, "epoch", next.Epoch)
	}
	return out, nil
}

// setMoveState records partition p's move (still in state from) in state
// to.
func (n *Node) setMoveState(p int, from, to cluster.MoveState) error {
	_, err := n.editRing(func(r *cluster.Ring) (bool, error) {
		m := r.ActiveMove(p)
		if m == nil || m.State != from {
			return false, nil
		}
		m.State, m.Error = to, ""
		return true, nil
	})
	if err == nil {
		n.cfg.Logger.Info("partition move step", "partition", p, "state", to)
	}
	return err
}

// stepMove takes the next step of move m of ring r. It reports whether
// the move changed state; false with no error means it waits.
func (n *Node) stepMove(ctx context.Context, r *cluster.Ring, m cluster.Move) (bool, error) {
	p := m.Partition
	to, ok := r.Node(m.To)
	if !ok {
		return false, fmt.Errorf("target %s is not in the ring", m.To)
	}
	switch m.State {
	case cluster.MoveFilling:
		filled, err := n.moveFilled(ctx, r, m)
		if err != nil || !filled {
			return false, err
		}
		if _, err := n.changeGroup(ctx, r, p, "add-nonvoter", to); err != nil {
			return false, err
		}
		return true, n.setMoveState(p, cluster.MoveFilling, cluster.MoveCatchingUp)

	case cluster.MoveCatchingUp:
		cfg, err := n.changeGroup(ctx, r, p, "add-nonvoter", to)
		if err != nil {
			return false, err
		}
		prog, err := n.replicaProgress(ctx, to, p, nil, 0)
		if err != nil {
			return false, err
		}
		// Under load the leader's last index runs ahead of what any
		// follower has applied (the commit index reaches followers with
		// the next append), so B is caught up once it has applied the
		// last index the leader had at the previous poll: it is less than
		// a poll behind (the Raft thesis's catch-up rounds).
		n.drv.mu.Lock()
		prev := n.drv.catchUpTo[p]
		caught := prev > 0 && prog.AppliedIndex >= prev || prog.AppliedIndex >= cfg.LastIndex
		n.drv.catchUpTo[p] = cfg.LastIndex
		n.drv.mu.Unlock()
		if !caught {
			return false, nil
		}
		if _, err := n.changeGroup(ctx, r, p, "add-voter", to); err != nil {
			return false, err
		}
		return true, n.setMoveState(p, cluster.MoveCatchingUp, cluster.MovePromoted)

	case cluster.MovePromoted:
		from, _ := r.Node(m.From)
		from.ID = m.From // the calls name it even if the ring lost it
		cfg, err := n.changeGroup(ctx, r, p, "transfer-from", from)
		if err != nil {
			return false, err
		}
		if cfg.Leader == m.From {
			return false, nil // the transfer is under way
		}
		if !serverVotes(cfg.Servers, m.To) {
			// A new meta leader may find the move recorded promoted
			// before the promotion reached the group: promote again.
			if _, err := n.changeGroup(ctx, r, p, "add-voter", to); err != nil {
				return false, err
			}
		}
		if _, err := n.changeGroup(ctx, r, p, "remove", from); err != nil {
			return false, err
		}
		_, err = n.editRing(func(r *cluster.Ring) (bool, error) {
			cur := r.ActiveMove(p)
			if cur == nil || cur.State != cluster.MovePromoted {
				return false, nil
			}
			return true, r.FinishMove(p)
		})
		if err == nil {
			n.cfg.Logger.Info("partition moved", "partition", p, "from", m.From, "to", m.To)
		}
		return err == nil, err

	case cluster.MoveRollingBack:
		// To leaves the group (it may have become a voter before the
		// ring recorded it: hand its leadership over first), then the
		// ring drops it as a replica and its replica is dropped.
		cfg, err := n.changeGroup(ctx, r, p, "transfer-from", to)
		if err != nil {
			return false, err
		}
		if cfg.Leader == m.To {
			return false, nil // the transfer is under way
		}
		if slices.ContainsFunc(cfg.Servers, func(s *nornv1.GroupServer) bool { return s.GetId() == m.To }) {
			if _, err := n.changeGroup(ctx, r, p, "remove", to); err != nil {
				return false, err
			}
		}
		_, err = n.editRing(func(r *cluster.Ring) (bool, error) {
			cur := r.ActiveMove(p)
			if cur == nil || cur.State != cluster.MoveRollingBack {
				return false, nil
			}
			return true, r.FailRollback(p)
		})
		if err == nil {
			n.cfg.Logger.Warn("partition move rolled back", "partition", p, "from", m.From, "to", m.To, "why", m.Rollback)
		}
		return err == nil, err
	}
	return false, fmt.Errorf("move in state %s", m.State)
}

func serverVotes(servers []*nornv1.GroupServer, id string) bool {
	for _, s := range servers {
		if s.GetId() == id {
			return s.GetVoter()
		}
	}
	return false
}

// moveFilled reports whether move m's target has its replica filled: every
// live replica of the partition runs with a ring that has the move (so
// writes reach the target, or are refused), and the target then completed
// an anti-entropy exchange with every live member of the cohort.
func (n *Node) moveFilled(ctx context.Context, r *cluster.Ring, m cluster.Move) (bool, error) {
	p := m.Partition
	to, _ := r.Node(m.To)
	n.drv.mu.Lock()
	after, known := n.drv.fillFrom[p]
	n.drv.mu.Unlock()
	fromDead := false
	if role, _ := r.Role(m.From); role == cluster.RoleDead || !n.host.Up(m.From) {
		fromDead = true
	}
	if !known {
		for _, id := range r.Replicas(p) {
			nd, _ := r.Node(string(id))
			if string(id) == m.From && fromDead || string(id) != m.To && !n.host.Up(string(id)) {
				continue
			}
			prog, err := n.replicaProgress(ctx, nd, p, nil, 0)
			if err != nil {
				return false, err
			}
			if prog.RingEpoch < m.Epoch || !prog.Open {
				return false, nil // the move's ring has not reached it yet
			}
			if string(id) == m.To {
				after = prog.Round
			}
		}
		n.drv.mu.Lock()
		n.drv.fillFrom[p] = after
		n.drv.mu.Unlock()
	}
	// Every live member of the cohort, not only From: a write acked
	// before the move by a quorum without From is on the others.
	var sources []string
	for _, id := range r.Cohort(p) {
		if role, _ := r.Role(string(id)); role != cluster.RoleDead && n.host.Up(string(id)) {
			sources = append(sources, string(id))
		}
	}
	if len(sources) == 0 {
		return false, fmt.Errorf("no live replica of partition %d to fill %s from", p, m.To)
	}
	prog, err := n.replicaProgress(ctx, to, p, sources, after)
	if err != nil {
		return false, err
	}
	return prog.Filled, nil
}

// changeGroup asks partition p's leader for a configuration change of the
// group (op about node nd), trying each replica of p until the leader
// answers.
func (n *Node) changeGroup(ctx context.Context, r *cluster.Ring, p int, op string, nd cluster.RingNode) (*nornv1.ChangeGroupResponse, error) {
	req := &nornv1.ChangeGroupRequest{Partition: uint32(p), Op: op, Node: nd.ID, RaftAddress: nd.RaftAddr}
	candidates := r.Replicas(p)
	if g := n.host.Group(uint16(p)); g != nil {
		if l := string(g.Leader()); l != "" {
			candidates = append([]ring.NodeID{ring.NodeID(l)}, candidates...)
		}
	}
	var lastErr error
	tried := map[ring.NodeID]bool{}
	for _, id := range candidates {
		if tried[id] {
			continue
		}
		tried[id] = true
		target, ok := r.Node(string(id))
		if !ok || !n.host.Up(string(id)) {
			continue
		}
		resp, err := n.peers.Get(target.APIAddr).Peer.ChangeGroup(ctx, transport.Request(n.peers, req))
		if err == nil {
			return resp.Msg, nil
		}
		lastErr = err
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("no live replica of partition %d", p)
	}
	return nil, fmt.Errorf("partition %d %s %s: %w", p, op, nd.ID, lastErr)
}

// replicaProgress asks node nd how far its replica of p is.
func (n *Node) replicaProgress(ctx context.Context, nd cluster.RingNode, p int, fillFrom []string, after uint64) (*nornv1.ReplicaProgressResponse, error) {
	resp, err := n.peers.Get(nd.APIAddr).Peer.ReplicaProgress(ctx, transport.Request(n.peers,
		&nornv1.ReplicaProgressRequest{Partition: uint32(p), FillFrom: fillFrom, AfterRound: after}))
	if err != nil {
		return nil, fmt.Errorf("progress of %s: %w", nd.ID, err)
	}
	return resp.Msg, nil
}

// removeEmptied removes from the ring every leaving or dead node that
// holds no replica and is named by no pending move, then from the meta
// group, and fills the meta group up to its size from the members.
func (n *Node) removeEmptied() error {
	var gone []string
	_, err := n.editRing(func(r *cluster.Ring) (bool, error) {
		gone = gone[:0]
		keep := r.Nodes[:0:0]
		for _, nd := range r.Nodes {
			if (nd.Role == cluster.RoleLeaving || nd.Role == cluster.RoleDead) && r.Holds(nd.ID) == 0 && !r.Pending(nd.ID) {
				gone = append(gone, nd.ID)
				continue
			}
			keep = append(keep, nd)
		}
		if len(gone) == 0 || len(keep) < r.Replication {
			return false, nil
		}
		r.Nodes = keep
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, id := range gone {
		n.cfg.Logger.Info("node removed from the cluster", "node", id)
	}
	return n.fitMetaGroup()
}

// fitMetaGroup makes the meta group's voters the ring's nodes it should
// have: voters no longer in the ring are removed, and members (alive,
// role member first) are added until the group has MetaVoters of the
// ring's size. The leader removes itself last.
func (n *Node) fitMetaGroup() error {
	n.metaFitMu.Lock()
	defer n.metaFitMu.Unlock()
	r := n.host.Meta().Ring()
	if r == nil || !n.host.Meta().IsLeader() {
		return nil
	}
	voters, err := n.host.Meta().Voters()
	if err != nil {
		return err
	}
	self := n.cfg.NodeID
	var kept []string
	var removeSelf bool
	for _, v := range voters {
		nd, ok := r.Node(v)
		if ok && nd.Role != cluster.RoleLeaving && nd.Role != cluster.RoleDead {
			kept = append(kept, v)
			continue
		}
		if v == self {
			removeSelf = true
			continue
		}
		if err := n.host.Meta().RemoveServer(v, replicas.ProposeTimeout); err != nil {
			return fmt.Errorf("remove %s from the meta group: %w", v, err)
		}
		n.cfg.Logger.Info("node left the meta group", "node", v)
	}
	want := cluster.MetaVoters(len(r.Nodes))
	for _, nd := range r.Nodes {
		if len(kept) >= want {
			break
		}
		if slices.Contains(kept, nd.ID) || nd.Role != cluster.RoleMember || !n.host.Up(nd.ID) {
			continue
		}
		if err := n.host.Meta().AddVoter(nd, replicas.ProposeTimeout); err != nil {
			return fmt.Errorf("add %s to the meta group: %w", nd.ID, err)
		}
		kept = append(kept, nd.ID)
		n.cfg.Logger.Info("node joined the meta group", "node", nd.ID)
	}
	if removeSelf && len(kept) > 0 {
		return n.host.Meta().RemoveServer(self, replicas.ProposeTimeout)
	}
	return nil
}

// peerRing checks a peer call about partition p: the caller, a formed
// cluster, p below P. It returns the ring.
func (n *Node) peerRing(addr string, h http.Header, p uint32) (*cluster.Ring, error) {
	if err := n.checkPeer(addr, h); err != nil {
		return nil, err
	}
	r := n.host.Ring()
	if r == nil {
		return nil, apierr.NotFormed
	}
	if int(p) >= r.Partitions {
		return nil, apierr.Invalid("partition", "%d is not below the partition count %d", p, r.Partitions)
	}
	return r, nil
}

// ChangeGroup changes partition p's Raft configuration on p's leader.
func (s peerService) ChangeGroup(_ context.Context, req *connect.Request[nornv1.ChangeGroupRequest]) (*connect.Response[nornv1.ChangeGroupResponse], error) {
	n, m := s.n, req.Msg
	_, err := n.peerRing(req.Peer().Addr, req.Header(), m.GetPartition())
	if err != nil {
		return nil, err
	}
	if m.GetNode() == "" {
		return nil, apierr.Invalid("node", "is required")
	}
	p := uint16(m.GetPartition())
	g := n.host.Group(p)
	if g == nil {
		return nil, n.coord.NotReplicated("partition", p)
	}
	if !g.IsLeader() {
		return nil, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("not the leader of partition %d (leader: %q)", p, g.Leader()))
	}
	switch m.GetOp() {
	case "add-nonvoter", "add-voter":
		if m.GetRaftAddress() == "" {
			return nil, apierr.Invalid("raft_address", "is required to add a server")
		}
		if m.GetOp() == "add-nonvoter" {
			err = g.AddNonvoter(m.GetNode(), m.GetRaftAddress(), replicas.ProposeTimeout)
		} else {
			err = g.AddVoter(m.GetNode(), m.GetRaftAddress(), replicas.ProposeTimeout)
		}
	case "remove":
		if m.GetNode() == n.cfg.NodeID {
			return nil, connect.NewError(connect.CodeFailedPrecondition,
				fmt.Errorf("the leader of partition %d does not remove itself; transfer the leadership first", p))
		}
		err = g.RemoveServer(m.GetNode(), replicas.ProposeTimeout)
	case "transfer-from":
		if m.GetNode() == n.cfg.NodeID {
			err = g.TransferLeadership()
		}
	default:
		return nil, apierr.Invalid("op", "unknown operation %q", m.GetOp())
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("partition %d %s %s: %w", p, m.GetOp(), m.GetNode(), err))
	}
	servers, err := g.Servers()
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	resp := &nornv1.ChangeGroupResponse{LastIndex: g.LastIndex(), Leader: string(g.Leader())}
	for _, sv := range servers {
		resp.Servers = append(resp.Servers, &nornv1.GroupServer{Id: sv.ID, Address: sv.Address, Voter: sv.Voter})
	}
	return connect.NewResponse(resp), nil
}

// ReplicaProgress reports this node's replica of a partition.
func (s peerService) ReplicaProgress(_ context.Context, req *connect.Request[nornv1.ReplicaProgressRequest]) (*connect.Response[nornv1.ReplicaProgressResponse], error) {
	n, m := s.n, req.Msg
	r, err := n.peerRing(req.Peer().Addr, req.Header(), m.GetPartition())
	if err != nil {
		return nil, err
	}
	if len(m.GetFillFrom()) > r.Replication+1 {
		return nil, apierr.Invalid("fill_from", "names %d nodes; at most %d", len(m.GetFillFrom()), r.Replication+1)
	}
	p := uint16(m.GetPartition())
	resp := &nornv1.ReplicaProgressResponse{RingEpoch: r.Epoch, Round: n.ae.Rounds()}
	if g := n.host.Group(p); g != nil {
		resp.Open = true
		resp.AppliedIndex = g.AppliedIndex()
		if len(m.GetFillFrom()) > 0 {
			resp.Filled = n.ae.FilledFrom(p, m.GetFillFrom(), m.GetAfterRound())
			if !resp.Filled {
				n.ae.Fill(p, m.GetFillFrom())
			}
		}
	}
	return connect.NewResponse(resp), nil
}
