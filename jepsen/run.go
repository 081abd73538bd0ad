package jepsen

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/norn-dev/norn/jepsen/check"
)

// Scenario is a named fault schedule with its cluster shape.
type Scenario struct {
	Name  string
	Desc  string
	Nodes int // node slots
	// Initial, when set, is how many nodes form the cluster; the other
	// slots are spares the nemesis starts and joins (ClusterConfig).
	Initial    int
	NeedsHooks bool
	Bugs       []string // seeded bugs: the run must FAIL (self-test)
	Args       []string // more nornd flags
	// Time and Clients, when set, replace the run's: what the scenario
	// needs to show its anomaly.
	Time    time.Duration
	Clients int
	Nemesis Nemesis
	Short   bool // part of jepsen-short
	// EnqueueShare, when set, replaces the workload's (see Workload).
	EnqueueShare float64
	// ShortLease, when set, replaces the workload's short lease (2.5 s).
	ShortLease time.Duration
	// BugMaxClockOffset, when set, is the nodes' -max-clock-offset while
	// the scenario's seeded bugs are on (the clean run keeps the
	// default): a setting only the bug lets a node start with.
	BugMaxClockOffset time.Duration
	// ReportOnly names checkers whose anomalies this scenario reports
	// without failing: the faults go beyond what the promise covers.
	ReportOnly []string
	// UntilNemesis, when set, makes the nemesis a finite sequence: the
	// workload runs until the nemesis returns (and at least the run's
	// time), at most UntilNemesis (the nemesis's context ends then).
	UntilNemesis time.Duration
	// Placement adds the placement checker (CheckPlacement) to the run's
	// verdicts; the nemesis records what it expects in Env.Churn.
	Placement bool
	// Rogue adds the rogue checker (CheckRogue): the nemesis records its
	// attempts in Env.Rogue.
	Rogue bool
	// Priorities runs the workload with priorities (5 of them, enqueues
	// acked by every replica, every claim through n1) and adds the
	// priority checker (check.Priority).
	Priorities bool
	// RetryShare and FailShare, when set, replace the workload's shares
	// of tasks with a retry policy and of fails among the ops on them
	// (retryShare, failShare).
	RetryShare, FailShare float64
	// ReviveShare, when set, replaces the workload's share of Retry ops
	// (reviveShare).
	ReviveShare float64
	// QueueCap, when set, caps the workload's queue at this many tasks
	// claimed at once (QueueService.SetQueue max_claimed) before the
	// workload starts, gives every claim a short lease (a long one
	// abandoned by its client would hold the cap to the end), and adds
	// the cap checker (check.Cap) with the overshoot the docs allow
	// during a fault: the cap again (limits.go).
	QueueCap uint32
	// DeadlineShare, when set, gives that share of the enqueued tasks a
	// deadline deadlineMin to deadlineMax away and adds the deadlines
	// checker (check.Deadlines). Not with Priorities or QueueCap: their
	// checkers see no op for a deadline's cancel.
	DeadlineShare float64
}

// The workload's retries in every scenario: a share of the tasks have a
// retry policy (retryAttempts attempts, a constant retryBackoff), and a
// client holding one fails its attempt at failShare of its ops on it.
// The backoff is above the retries checker's tolerance (the skew buffer,
// 2 s), so that a task granted at once after its fail is caught.
const (
	retryShare    = 0.3
	failShare     = 0.07
	retryAttempts = 3
	retryBackoff  = 3500 * time.Millisecond
	// reviveShare of a client's ops without a claim Retry a task it saw
	// cancelled or completed (the completed must be refused).
	reviveShare = 0.03
)

// The workload's deadlines (Scenario.DeadlineShare): short enough that
// many pass while their tasks wait or are held. deadlineSettle is how
// long after its deadline a task must have ended (a monitor pass, its
// proposal and the write, a margin for faults), deadlineTolerance how
// late on the history's clock a claim or complete may be called and
// still be taken when no node's clock was moved (rounding to ms).
const (
	deadlineMin       = 300 * time.Millisecond
	deadlineMax       = 3 * time.Second
	deadlineSettle    = 5 * time.Second
	deadlineTolerance = 50 * time.Millisecond
)

