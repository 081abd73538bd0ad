package jepsen

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// The AdminService calls and Status polls the membership-churn nemesis
// (churn.go) is made of: an admin call retried while the meta group has
// no reachable leader, the freshest Status of the active nodes, a move
// under way to kill a node of, the wait for a plan's moves.

// adminRetry calls f through the active running nodes, from a random one
// in turn, until it succeeds or churnAdminRetry passes: an error other
// than UNAVAILABLE, a deadline or a transport error ends it at once,
// unless retryAll (Join: gossip may not have shown the node to the meta
// leader yet).
func (e *Env) adminRetry(ctx context.Context, what string, f func(ctx context.Context, via *Node) error, retryAll bool) error {
	deadline := time.Now().Add(churnAdminRetry)
	for i := 0; ; i++ {
		ns := e.runningActive()
		if len(ns) == 0 {
			return errors.New("no active node is running")
		}
		via := ns[e.Rng.IntN(len(ns))]
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(cctx, via)
		cancel()
		if err == nil {
			return nil
		}
		switch connect.CodeOf(err) {
		case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeUnknown, connect.CodeCanceled:
		default:
			if !retryAll {
				return err
			}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("%s via %s (attempt %d): %w", what, via.ID, i+1, err)
		}
		if i == 0 || i%10 == 0 {
			e.TL.Log("note", "admin-retry", fmt.Sprintf("%s via %s", what, via.ID), err)
		}
		sleep(ctx, 500*time.Millisecond)
	}
}

func (e *Env) runningActive() []*Node {
	var out []*Node
	for _, n := range e.C.Active() {
		if n.Running() && !n.Paused() {
			out = append(out, n)
		}
	}
	return out
}

// freshestStatus asks every active running node but skip for its Status
// and returns the answer with the highest ring epoch.
func (e *Env) freshestStatus(ctx context.Context, skip *Node) (*nornv1.StatusResponse, error) {
	var best *nornv1.StatusResponse
	var errs []error
	for _, n := range e.runningActive() {
		if n == skip {
			continue
		}
		st, err := n.Status(ctx, false)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.ID, err))
			continue
		}
		if best == nil || st.RingEpoch > best.RingEpoch {
			best = st
		}
	}
	if best == nil {
		return nil, fmt.Errorf("no node answered Status: %w", errors.Join(errs...))
	}
	return best, nil
}

// waitStatus polls the freshest Status (of the nodes but skip) until cond
// holds, deadline passes or ctx ends.
func (e *Env) waitStatus(ctx context.Context, deadline time.Time, skip *Node, cond func(*nornv1.StatusResponse) bool) error {
	var last error
	for {
		st, err := e.freshestStatus(ctx, skip)
		if err == nil && cond(st) {
			return nil
		}
		if err != nil {
			last = err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			if last == nil {
				last = errors.New("condition not met")
			}
			return fmt.Errorf("timed out: %w", last)
		}
		sleep(ctx, churnPoll)
	}
}

// moveVictim waits for a move of the plan (ring epoch >= minEpoch) that
// is filling or catching up, and picks (seeded) its source or its target;
// nil when every move has ended, or at the deadline.
func (e *Env) moveVictim(ctx context.Context, minEpoch uint64, deadline time.Time) (*Node, string) {
	for ctx.Err() == nil && time.Now().Before(deadline) {
		st, err := e.freshestStatus(ctx, nil)
		if err != nil || st.RingEpoch < minEpoch {
			sleep(ctx, churnPoll)
			continue
		}
		var running []*nornv1.MoveStatus
		ended := true
		for _, m := range st.Moves {
			if m.State != "done" && m.State != "failed" {
				ended = false
			}
			if m.State == "filling" || m.State == "catching-up" {
				running = append(running, m)
			}
		}
		if ended {
			return nil, ""
		}
		if len(running) > 0 {
			m := running[e.Rng.IntN(len(running))]
			side, id := "source", m.FromNode
			if e.Rng.IntN(2) == 0 {
				side, id = "target", m.ToNode
			}
			if n := e.C.Node(id); n != nil && e.C.IsActive(n) && n.Running() {
				return n, fmt.Sprintf("%s of the move of partition %d %s -> %s, %s", side, m.Partition, m.FromNode, m.ToNode, m.State)
			}
		}
		sleep(ctx, churnPoll)
	}
	return nil, ""
}

// waitHealthy waits until n answers /healthz.
func (e *Env) waitHealthy(ctx context.Context, n *Node, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !n.Healthy() {
		if !n.Running() {
			return fmt.Errorf("%s is not running", n.ID)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not healthy after %s", n.ID, timeout)
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// waitMovesDone waits until the ring (epoch >= minEpoch) shows every move
// of the plan done, logging the progress; a failed move or the deadline
// is an error. It returns how many moves the plan has.
func (e *Env) waitMovesDone(ctx context.Context, phase string, minEpoch uint64, deadline time.Time) (int, error) {
	lastDone := -1
	var last *nornv1.StatusResponse
	for {
		st, err := e.freshestStatus(ctx, nil)
		if err == nil && st.RingEpoch >= minEpoch {
			last = st
			done, open := 0, 0
			var failed []string
			for _, m := range st.Moves {
				switch m.State {
				case "done":
					done++
				case "failed":
					failed = append(failed, fmt.Sprintf("partition %d %s -> %s: %s", m.Partition, m.FromNode, m.ToNode, m.Error))
				default:
					open++
				}
			}
			if done != lastDone {
				e.TL.Log("note", "moves", fmt.Sprintf("%s: %d of %d moves done (ring epoch %d)", phase, done, len(st.Moves), st.RingEpoch), nil)
				lastDone = done
			}
			if len(failed) > 0 {
				return len(st.Moves), fmt.Errorf("moves failed: %s", strings.Join(failed, "; "))
			}
			if open == 0 {
				return len(st.Moves), nil
			}
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("cut short: %w", ctx.Err())
		}
		if time.Now().After(deadline) {
			desc := "no status"
			if last != nil {
				desc = moveList(last.Moves)
			}
			return 0, fmt.Errorf("moves not done within %s: %s", churnMovesTimeout, desc)
		}
		sleep(ctx, churnPoll)
	}
}

func moveList(ms []*nornv1.MoveStatus) string {
	var s []string
	for _, m := range ms {
		x := fmt.Sprintf("p%d %s->%s", m.Partition, m.FromNode, m.ToNode)
		if m.State != "queued" {
			x += " " + m.State
		}
		if m.Error != "" {
			x += " (" + m.Error + ")"
		}
		s = append(s, x)
	}
	return strings.Join(s, ", ")
}

func loads(ls []*nornv1.NodeLoad) string {
	var s []string
	for _, l := range ls {
		s = append(s, fmt.Sprintf("%s %d->%d", l.NodeId, l.Before, l.After))
	}
	return strings.Join(s, " ")
}
