package rebalance

import (
	"context"
	"fmt"
	"slices"
	"time"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/transport"
)

// A move's steps, one state at a time (the states are in the package
// doc): driveMove runs a move on the meta leader, stepMove takes its next
// step through its partition's leader (ChangeGroup) and its replicas
// (ReplicaProgress).

func targetDownMsg(id string, down, timeout time.Duration) string {
	return fmt.Sprintf("target %s down for %s (-move-target-timeout %s)", id, down.Round(time.Second), timeout)
}

// driveMove drives partition p's move under way until it is done, this
// node stops leading the meta group, or the driver closes.
func (d *Driver) driveMove(p int) {
	defer d.stopped.Done()
	defer func() {
		d.mu.Lock()
		delete(d.running, p)
		delete(d.fillFrom, p)
		delete(d.catchUpTo, p)
		d.mu.Unlock()
	}()
	backoff := movePoll
	for {
		select {
		case <-d.stop:
			return
		default:
		}
		if d.host.Meta().LeaderReady(replicas.ProposeTimeout) != nil {
			return // not the (ready) meta leader any more: the next one resumes
		}
		r := d.host.Meta().Ring()
		m := r.ActiveMove(p)
		if m == nil {
			return
		}
		if down := d.downFor(m.To); m.State.CanRollBack() && down >= d.cfg.MoveTargetTimeout {
			d.rollBack(p, targetDownMsg(m.To, down, d.cfg.MoveTargetTimeout))
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), moveStepTimeout)
		progressed, err := d.stepMove(ctx, r, *m)
		cancel()
		wait := movePoll
		if err != nil {
			d.noteMoveError(p, *m, err)
			wait, backoff = backoff, min(2*backoff, 5*time.Second)
		} else {
			backoff = movePoll
			if progressed {
				wait = 0
			}
		}
		select {
		case <-d.stop:
			return
		case <-time.After(wait):
		}
	}
}