// prioritySettle is how long a task must have been claimable before the
// priority checker holds a claim of a lower priority against it: the 50
// ms bound on the other leaders' reports, their 250 ms wait, and a margin.
const prioritySettle = 500 * time.Millisecond

// Scenarios lists every scenario, in the order `make jepsen` runs them.
var Scenarios = []Scenario{
	{Name: "baseline", Desc: "no faults", Nodes: 3, Nemesis: nemesisNone, Short: true},
	{Name: "kill-random", Desc: "kill -9 a random node, restart it, repeat", Nodes: 3, Nemesis: nemesisKillRandom, Short: true},
	{Name: "kill-leader", Desc: "kill -9 the partition leader right after it grants a long claim, restart it (claims outrun enqueues: many wait)", Nodes: 3, Nemesis: nemesisKillClaimLeader, EnqueueShare: 0.2},
	{Name: "kill-all", Desc: "kill -9 every node at once, restart them all", Nodes: 3, Nemesis: nemesisKillAll},
	{Name: "leader-isolation", Desc: "iptables: cut the node leading the most partitions from the others", Nodes: 3, Nemesis: nemesisLeaderIsolation, Short: true},
	{Name: "split", Desc: "iptables: random majority/minority split (5 nodes: 2 | 3)", Nodes: 5, Nemesis: nemesisSplit},
	{Name: "majorities-ring", Desc: "iptables: 5 nodes in a ring, each talks only to its two neighbours (each sees a different majority)", Nodes: 5, Nemesis: nemesisCutLinks("majorities-ring", ringLinks)},
	{Name: "bridge", Desc: "iptables: 5 nodes in two halves that talk only through the middle node", Nodes: 5, Nemesis: nemesisCutLinks("bridge", bridgeLinks)},
	{Name: "pause-leader", Desc: "SIGSTOP the node leading the most partitions past the election timeout, SIGCONT", Nodes: 3, Nemesis: nemesisPauseLeader, Short: true},
	{Name: "worker-pause", Desc: "a client holds a short-lease claim past its lease without renewing, then completes", Nodes: 3, Nemesis: nemesisWorkerPause},
	{Name: "stale-worker", Desc: "a client holds a short claim past its lease while a node other than its leader is cut off; the leader expires and regrants the claim; the client completes through the cut-off node (forced to answer itself, w=1), then through any node: both must be refused (the fence)", Nodes: 3, Nemesis: nemesisStaleWorker, EnqueueShare: 0.2, Short: true},
	{Name: "complete-handover", Desc: "test hooks: a node stops exchanging task states with its peers (its Raft groups go on), so a complete acked at w=2 skips it; within milliseconds of the ack its partition's leadership moves to that node (-lease-grace 500ms, no leader balancing): it must not expire the finished claim nor grant the task again (the fence)",
		Nodes: 3, NeedsHooks: true, Nemesis: nemesisCompleteHandover, Args: completeHandoverArgs, EnqueueShare: 0.2, Short: true},
	{Name: "priority", Desc: "no faults; tasks of 5 priorities, enqueued at w=3, every claim through n1 (a worker pool behind one address): no claim may pass over a task of higher priority claimable for 500 ms",
		Nodes: 3, Nemesis: nemesisNone, Priorities: true, EnqueueShare: 0.6, Short: true},
	{Name: "queue-limits", Desc: "the workload's queue capped at 3 tasks claimed at once (max_claimed), 8 clients claiming through every node, kill -9 a random node (the queue's owner among them) and restart it: outside the fault windows at most 3 claims surely held at once, within them at most 6",
		Nodes: 3, Nemesis: nemesisKillRandom, QueueCap: 3, Clients: 8, Short: true},
	{Name: "deadlines", Desc: "half the tasks with a deadline 0.3 to 3 s away, kill -9 a random node and restart it: no claim granted and no complete taken at or after a task's deadline, and every task past it ended (completed before, or cancelled)",
		Nodes: 3, Nemesis: nemesisKillRandom, DeadlineShare: 0.5, Short: true},
	{Name: "flaky", Desc: "iptables statistic: drop 20-40% of one node's packets each way", Nodes: 3, Nemesis: nemesisFlaky},
	{Name: "isolate-converge", Desc: "cut one node off for the whole run while writes (W=2) skip it, heal, check convergence", Nodes: 3, Nemesis: nemesisIsolateConverge, Short: true},
	{Name: "clock-bump", Desc: "test hooks: bump a node's clock by up to +-750ms (below the 2s buffer)", Nodes: 3, NeedsHooks: true, Nemesis: nemesisClockBump},
	{Name: "clock-bump-big", Desc: "test hooks: bump a node's clock by 3 s to 2 min either way (above the 2s buffer, below the long leases) while workers stall past their short leases; exclusion overlaps are reported, not failed", Nodes: 3, NeedsHooks: true, Nemesis: both(nemesisClockBumpBig, nemesisWorkerPause), ReportOnly: []string{"exclusion"}},
	{Name: "clock-skew-leader", Desc: "test hooks: the top leader's clock 3 s to 2 min off (beyond the max clock offset) while workers stall past their leases; it must hand its leaderships over: every checker must pass", Nodes: 3, NeedsHooks: true, Nemesis: both(nemesisLeaderClockBeyond, nemesisWorkerPause)},
	{Name: "clock-opposite", Desc: "test hooks: two nodes' clocks at opposite offsets just inside the max clock offset (-+855ms, 1.71 s apart, below the 2s buffer) while workers hold 5 s leases past their end; each such lease the slow node granted has its partition's leadership moved to the fast node mid-lease (-lease-grace 500ms); every checker must pass",
		Nodes: 3, NeedsHooks: true, Nemesis: nemesisClockOpposite, Args: clockOppositeArgs, ShortLease: clockOppositeLease},
	{Name: "clock-strobe", Desc: "test hooks: a node's clock jumps +-700ms every 200ms", Nodes: 3, NeedsHooks: true, Nemesis: nemesisClockStrobe},
	{Name: "power-loss", Desc: "test hooks: POST /test/crash (unsynced writes lost) on one node or all, restart", Nodes: 3, NeedsHooks: true, Nemesis: nemesisPowerLoss},
	{Name: "combined", Desc: "a seeded schedule of one to three faults at once: kill, power loss or leader pause; isolation, leader isolation or flaky links; a clock bump below the buffer", Nodes: 3, NeedsHooks: true, Nemesis: nemesisCombined},
	{Name: "rogue-node", Desc: "outsiders at the doors of the secure cluster while the workload runs: a nornd with another CA's certificate and gossip key joins; Raft streams and PeerService writes from members' addresses with another CA's certificate, the CA's certificate of a non-member, a client's certificate; all must be refused and change nothing", Nodes: 3, Nemesis: nemesisRogue, Rogue: true, Short: true},
	{Name: "membership-churn", Desc: "3 nodes grow to 5 (start two spares, join, rebalance), drain one, decommission another (then stop it), each under load with kill -9 of a move's source or target while it runs; placement checked at the end",
		Nodes: 5, Initial: 3, Nemesis: nemesisMembershipChurn, UntilNemesis: 8 * time.Minute, Placement: true},
	{Name: "bug-claim-no-check", Desc: "self-test: seeded bug claim-no-check; kill -9 the partition leader right after it grants a long claim (its successor has not applied it and serves waiting claims at once), 8 clients for 60 s; must fail a checker", Nodes: 3, NeedsHooks: true, Bugs: []string{"claim-no-check"}, Nemesis: nemesisKillClaimLeader, Time: time.Minute, Clients: 8, EnqueueShare: 0.2},
	{Name: "bug-ack-before-sync", Desc: "self-test: seeded bug ack-before-sync; every node loses power right after an enqueue is acked; the clients only enqueue (no claim's Raft append syncs the shared WAL in between, so every strike loses what was acked unsynced); must fail a checker", Nodes: 3, NeedsHooks: true, Bugs: []string{"ack-before-sync"}, Nemesis: nemesisCrashAfterEnqueue, EnqueueShare: 1, Short: true},
	{Name: "bug-expiry-no-skew", Desc: "self-test: seeded bug expiry-no-skew; workers hold short claims past their leases while the granting leader's clock runs 3/4 of the buffer ahead; must fail a checker", Nodes: 3, NeedsHooks: true, Bugs: []string{"expiry-no-skew"}, Nemesis: nemesisStallLeaderClockAhead},
	{Name: "bug-skew-one-offset", Desc: "self-test: seeded bug skew-one-offset (config validation takes a skew buffer above one max clock offset, the rule before issue 41) with -max-clock-offset 1.8s; the clock-opposite faults (two clocks at -+1.71 s, 3.4 s apart) for 60 s; must fail a checker",
		Nodes: 3, NeedsHooks: true, Bugs: []string{"skew-one-offset"}, BugMaxClockOffset: 1800 * time.Millisecond, Nemesis: nemesisClockOpposite,
		Args: clockOppositeArgs, ShortLease: clockOppositeLease, Time: time.Minute},
	{Name: "bug-count-drift", Desc: "self-test: seeded bug count-drift (the task counters miss the claim FSM's moves), no faults; must fail a checker", Nodes: 3, NeedsHooks: true, Bugs: []string{"count-drift"}, Nemesis: nemesisNone, Short: true},
	{Name: "bug-tls-any-client", Desc: "self-test: seeded bug tls-any-client (the nodes take a client certificate of any CA), the rogue-node attempts; must fail a checker", Nodes: 3, NeedsHooks: true, Bugs: []string{"tls-any-client"}, Nemesis: nemesisRogue, Rogue: true},
	{Name: "bug-act-local", Desc: "self-test: seeded bug act-local (a replica that cannot reach its leader decides a complete from its own copy of the claim state), the stale-worker faults; must fail a checker", Nodes: 3, NeedsHooks: true, Bugs: []string{"act-local"}, Nemesis: nemesisStaleWorker, EnqueueShare: 0.2, Time: 45 * time.Second, Short: true},
	{Name: "bug-act-no-fence", Desc: "self-test: seeded bug act-no-fence (the claim FSM takes a complete under any claim of the task), the stale-worker faults; must fail a checker", Nodes: 3, NeedsHooks: true, Bugs: []string{"act-no-fence"}, Nemesis: nemesisStaleWorker, EnqueueShare: 0.2, Time: 45 * time.Second},
	{Name: "bug-end-after-write", Desc: "self-test: seeded bug end-after-write (a complete is written as a CRDT and the claim's end proposed a second later, dropped by a node that no longer leads: the path before the fence), the complete-handover faults; must fail a checker",
		Nodes: 3, NeedsHooks: true, Bugs: []string{"end-after-write"}, Nemesis: nemesisCompleteHandover, Args: completeHandoverArgs, EnqueueShare: 0.2, Time: 45 * time.Second, Short: true},
	{Name: "bug-claim-local-first", Desc: "self-test: seeded bug claim-local-first (a claim serves the partitions its node leads first, as before priority was strict across the cluster), the priority workload; must fail a checker",
		Nodes: 3, NeedsHooks: true, Bugs: []string{"claim-local-first"}, Nemesis: nemesisNone, Priorities: true, EnqueueShare: 0.6, Short: true},
	{Name: "bug-retry-no-backoff", Desc: "self-test: seeded bug retry-no-backoff (a task whose attempt failed is claimable again at once, whatever its backoff), no faults, every task with a retry policy; must fail a checker",
		Nodes: 3, NeedsHooks: true, Bugs: []string{"retry-no-backoff"}, Nemesis: nemesisNone, RetryShare: 1, FailShare: 0.2, Short: true},
	{Name: "bug-retry-completed", Desc: "self-test: seeded bug retry-completed (a Retry of a COMPLETED task is taken: the task is handed out again), no faults, Retry at 15% of the ops; must fail a checker",
		Nodes: 3, NeedsHooks: true, Bugs: []string{"retry-completed"}, Nemesis: nemesisNone, ReviveShare: 0.15, Short: true},
	{Name: "bug-cap-stale-count", Desc: "self-test: seeded bug cap-stale-count (a capped queue's owner checks the cap against a count a second old, blind to the claims under way), the queue-limits workload without faults; must fail a checker",
		Nodes: 3, NeedsHooks: true, Bugs: []string{"cap-stale-count"}, Nemesis: nemesisNone, QueueCap: 3, Clients: 8, Short: true},
	{Name: "bug-deadline-unfenced", Desc: "self-test: seeded bug deadline-unfenced (deadlines enforced only by the monitor's cancel of waiting tasks: claims, renews and completes past a deadline are taken, a claimed task runs on), no faults, 60% of the tasks with a deadline; must fail a checker",
		Nodes: 3, NeedsHooks: true, Bugs: []string{"deadline-unfenced"}, Nemesis: nemesisNone, DeadlineShare: 0.6, Short: true},
	{Name: "bug-drop-replicated-write", Desc: "self-test: seeded bug drop-replicated-write, no faults, anti-entropy off (every 1h) so that nothing repairs the dropped writes; must fail a checker", Nodes: 3, NeedsHooks: true, Bugs: []string{"drop-replicated-write"}, Args: []string{"-antientropy-interval", "1h"}, Nemesis: nemesisNone},
}

