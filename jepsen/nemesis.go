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
	// Churn is what the membership-churn nemesis did and expects of the
	// placement (CheckPlacement).
	Churn *Churn
	// Rogue is what the rogue-node nemesis tried (CheckRogue).
	Rogue *Rogue
	// ScheduleCreated is when the schedule of Scenario.Schedule was
	// created (its ticks are every scheduleEvery after it); zero without.
	ScheduleCreated time.Time
}

// lockedSource makes a rand.Source safe for the nemeses that run at the
// same time.
type lockedSource struct {
	mu  sync.Mutex
	src rand.Source
}

func (s *lockedSource) Uint64() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.src.Uint64()
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

func (e *Env) randomNode() *Node {
	ns := e.C.Active()
	return ns[e.Rng.IntN(len(ns))]
}

func ids(ns []*Node) string {
	var s []string
	for _, n := range ns {
		s = append(s, n.ID)
	}
	return strings.Join(s, ",")
}

func (e *Env) others(n *Node) []*Node {
	var out []*Node
	for _, o := range e.C.Active() {
		if o != n {
			out = append(out, o)
		}
	}
	return out
}

// HealAll ends every fault: removes the iptables rules, resumes paused
// nodes, restarts dead ones and resets the injected clocks (of the active
// nodes: a spare never started and a retired node stay down).
func (e *Env) HealAll() {
	err := e.Net.Heal()
	e.TL.Log("end", "heal-network", "", err)
	active := e.C.Active()
	for _, n := range active {
		if n.Paused() {
			e.TL.Log("end", "pause", n.ID, n.Resume())
		}
		if !n.Running() {
			e.TL.Log("end", "restart", n.ID, n.Start())
		}
	}
	if e.Hooks {
		for _, n := range active {
			if err := n.SetClock(0, 1); err != nil {
				e.TL.Log("note", "clock-reset", n.ID, err)
			}
			if err := n.RefuseStates(false); err != nil {
				e.TL.Log("note", "refuse-states-reset", n.ID, err)
			}
		}
	}
}

// The one-shot faults every nemesis is made of: start, hold for hold (or
// until ctx is done), end; each start and end goes to the timeline.

// killFor kills n -9 and restarts it after hold.
func (e *Env) killFor(ctx context.Context, n *Node, hold time.Duration, fault, detail string) {
	e.TL.Log("start", fault, detail, nil)
	n.Kill()
	sleep(ctx, hold)
	e.TL.Log("end", fault, n.ID, n.Start())
}

// crashFor cuts the power of every victim at once (unsynced writes lost,
// test hooks) and restarts them after hold; why, when set, is added to
// each start's detail.
func (e *Env) crashFor(ctx context.Context, victims []*Node, hold time.Duration, why string) {
	var wg sync.WaitGroup
	errs := make([]error, len(victims))
	for i, n := range victims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.Crash()
		}()
	}
	wg.Wait()
	for i, n := range victims {
		detail := n.ID
		if why != "" {
			detail += " (" + why + ")"
		}
		e.TL.Log("start", "power-loss", detail, errs[i])
	}
	sleep(ctx, hold)
	for _, n := range victims {
		e.TL.Log("end", "power-loss", n.ID, n.Start())
	}
}

// pauseFor stops n (SIGSTOP) and resumes it after hold.
func (e *Env) pauseFor(ctx context.Context, n *Node, hold time.Duration) {
	e.TL.Log("start", "pause-leader", n.ID+" (SIGSTOP, past the election timeout)", n.Pause())
	sleep(ctx, hold)
	e.TL.Log("end", "pause-leader", n.ID+" (SIGCONT)", n.Resume())
}

// flakyFor drops 20-40% of n's packets each way for hold.
func (e *Env) flakyFor(ctx context.Context, n *Node, hold time.Duration) {
	p := 0.2 + 0.2*e.Rng.Float64()
	e.TL.Log("start", "flaky", fmt.Sprintf("%s drops %.2f of its packets each way", n.ID, p), e.Net.Flaky(n, p))
	sleep(ctx, hold)
	e.TL.Log("end", "flaky", n.ID, e.Net.Heal())
}

// bumpClockFor sets n's clock offset to off for hold (test hooks); why
// says how off compares with the buffer.
func (e *Env) bumpClockFor(ctx context.Context, n *Node, off, hold time.Duration, why string) {
	e.TL.Log("start", "clock-bump", fmt.Sprintf("%s offset %s (%s)", n.ID, off, why), n.SetClock(off, 1))
	sleep(ctx, hold)
	e.TL.Log("end", "clock-bump", n.ID, n.SetClock(0, 1))
}