// noteMoveError records a step's error in the move (shown by status), once
// per distinct message.
func (d *Driver) noteMoveError(p int, m cluster.Move, err error) {
	msg := apierr.Message(err)
	if m.Error == msg {
		return
	}
	d.cfg.Logger.Warn("partition move step failed; retrying", "partition", p, "from", m.From, "to", m.To,
		"state", m.State, "err", msg)
	_, _ = d.editRing(func(r *cluster.Ring) (bool, error) {
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
func (d *Driver) rollBack(p int, why string) {
	_, err := d.editRing(func(r *cluster.Ring) (bool, error) {
		return r.RollBack(p, why), nil
	})
	if err != nil {
		d.cfg.Logger.Warn("rolling a partition move back failed", "partition", p, "err", err)
		return
	}
	d.cfg.Logger.Warn("rolling a partition move back", "partition", p, "why", why)
}

// setMoveState records partition p's move (still in state from) in state
// to.
func (d *Driver) setMoveState(p int, from, to cluster.MoveState) error {
	_, err := d.editRing(func(r *cluster.Ring) (bool, error) {
		m := r.ActiveMove(p)
		if m == nil || m.State != from {
			return false, nil
		}
		m.State, m.Error = to, ""
		return true, nil
	})
	if err == nil {
		d.cfg.Logger.Info("partition move step", "partition", p, "state", to)
	}
	return err
}

// stepMove takes the next step of move m of ring r. It reports whether
// the move changed state; false with no error means it waits.
func (d *Driver) stepMove(ctx context.Context, r *cluster.Ring, m cluster.Move) (bool, error) {
	p := m.Partition
	to, ok := r.Node(m.To)
	if !ok {
		return false, fmt.Errorf("target %s is not in the ring", m.To)
	}
	switch m.State {
	case cluster.MoveFilling:
		filled, err := d.moveFilled(ctx, r, m)
		if err != nil || !filled {
			return false, err
		}
		if _, err := d.changeGroup(ctx, r, p, "add-nonvoter", to); err != nil {
			return false, err
		}
		return true, d.setMoveState(p, cluster.MoveFilling, cluster.MoveCatchingUp)

	case cluster.MoveCatchingUp:
		cfg, err := d.changeGroup(ctx, r, p, "add-nonvoter", to)
		if err != nil {
			return false, err
		}
		prog, err := d.replicaProgress(ctx, to, p, nil, 0)
		if err != nil {
			return false, err
		}
		// Under load the leader's last index runs ahead of what any
		// follower has applied (the commit index reaches followers with
		// the next append), so B is caught up once it has applied the
		// last index the leader had at the previous poll: it is less than
		// a poll behind (the Raft thesis's catch-up rounds).
		d.mu.Lock()
		prev := d.catchUpTo[p]
		caught := prev > 0 && prog.AppliedIndex >= prev || prog.AppliedIndex >= cfg.LastIndex
		d.catchUpTo[p] = cfg.LastIndex
		d.mu.Unlock()
		if !caught {
			return false, nil
		}
		if _, err := d.changeGroup(ctx, r, p, "add-voter", to); err != nil {
			return false, err
		}
		return true, d.setMoveState(p, cluster.MoveCatchingUp, cluster.MovePromoted)

	case cluster.MovePromoted:
		from, _ := r.Node(m.From)
		from.ID = m.From // the calls name it even if the ring lost it
		cfg, err := d.changeGroup(ctx, r, p, "transfer-from", from)
		if err != nil {
			return false, err
		}
		if cfg.Leader == m.From {
			return false, nil // the transfer is under way
		}
		if !serverVotes(cfg.Servers, m.To) {
			// A new meta leader may find the move recorded promoted
			// before the promotion reached the group: promote again.
			if _, err := d.changeGroup(ctx, r, p, "add-voter", to); err != nil {
				return false, err
			}
		}
		if _, err := d.changeGroup(ctx, r, p, "remove", from); err != nil {
			return false, err
		}
		_, err = d.editRing(func(r *cluster.Ring) (bool, error) {
			cur := r.ActiveMove(p)
			if cur == nil || cur.State != cluster.MovePromoted {
				return false, nil
			}
			return true, r.FinishMove(p)
		})
		if err == nil {
			d.cfg.Logger.Info("partition moved", "partition", p, "from", m.From, "to", m.To)
		}
		return err == nil, err

	case cluster.MoveRollingBack:
		// To leaves the group (it may have become a voter before the
		// ring recorded it: hand its leadership over first), then the
		// ring drops it as a replica and its replica is dropped.
		cfg, err := d.changeGroup(ctx, r, p, "transfer-from", to)
		if err != nil {
			return false, err
		}
		if cfg.Leader == m.To {
			return false, nil // the transfer is under way
		}
		if slices.ContainsFunc(cfg.Servers, func(s *nornv1.GroupServer) bool { return s.GetId() == m.To }) {
			if _, err := d.changeGroup(ctx, r, p, "remove", to); err != nil {
				return false, err
			}
		}
		_, err = d.editRing(func(r *cluster.Ring) (bool, error) {
			cur := r.ActiveMove(p)
			if cur == nil || cur.State != cluster.MoveRollingBack {
				return false, nil
			}
			return true, r.FailRollback(p)
		})
		if err == nil {
			d.cfg.Logger.Warn("partition move rolled back", "partition", p, "from", m.From, "to", m.To, "why", m.Rollback)
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
func (d *Driver) moveFilled(ctx context.Context, r *cluster.Ring, m cluster.Move) (bool, error) {
	p := m.Partition
	to, _ := r.Node(m.To)
	d.mu.Lock()
	after, known := d.fillFrom[p]
	d.mu.Unlock()
	fromDead := false
	if role, _ := r.Role(m.From); role == cluster.RoleDead || !d.host.Up(m.From) {
		fromDead = true
	}
	if !known {
		for _, id := range r.Replicas(p) {
			nd, _ := r.Node(string(id))
			if string(id) == m.From && fromDead || string(id) != m.To && !d.host.Up(string(id)) {
				continue
			}
			prog, err := d.replicaProgress(ctx, nd, p, nil, 0)
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
		d.mu.Lock()
		d.fillFrom[p] = after
		d.mu.Unlock()
	}
	// Every live member of the cohort, not only From: a write acked
	// before the move by a quorum without From is on the others.
	var sources []string
	for _, id := range r.Cohort(p) {
		if role, _ := r.Role(string(id)); role != cluster.RoleDead && d.host.Up(string(id)) {
			sources = append(sources, string(id))
		}
	}
	if len(sources) == 0 {
		return false, fmt.Errorf("no live replica of partition %d to fill %s from", p, m.To)
	}
	prog, err := d.replicaProgress(ctx, to, p, sources, after)
	if err != nil {
		return false, err
	}
	return prog.Filled, nil
}

// changeGroup asks partition p's leader for a configuration change of the
// group (op about node nd), trying each replica of p until the leader
// answers.
func (d *Driver) changeGroup(ctx context.Context, r *cluster.Ring, p int, op string, nd cluster.RingNode) (*nornv1.ChangeGroupResponse, error) {
	req := &nornv1.ChangeGroupRequest{Partition: uint32(p), Op: op, Node: nd.ID, RaftAddress: nd.RaftAddr}
	candidates := r.Replicas(p)
	if g := d.host.Group(uint16(p)); g != nil {
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
		if !ok || !d.host.Up(string(id)) {
			continue
		}
		resp, err := d.peers.Get(target.APIAddr).Peer.ChangeGroup(ctx, transport.Request(d.peers, req))
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
func (d *Driver) replicaProgress(ctx context.Context, nd cluster.RingNode, p int, fillFrom []string, after uint64) (*nornv1.ReplicaProgressResponse, error) {
	resp, err := d.peers.Get(nd.APIAddr).Peer.ReplicaProgress(ctx, transport.Request(d.peers,
		&nornv1.ReplicaProgressRequest{Partition: uint32(p), FillFrom: fillFrom, AfterRound: after}))
	if err != nil {
		return nil, fmt.Errorf("progress of %s: %w", nd.ID, err)
	}
	return resp.Msg, nil
}
