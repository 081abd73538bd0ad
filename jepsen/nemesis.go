package jepsen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// Env is what a nemesis acts on.
type Env struct {
	C     *Cluster
	Net   *Net
	TL    *Timeline
	Rng   *rand.Rand
	W     *Workload
	Hooks bool
}

// sleep waits d or until ctx is done; it reports whether the time passed.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func (e *Env) between(a, b time.Duration) time.Duration {
	return a + time.Duration(e.Rng.Int64N(int64(b-a)+1))
}

func (e *Env) randomNode() *Node { return e.C.Nodes[e.Rng.IntN(len(e.C.Nodes))] }

func ids(ns []*Node) string {
	var s []string
	for _, n := range ns {
		s = append(s, n.ID)
	}
	return strings.Join(s, ",")
}

func (e *Env) others(n *Node) []*Node {
	var out []*Node
	for _, o := range e.C.Nodes {
		if o != n {
			out = append(out, o)
		}
	}
	return out
}

// HealAll ends every fault: removes the iptables rules, resumes paused
// nodes, restarts dead ones and resets the injected clocks.
func (e *Env) HealAll() {
	err := e.Net.Heal()
	e.TL.Log("end", "heal-network", "", err)
	for _, n := range e.C.Nodes {
		if n.Paused() {
			e.TL.Log("end", "pause", n.ID, n.Resume())
		}
		if !n.Running() {
			e.TL.Log("end", "restart", n.ID, n.Start())
		}
	}
	if e.Hooks {
		for _, n := range e.C.Nodes {
			if err := n.SetClock(0, 1); err != nil {
				e.TL.Log("note", "clock-reset", n.ID, err)
			}
		}
	}
}

func (e *Env) kill(n *Node) {
	e.TL.Log("start", "kill", n.ID, nil)
	n.Kill()
}

func (e *Env) restart(n *Node) {
	e.TL.Log("end", "kill", n.ID, n.Start())
}

func (e *Env) isolate(ctx context.Context, n *Node, hold time.Duration, fault string) {
	err := e.Net.Partition([]*Node{n}, e.others(n))
	e.TL.Log("start", fault, n.ID+" | "+ids(e.others(n))+" (probed)", err)
	sleep(ctx, hold)
	e.TL.Log("end", fault, n.ID, e.Net.Heal())
}

// Nemesis is a fault schedule; it returns when ctx is done (the caller
// heals everything afterwards).
type Nemesis func(ctx context.Context, e *Env)

func nemesisNone(ctx context.Context, _ *Env) { <-ctx.Done() }

func nemesisKillRandom(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(2*time.Second, 4*time.Second)) {
		n := e.randomNode()
		e.kill(n)
		sleep(ctx, e.between(2*time.Second, 4*time.Second))
		e.restart(n)
	}
}

func nemesisKillAll(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(4*time.Second, 6*time.Second)) {
		for _, n := range e.C.Nodes {
			e.kill(n)
		}
		sleep(ctx, 2*time.Second)
		for _, n := range e.C.Nodes {
			e.restart(n)
		}
		sleep(ctx, 6*time.Second)
	}
}

func nemesisLeaderIsolation(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(2*time.Second, 3*time.Second)) {
		e.isolate(ctx, e.C.TopLeader(), 6*time.Second, "isolate-leader")
	}
}

func nemesisSplit(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(2*time.Second, 3*time.Second)) {
		ns := append([]*Node(nil), e.C.Nodes...)
		e.Rng.Shuffle(len(ns), func(i, j int) { ns[i], ns[j] = ns[j], ns[i] })
		minority, majority := ns[:len(ns)/2], ns[len(ns)/2:]
		err := e.Net.Partition(minority, majority)
		e.TL.Log("start", "split", ids(minority)+" | "+ids(majority)+" (probed)", err)
		sleep(ctx, 6*time.Second)
		e.TL.Log("end", "split", "", e.Net.Heal())
	}
}

func nemesisPauseLeader(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(2*time.Second, 3*time.Second)) {
		n := e.C.TopLeader()
		e.TL.Log("start", "pause-leader", n.ID+" (SIGSTOP, past the election timeout)", n.Pause())
		sleep(ctx, e.between(2*time.Second, 4*time.Second))
		e.TL.Log("end", "pause-leader", n.ID+" (SIGCONT)", n.Resume())
	}
}