// justInBound is a clock offset just inside the nodes' max clock offset
// (19/20 of it): a node that far from the others' median still leads.
func (e *Env) justInBound() time.Duration { return e.C.Cfg.MaxClockOffset * 19 / 20 }

// eitherWay returns d or -d, by the seed.
func (e *Env) eitherWay(d time.Duration) time.Duration {
	if e.Rng.IntN(2) == 0 {
		return -d
	}
	return d
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
		e.killFor(ctx, n, e.between(2*time.Second, 4*time.Second), "kill", n.ID)
	}
}

func nemesisKillAll(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(4*time.Second, 6*time.Second)) {
		victims := e.C.Active()
		for _, n := range victims {
			e.TL.Log("start", "kill", n.ID, nil)
			n.Kill()
		}
		sleep(ctx, 2*time.Second)
		for _, n := range victims {
			e.TL.Log("end", "kill", n.ID, n.Start())
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
		ns := e.C.Active()
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
		e.pauseFor(ctx, e.C.TopLeader(), e.between(2*time.Second, 4*time.Second))
	}
}

func nemesisWorkerPause(ctx context.Context, e *Env) {
	stall := e.W.ShortLease + e.C.Cfg.SkewBuffer + 1500*time.Millisecond
	for sleep(ctx, e.between(1*time.Second, 2*time.Second)) {
		i := e.Rng.IntN(e.W.Clients)
		e.W.Stall(i, stall)
		e.TL.Log("note", "worker-pause", fmt.Sprintf("client %d is to hold its next short claim %s without renewing", i, stall), nil)
	}
}

func nemesisFlaky(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(1*time.Second, 2*time.Second)) {
		e.flakyFor(ctx, e.randomNode(), 8*time.Second)
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
		e.bumpClockFor(ctx, n, off, 5*time.Second, "below the "+e.C.Cfg.SkewBuffer.String()+" buffer")
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
			victims = e.C.Active()
		}
		e.crashFor(ctx, victims, 2*time.Second, "")
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

// shuffled returns the active nodes in a seeded random order.
func (e *Env) shuffled() []*Node {
	ns := e.C.Active()
	e.Rng.Shuffle(len(ns), func(i, j int) { ns[i], ns[j] = ns[j], ns[i] })
	return ns
}

func links(ls [][2]*Node) string {
	var s []string
	for _, l := range ls {
		s = append(s, l[0].ID+"-"+l[1].ID)
	}
	return strings.Join(s, " ")
}

// ringLinks are the links to cut so that the nodes, in this order, form a
// ring where each talks only to its two neighbours: with 5 nodes every
// node sees a majority (itself and its neighbours), and no two nodes see
// the same one.
func ringLinks(ns []*Node) [][2]*Node {
	var out [][2]*Node
	for i := range ns {
		for j := i + 1; j < len(ns); j++ {
			if d := j - i; d != 1 && d != len(ns)-1 {
				out = append(out, [2]*Node{ns[i], ns[j]})
			}
		}
	}
	return out
}

// bridgeLinks are the links to cut so that the nodes, in this order, split
// into two halves that talk only through the middle node (the bridge).
func bridgeLinks(ns []*Node) [][2]*Node {
	var out [][2]*Node
	half := len(ns) / 2
	for _, a := range ns[:half] {
		for _, b := range ns[len(ns)-half:] {
			out = append(out, [2]*Node{a, b})
		}
	}
	return out
}

// nemesisCutLinks applies the links cut picks for a shuffled order of the
// nodes for 6 s, heals, and repeats.
func nemesisCutLinks(fault string, pick func([]*Node) [][2]*Node) Nemesis {
	return func(ctx context.Context, e *Env) {
		for sleep(ctx, e.between(2*time.Second, 3*time.Second)) {
			ns := e.shuffled()
			ls := pick(ns)
			err := e.Net.CutLinks(ls)
			e.TL.Log("start", fault, fmt.Sprintf("order %s, cut %s (probed)", ids(ns), links(ls)), err)
			sleep(ctx, 6*time.Second)
			e.TL.Log("end", fault, "", e.Net.Heal())
		}
	}
}