// minOKBeforeFault is how many ops must succeed before the first fault
// (the liveness checker's first condition).
const minOKBeforeFault = 50

// Nemeses describes the fault kinds, for --help.
var Nemeses = []string{
	"kill: kill -9 and restart (a random node, the top leader, all nodes)",
	"kill-leader (aimed): kill -9 the partition leader within 5 ms of its grant of a long claim",
	"pause: SIGSTOP/SIGCONT (the top partition leader, past the election timeout)",
	"partition: iptables drops by node uid, both directions, TCP and UDP, each cut proven by a probe (isolate one, leader isolation, majority/minority, majorities-ring, bridge)",
	"flaky: iptables -m statistic --mode random drops on one node's links",
	"worker-pause: a client stops renewing a short lease past its end",
	"refuse-states (aimed): a node exchanges no task states with its peers while its Raft groups go on (test hooks), and a complete acked at w=2 that skipped it has its partition's leadership moved to it within milliseconds",
	"clock: bumps below and above the skew buffer, strobe, and (aimed) the granting leader ahead while its claim's holder stalls, through POST /test/clock (needs nornd -test-hooks)",
	"power-loss: POST /test/crash, unsynced writes lost, on one node or all; (aimed) on all within 5 ms of an enqueue ack (needs nornd -test-hooks)",
	"combined: one to three faults of different kinds at once on a seeded schedule",
	"rogue: a foreign nornd joins, and Raft streams and PeerService writes with wrong certificates from members' addresses (every one must be refused)",
	"membership-churn: start spares and join them, rebalance, drain, decommission (AdminService), each with kill -9 of a node whose move is under way",
}

