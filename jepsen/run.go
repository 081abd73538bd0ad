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
	var retained *retentionRun
	if sc.QueueRetention > 0 {
		if err := setQueueRetention(ctx, c, sc.QueueRetention); err != nil {
			return nil, err
		}
		tl.Log("note", "queue-retention", sc.QueueRetention.String(), nil)
		retained = newRetentionRun(w)
	}
	var uniques *uniqueRun
	if sc.Unique {
		uniques = newUniqueRun(w)
	}
	var fair *fairRun
	if sc.Fair {
		fair = newFairRun(w)
	}
	var scheduled *scheduleRun
	if sc.Schedule {
		scheduled = &scheduleRun{w: w}
		if err := scheduled.create(ctx); err != nil {
			return nil, err
		}
		tl.Log("note", "schedule-created", scheduleName, nil)
	}
	env := &Env{C: c, Net: nt, TL: tl, Rng: rand.New(&lockedSource{src: rand.NewPCG(o.Seed, 0x6e656d)}), W: w, Hooks: hooks,
		Churn: &Churn{}, Rogue: &Rogue{}}
	if scheduled != nil {
		env.ScheduleCreated = scheduled.created
	}
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
	waitRetained, waitUniques, waitFair := func() {}, func() {}, func() {}
	if retained != nil {
		waitRetained = retained.start(runCtx)
	}
	if uniques != nil {
		waitUniques = uniques.start(runCtx)
	}
	if fair != nil {
		waitFair = fair.start(runCtx)
	}
	w.Run(runCtx)
	wg.Wait()
	waitRetained()
	waitUniques()
	waitFair()
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
	var schedule *check.Verdict
	if scheduled != nil {
		v := scheduled.final(ctx)
		schedule = &v
		tl.Log("note", "checked-schedule", "", nil)
	}
	var unique *check.Verdict
	if uniques != nil {
		v := uniques.final(ctx, dir)
		unique = &v
		tl.Log("note", "checked-unique", "", nil)
	}
	var retention *check.Verdict
	if retained != nil {
		v := retained.final(ctx, sc.QueueRetention, dir)
		retention = &v
		tl.Log("note", "checked-retention", "", nil)
	}

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
	if retention != nil {
		res.Verdicts = append(res.Verdicts, *retention)
	}
	if unique != nil {
		res.Verdicts = append(res.Verdicts, *unique)
	}
	if fair != nil {
		res.Verdicts = append(res.Verdicts, fair.final(tl.Events(), dir))
	}
	if schedule != nil {
		res.Verdicts = append(res.Verdicts, *schedule)
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