// nemesisClockBumpBig bumps a random node's clock by 3 s to 2 min either
// way (half the bumps below 30 s): above the skew buffer, still below the
// long leases (the run time + 10 min), so short leases may overlap: the
// exclusion checker reports the overlaps, which show what the buffer
// protects, without failing the run.
func nemesisClockBumpBig(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(1*time.Second, 2*time.Second)) {
		n := e.randomNode()
		off := e.between(3*time.Second, 30*time.Second)
		if e.Rng.IntN(2) == 0 {
			off = e.between(30*time.Second, 2*time.Minute)
		}
		e.bumpClockFor(ctx, n, e.eitherWay(off), e.between(3*time.Second, 6*time.Second), "above the "+e.C.Cfg.SkewBuffer.String()+" buffer")
	}
}

// nemesisLeaderClockBeyond moves the top leader's clock 3 s to 2 min
// either way (beyond the max clock offset and the skew buffer) for 3-6 s,
// over and over: the node must give up its leaderships and stamp no lease
// with that clock, so exclusion must hold even though the offset exceeds
// the buffer.
func nemesisLeaderClockBeyond(ctx context.Context, e *Env) {
	for sleep(ctx, e.between(1*time.Second, 2*time.Second)) {
		n := e.C.TopLeader()
		off := e.eitherWay(e.between(3*time.Second, 2*time.Minute))
		e.bumpClockFor(ctx, n, off, e.between(3*time.Second, 6*time.Second), "top leader; beyond the max clock offset and the "+e.C.Cfg.SkewBuffer.String()+" buffer")
	}
}

// A fault is one fault of the combined nemesis: it starts, holds for
// hold (or until ctx is done), and ends. Faults of different kinds may run
// at the same time.
type fault struct {
	name, kind string // kind: net, process or clock (one of each at a time)
	run        func(ctx context.Context, e *Env, hold time.Duration)
}

var combinedFaults = []fault{
	{"kill-random", "process", func(ctx context.Context, e *Env, hold time.Duration) {
		n := e.randomNode()
		e.killFor(ctx, n, hold, "kill", n.ID)
	}},
	{"power-loss", "process", func(ctx context.Context, e *Env, hold time.Duration) {
		e.crashFor(ctx, []*Node{e.randomNode()}, hold, "")
	}},
	{"pause-leader", "process", func(ctx context.Context, e *Env, hold time.Duration) {
		e.pauseFor(ctx, e.C.TopLeader(), hold)
	}},
	{"isolate", "net", func(ctx context.Context, e *Env, hold time.Duration) {
		e.isolate(ctx, e.randomNode(), hold, "isolate")
	}},
	{"leader-isolation", "net", func(ctx context.Context, e *Env, hold time.Duration) {
		e.isolate(ctx, e.C.TopLeader(), hold, "isolate-leader")
	}},
	{"flaky", "net", func(ctx context.Context, e *Env, hold time.Duration) {
		e.flakyFor(ctx, e.randomNode(), hold)
	}},
	{"clock-bump", "clock", func(ctx context.Context, e *Env, hold time.Duration) {
		n := e.randomNode()
		off := e.eitherWay(time.Duration(e.Rng.Int64N(int64(e.C.Cfg.SkewBuffer * 3 / 4))))
		e.bumpClockFor(ctx, n, off, hold, "below the "+e.C.Cfg.SkewBuffer.String()+" buffer")
	}},
}

// nemesisCombined runs, every few seconds, one to three faults of
// different kinds at once (a process fault, a network fault, a clock
// bump), picked and timed by the seed: each fault holds 2-6 s, the next
// round starts 1-3 s after the last fault of the round ends.
func nemesisCombined(ctx context.Context, e *Env) {
	byKind := map[string][]fault{}
	var kinds []string
	for _, f := range combinedFaults {
		if byKind[f.kind] == nil {
			kinds = append(kinds, f.kind)
		}
		byKind[f.kind] = append(byKind[f.kind], f)
	}
	for sleep(ctx, e.between(1*time.Second, 3*time.Second)) {
		var round []fault
		for _, k := range kinds {
			if len(round) == 0 || e.Rng.IntN(2) == 0 {
				fs := byKind[k]
				round = append(round, fs[e.Rng.IntN(len(fs))])
			}
		}
		e.Rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		round = round[:1+e.Rng.IntN(len(round))]
		var names []string
		holds := make([]time.Duration, len(round))
		delays := make([]time.Duration, len(round))
		for i, f := range round {
			names = append(names, f.name)
			holds[i] = e.between(2*time.Second, 6*time.Second)
			delays[i] = e.between(0, time.Second)
		}
		e.TL.Log("note", "combined", strings.Join(names, " + "), nil)
		var wg sync.WaitGroup
		for i, f := range round {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if sleep(ctx, delays[i]) {
					f.run(ctx, e, holds[i])
				}
			}()
		}
		wg.Wait()
	}
}