// FindScenario returns the named scenario.
func FindScenario(name string) (Scenario, bool) {
	for _, s := range Scenarios {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

// Options configure one run.
type Options struct {
	Scenario string
	Seed     uint64
	Time     time.Duration // workload time under faults
	Clients  int           // 4 to 8
	Results  string        // parent of the run's results directory
	Root     string        // module root, to build nornd (unless Bin is set)
	Bin      string        // a nornd binary to use
	// NoBugs runs a self-test scenario without its seeded bug (the clean
	// build must pass it).
	NoBugs bool
	// KeepData keeps the nodes' data dirs of a run with the expected
	// outcome (those of other runs are always kept).
	KeepData bool
	// Keep bounds the results directories kept under Results: before the
	// run, the oldest beyond Keep-1 are removed (0: 50; negative: none).
	Keep int
	Logf func(format string, args ...any)
}

// Result is one run's outcome.
type Result struct {
	Scenario string          `json:"scenario"`
	Seed     uint64          `json:"seed"`
	Dir      string          `json:"dir"`
	Skipped  string          `json:"skipped,omitempty"`
	Expect   string          `json:"expect"` // "valid", or "invalid" for a seeded bug
	Valid    bool            `json:"valid"`  // every checker passed
	OK       bool            `json:"ok"`     // the outcome is the expected one
	Verdicts []check.Verdict `json:"verdicts,omitempty"`
	Ops      int             `json:"ops"`
	Faults   int             `json:"faults"`
	Duration string          `json:"duration"`
	Err      string          `json:"error,omitempty"`
}

// cleanup runs registered functions once, at the end of a run or on
// SIGINT/SIGTERM.
type cleanup struct {
	mu  sync.Mutex
	fns []func()
}

func (c *cleanup) add(f func()) {
	c.mu.Lock()
	c.fns = append(c.fns, f)
	c.mu.Unlock()
}

func (c *cleanup) run() {
	c.mu.Lock()
	fns := c.fns
	c.fns = nil
	c.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// Run runs one scenario and checks its history.
func Run(ctx context.Context, o Options) (*Result, error) {
	sc, ok := FindScenario(o.Scenario)
	if !ok {
		return nil, fmt.Errorf("unknown scenario %q", o.Scenario)
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Clients == 0 {
		o.Clients = 5
	}
	if sc.Clients != 0 {
		o.Clients = sc.Clients
	}
	if sc.Time != 0 {
		o.Time = sc.Time
	}
	if o.Time == 0 {
		o.Time = 30 * time.Second
	}
	name := sc.Name
	if o.NoBugs && len(sc.Bugs) > 0 {
		sc.Bugs = nil
		name += "+clean"
	}
	started := time.Now()
	res := &Result{Scenario: name, Seed: o.Seed, Expect: "valid"}
	if len(sc.Bugs) > 0 {
		res.Expect = "invalid"
	}
	if o.Keep == 0 {
		o.Keep = 50
	}
	if o.Keep > 0 {
		if err := PruneResults(o.Results, o.Keep-1); err != nil {
			return nil, err
		}
	}
	dir := filepath.Join(o.Results, fmt.Sprintf("%s-seed%d-%s", name, o.Seed, started.UTC().Format("20060102T150405")))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	res.Dir = dir
	os.WriteFile(filepath.Join(dir, "seed"), []byte(fmt.Sprintf("%d\n", o.Seed)), 0o644)
	defer func() {
		res.Duration = time.Since(started).Round(time.Millisecond).String()
		b, _ := json.MarshalIndent(res, "", "  ")
		os.WriteFile(filepath.Join(dir, "result.json"), append(b, '\n'), 0o644)
	}()
	bin := o.Bin
	if bin == "" {
		var err error
		if bin, err = BuildNornd(o.Root, filepath.Join(dir, "bin")); err != nil {
			return nil, err
		}
	}
	hooks := HasTestHooks(bin)
	if sc.NeedsHooks && !hooks {
		res.Skipped = "needs a nornd built with the test hooks (go build -tags testhooks: -test-hooks)"
		res.OK = true
		return res, nil
	}
	if os.Geteuid() != 0 {
		res.Skipped = "needs root (iptables, nodes run as their own uids)"
		res.OK = true
		return res, nil
	}
	if IPTablesPath() == "" {
		res.Skipped = "needs iptables"
		res.OK = true
		return res, nil
	}
	var cl cleanup
	defer cl.run()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stopSig := make(chan struct{})
	defer func() { signal.Stop(sigs); close(stopSig) }()
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "norn-jepsen: %v: removing iptables rules and stopping the nodes\n", s)
			cl.run()
			os.Exit(130)
		case <-stopSig:
		}
	}()

	ccfg := ClusterConfig{Nodes: sc.Nodes, Initial: sc.Initial, Bin: bin, Dir: dir, Hooks: hooks, Bugs: sc.Bugs, ExtraArgs: sc.Args}
	if len(sc.Bugs) > 0 {
		ccfg.MaxClockOffset = sc.BugMaxClockOffset
	}
	c, err := NewCluster(ccfg)
	if err != nil {
		return nil, err
	}
	nt, err := NewNet(c.Nodes)
	if err != nil {
		return nil, err
	}
	// Registered first, so run last (after the nodes stop): a run with
	// the expected outcome leaves no data dirs behind.
	cl.add(func() {
		if res.OK && res.Err == "" && !o.KeepData {
			c.RemoveData()
		}
	})
	cl.add(nt.Close)
	cl.add(c.Stop)
	if tcp, udp := nt.Probe(c.Nodes[0], c.Nodes[1]); !tcp || !udp {
		return nil, fmt.Errorf("the probe does not get through an intact link (tcp %v, udp %v): it could not prove a cut", tcp, udp)
	}
	h := check.NewHistory()
	tl := &Timeline{h: h, logf: o.Logf}
	o.Logf("%s seed %d: starting %d nodes in %s", name, o.Seed, len(c.Active()), dir)
	if err := c.Start(90 * time.Second); err != nil {
		return nil, err
	}
	tl.Log("note", "cluster-ready", "", nil)

	// The run lasts o.Time, or with UntilNemesis until the nemesis is
	// done (at least o.Time, at most UntilNemesis); long leases outlast it.
	runFor := o.Time
	if sc.UntilNemesis > runFor {
		runFor = sc.UntilNemesis
	}
	w := &Workload{C: c, H: h, Clients: o.Clients, Seed: o.Seed, LongLease: runFor + 10*time.Minute,
		ShortLease: 2500 * time.Millisecond, TL: tl, EnqueueShare: sc.EnqueueShare}
	if sc.ShortLease != 0 {
		w.ShortLease = sc.ShortLease
	}
	if sc.Priorities {
		w.Priorities, w.EnqueueW, w.ClaimVia = 5, Replication, c.Nodes[0].ID
	}
	w.RetryShare, w.FailShare = cmp.Or(sc.RetryShare, retryShare), cmp.Or(sc.FailShare, failShare)
	w.RetryAttempts, w.RetryBackoff = retryAttempts, retryBackoff
	w.ReviveShare = cmp.Or(sc.ReviveShare, reviveShare)
	w.ShortOnly = sc.QueueCap > 0
	w.DeadlineShare, w.DeadlineMin, w.DeadlineMax = sc.DeadlineShare, deadlineMin, deadlineMax
	w.init()
	if sc.QueueCap > 0 {
		if err := setQueueCap(ctx, c, sc.QueueCap); err != nil {
			return nil, err
		}
		tl.Log("note", "queue-capped", fmt.Sprint(sc.QueueCap), nil)
	}
	env := &Env{C: c, Net: nt, TL: tl, Rng: rand.New(&lockedSource{src: rand.NewPCG(o.Seed, 0x6e656d)}), W: w, Hooks: hooks,
		Churn: &Churn{}, Rogue: &Rogue{}}
	minEnd := time.Now().Add(o.Time)
	runCtx, cancel := context.WithTimeout(ctx, runFor)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The liveness checker wants minOKBeforeFault successful ops
		// before the first fault: a slow workload (waiting claims) gets
		// them before the nemesis starts.
		if h.WaitOK(runCtx, minOKBeforeFault) {
			sc.Nemesis(runCtx, env)
		}
		if sc.UntilNemesis > 0 {
			if runCtx.Err() != nil {
				env.Churn.Fail("the nemesis was cut short: the run reached its %s bound", runFor)
			}
			sleep(runCtx, time.Until(minEnd))
			cancel() // the sequence is done: so is the workload
		}
	}()
	w.Run(runCtx)
	wg.Wait()
	env.HealAll()
	heal := h.Now()
	tl.Log("note", "healed", "", nil)
	if err := c.WaitReady(30 * time.Second); err != nil {
		tl.Log("note", "not-ready-after-heal", "", err)
	}
	// A sentinel task, so that a claim after the heal has something to get.
	for i := 0; i < 20; i++ {
		active := c.Active()
		if o := w.enqueue(ctx, active[i%len(active)], h.NewProcess(), -1); true {
			h.Add(o)
			if o.Type == "ok" {
				break
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Liveness: a claim within 10 s of the heal. Then convergence,
	// counted from the heal, before the drain's writes; then the drain.
	firstClaim, _ := w.FirstClaim(ctx, max(time.Duration(heal+10*int64(time.Second)-h.Now()), time.Second))
	conv := CheckConvergence(ctx, c, h, heal, 30*time.Second)
	tl.Log("note", "checked-convergence", "", nil)
	var rogue *check.Verdict
	if sc.Rogue {
		v := CheckRogue(ctx, c, env.Rogue)
		rogue = &v
		tl.Log("note", "checked-rogue", "", nil)
	}
	var placement *check.Verdict
	if sc.Placement {
		v := CheckPlacement(ctx, c, env.Churn, 60*time.Second)
		placement = &v
		tl.Log("note", "checked-placement", "", nil)
	}
	w.Drain(ctx, w.ShortLease+c.Cfg.SkewBuffer+3*time.Second, 60*time.Second)
	tl.Log("note", "drained", "", nil)

	ops := h.Ops()
	res.Ops = len(ops)
	delivered := map[uint64]bool{}
	var undelivered []uint64
	for _, op := range ops {
		if op.F == "claim" && op.Type == "ok" {
			delivered[op.Task] = true
		}
	}
	for _, op := range ops {
		if op.F == "enqueue" && op.Type == "ok" && !delivered[op.Task] {
			undelivered = append(undelivered, op.Task)
		}
	}
	for id := range check.TaskDeadlines(ops) {
		if delivered[id] {
			undelivered = append(undelivered, id) // read too: has it ended?
		}
	}
	finalAt := h.Now()
	final := w.FinalRead(ctx, undelivered)
	counts := CheckCounts(ctx, c, h, 30*time.Second)
	tl.Log("note", "checked-counts", "", nil)

	res.Verdicts = []check.Verdict{
		check.Linearizable(ops, Replication, 60*time.Second, dir),
		check.Queue(ops, final),
		check.Exclusion(ops),
		check.Terminal(ops, Replication),
		check.Retries(ops, c.Cfg.SkewBuffer),
		conv,
		counts,
		check.Liveness(ops, tl.FirstFault(), heal, firstClaim, minOKBeforeFault),
	}
	if placement != nil {
		res.Verdicts = append(res.Verdicts, *placement)
	}
	if rogue != nil {
		res.Verdicts = append(res.Verdicts, *rogue)
	}
	if sc.Priorities {
		res.Verdicts = append(res.Verdicts, check.Priority(ops, prioritySettle))
	}
	if sc.DeadlineShare > 0 {
		tolerance := time.Duration(deadlineTolerance)
		if c.ClockMoved() {
			tolerance = c.Cfg.SkewBuffer
		}
		res.Verdicts = append(res.Verdicts, check.Deadlines(ops, final, finalAt, tolerance, deadlineSettle))
	}
	if sc.QueueCap > 0 {
		res.Verdicts = append(res.Verdicts, check.Cap(ops, int(sc.QueueCap), int(sc.QueueCap), faultWindows(tl.Events(), capSettle)))
	}
	res.Valid = true
	for i, v := range res.Verdicts {
		if slices.Contains(sc.ReportOnly, v.Checker) {
			res.Verdicts[i].ReportOnly = true
			continue
		}
		if !v.Valid && v.Skipped == "" {
			res.Valid = false
		}
	}
	res.OK = res.Valid == (res.Expect == "valid")
	for _, e := range tl.Events() {
		if e.Kind == "start" {
			res.Faults++
		}
	}
	if err := h.WriteJSONLines(filepath.Join(dir, "history.jsonl")); err != nil {
		return res, err
	}
	if err := tl.WriteJSONLines(filepath.Join(dir, "timeline.jsonl")); err != nil {
		return res, err
	}
	b, _ := json.MarshalIndent(res.Verdicts, "", "  ")
	os.WriteFile(filepath.Join(dir, "verdicts.json"), append(b, '\n'), 0o644)
	return res, nil
}

// PruneResults removes the oldest run directories under parent (those
// with a seed file: the runs' results) until at most keep remain, and
// their nodes' data dirs.
func PruneResults(parent string, keep int) error {
	entries, err := os.ReadDir(parent)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	type run struct {
		path string
		mod  time.Time
	}
	var runs []run
	for _, e := range entries {
		p := filepath.Join(parent, e.Name())
		st, err := os.Stat(filepath.Join(p, "seed"))
		if !e.IsDir() || err != nil {
			continue
		}
		runs = append(runs, run{p, st.ModTime()})
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].mod.After(runs[j].mod) })
	for _, r := range runs[min(keep, len(runs)):] {
		if data, err := os.Readlink(filepath.Join(r.path, "data")); err == nil && strings.Contains(filepath.Base(data), "norn-jepsen-data-") {
			os.RemoveAll(data)
		}
		if err := os.RemoveAll(r.path); err != nil {
			return err
		}
	}
	return nil
}

// Table formats results as the summary table.
func Table(rs []*Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-32s %-6s %-8s %-6s %-6s %s\n", "scenario", "seed", "outcome", "ops", "faults", "checkers")
	for _, r := range rs {
		out := "ok"
		switch {
		case r.Skipped != "":
			out = "skipped"
		case r.Err != "":
			out = "ERROR"
		case !r.OK:
			out = "FAILED"
		}
		detail := check.Summary(r.Verdicts)
		if r.Skipped != "" {
			detail = r.Skipped
		}
		if r.Err != "" {
			detail = r.Err
		}
		if r.Expect == "invalid" && r.Skipped == "" {
			detail = "(seeded bug: expected a failure) " + detail
		}
		fmt.Fprintf(&b, "%-32s %-6d %-8s %-6d %-6d %s\n", r.Scenario, r.Seed, out, r.Ops, r.Faults, detail)
	}
	return b.String()
}