func nemesisWorkerPause(ctx context.Context, e *Env) {
	stall := e.W.ShortLease + e.C.Cfg.SkewBuffer + 1500*time.Millisecond
	for sleep(ctx, e.between(1*time.Second, 2*time.Second)) {
		i := e.Rng.IntN(e.W.Clients)
		e.W.Stall(i, stall)
		e.TL.Log("start", "worker-pause", fmt.Sprintf("client %d holds its next short claim %s without renewing", i, stall), nil)
	}
}

func nemesisFlaky(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(1*time.Second, 2*time.Second)) {
		n := e.randomNode()
		p := 0.2 + 0.2*e.Rng.Float64()
		e.TL.Log("start", "flaky", fmt.Sprintf("%s drops %.2f of its packets each way", n.ID, p), e.Net.Flaky(n, p))
		sleep(ctx, 8*time.Second)
		e.TL.Log("end", "flaky", n.ID, e.Net.Heal())
	}
}

func nemesisIsolateConverge(ctx context.Context, e *Env) {
	if !sleep(ctx, 2*time.Second) {
		return
	}
	n := e.randomNode()
	err := e.Net.Partition([]*Node{n}, e.others(n))
	e.TL.Log("start", "isolate", n.ID+" | "+ids(e.others(n))+" (probed; healed at the end of the run)", err)
	<-ctx.Done()
}

func nemesisClockBump(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(1*time.Second, 2*time.Second)) {
		n := e.randomNode()
		off := time.Duration(e.Rng.Int64N(int64(1500*time.Millisecond))) - 750*time.Millisecond
		e.TL.Log("start", "clock-bump", fmt.Sprintf("%s offset %s (below the %s buffer)", n.ID, off, e.C.Cfg.SkewBuffer), n.SetClock(off, 1))
		sleep(ctx, 5*time.Second)
		e.TL.Log("end", "clock-bump", n.ID, n.SetClock(0, 1))
	}
}

func nemesisClockStrobe(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(1*time.Second, 2*time.Second)) {
		n := e.randomNode()
		e.TL.Log("start", "clock-strobe", n.ID+" offset +-700ms every 200ms for 4s", nil)
		for i := 0; i < 20 && ctx.Err() == nil; i++ {
			off := 700 * time.Millisecond
			if i%2 == 1 {
				off = -off
			}
			n.SetClock(off, 1)
			time.Sleep(200 * time.Millisecond)
		}
		e.TL.Log("end", "clock-strobe", n.ID, n.SetClock(0, 1))
	}
}

func nemesisPowerLoss(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(3*time.Second, 5*time.Second)) {
		victims := []*Node{e.randomNode()}
		if e.Rng.IntN(3) == 0 {
			victims = e.C.Nodes
		}
		for _, n := range victims {
			e.TL.Log("start", "power-loss", n.ID, n.Crash())
		}
		sleep(ctx, 2*time.Second)
		for _, n := range victims {
			e.TL.Log("end", "power-loss", n.ID, n.Start())
		}
	}
}

// nemesisLeaderClockAhead moves the top leader's clock 3/4 of the skew
// buffer ahead for 2 s, then back, over and over: a claim granted before a
// jump expires that much early in real time, which the buffer absorbs.
// nemesisPowerLossAll crashes every node at once (unsynced writes lost)
// every 3-5 s and restarts them 1 s later.
func nemesisPowerLossAll(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(3*time.Second, 5*time.Second)) {
		var wg sync.WaitGroup
		for _, n := range e.C.Nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e.TL.Log("start", "power-loss", n.ID, n.Crash())
			}()
		}
		wg.Wait()
		sleep(ctx, time.Second)
		for _, n := range e.C.Nodes {
			e.TL.Log("end", "power-loss", n.ID, n.Start())
		}
	}
}

func nemesisLeaderClockAhead(ctx context.Context, e *Env) {
	for sleep(ctx, 1*time.Second) {
		n := e.C.TopLeader()
		off := e.C.Cfg.SkewBuffer * 3 / 4
		e.TL.Log("start", "clock-bump", fmt.Sprintf("%s (top leader) offset +%s (below the buffer)", n.ID, off), n.SetClock(off, 1))
		sleep(ctx, 2*time.Second)
		e.TL.Log("end", "clock-bump", n.ID, n.SetClock(0, 1))
	}
}

// both runs nemeses at the same time.
func both(ns ...Nemesis) Nemesis {
	return func(ctx context.Context, e *Env) {
		var wg sync.WaitGroup
		for _, n := range ns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n(ctx, e)
			}()
		}
		wg.Wait()
	}
}
