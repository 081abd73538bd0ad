package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/client"
)

// The placement commands: join, rebalance (and rebalance status and
// cancel), drain,
// decommission and remove. All but join share one flow, applyPlan: plan
// without applying, print, ask, apply, watch. They send every call to
// --addr only (discovery off), so that the watch reads one node's ring.

const joinHelp = `
The node is its node id or its API address (host:port). It must be running
and gossiping with the cluster (nornd started with -join). A new member
holds no replica until a rebalance: run nornctl rebalance next. Joining a
drained node again makes it a member that rebalances give replicas to.
-o json prints the JoinResponse.`

const rebalanceHelp = `
rebalance plans the placement of the partitions' replicas over the
cluster's members (draining, leaving and dead nodes get none) and moves
replicas to it:

 1. It prints the plan: the moves (PARTITION FROM TO), how many replicas
    move, and each node's role and replica count before and after.
 2. --dry-run stops there. Without --yes it asks "apply this plan? [y/N]"
    on standard error and reads a line from standard input: anything but
    y or yes exits 1 (not applied).
 3. It applies the plan. The node plans again, so if the ring changed in
    between, the applied plan differs from the one shown: it is printed.
 4. It polls Status every 500 ms and prints a line when a move's state
    changes ("p12 n1 -> n4: catching-up"), until every move is done or
    failed; a failed move exits 1. --watch=false returns at once. The moves
    go on without nornctl: Ctrl-C stops only the watch.

A placement with nothing to move prints so and exits 0.

nornctl rebalance status prints the moves of the current (or last) plan as
the node at --addr records them: state, error, and how many are done.

nornctl rebalance cancel gives up the moves not yet promoted: queued ones
fail at once, filling and catching-up ones roll back (rolling-back, then
failed: the new replica leaves the partition's Raft group and is dropped;
the cohort stays as it was). Promoted moves finish. It prints the moves
and, unless --watch=false, their changes until none is under way. A move
whose target stays down longer than nornd's -move-target-timeout (2 min by
default) rolls back by itself.

-o json prints the RebalanceResponse: the plan of --dry-run, else the
applied plan; the plan before the question, the question and the watch go
to standard error. rebalance status prints the StatusResponse (without
task counts).`

const drainHelp = `
The node is its node id or its API address (host:port). It stays a member
and keeps serving requests as a coordinator; later rebalances give it
nothing until it joins again. The plan, the question and the watch are
those of rebalance (see nornctl rebalance -h). A node that holds no replica
is still drained (its role changes) when the plan is applied.`

const decommissionHelp = `
The node is its node id or its API address (host:port). Its replicas are
moved off as by drain; once it holds nothing it is removed from the cluster
and the meta group. The plan, the question and the watch are those of
rebalance (see nornctl rebalance -h). The watch follows the ring of the node
at --addr: point --addr at another node than the one decommissioned.`

const removeHelp = `
remove is for a node that is gone for good (its disk is lost, it will not
come back): its replicas are made again from the surviving ones, then it
is removed from the cluster. --dead is required and confirms that; the
node must also be dead as gossip sees it. A live node is decommissioned
instead (nornctl decommission). The plan, the question and the watch are
those of rebalance (see nornctl rebalance -h).`

// balancedMsg is what rebalance prints when its plan moves nothing.
const balancedMsg = "the placement is balanced; nothing to move"

// maxWatchErrors is how many Status calls in a row may fail before a watch
// gives up.
const maxWatchErrors = 5

// errNotApplied is the error of a placement command whose plan was not
// confirmed.
var errNotApplied = errors.New("not applied")

// Move states (MoveStatus.state) that end a move.
const (
	moveDone   = "done"
	moveFailed = "failed"
)

// planFlags are the flags of the commands that apply a plan.
type planFlags struct {
	dryRun bool // print the plan only
	yes    bool // apply without asking
	watch  bool // after applying, print the moves' progress until they end
}

// planFlagNames are the names of planFlags' flags.
var planFlagNames = []string{"dry-run", "yes", "watch"}

// addPlanFlags adds the plan flags to fs.
func addPlanFlags(fs *flag.FlagSet) *planFlags {
	f := &planFlags{}
	fs.BoolVar(&f.dryRun, "dry-run", false, "print the plan and stop")
	fs.BoolVar(&f.yes, "yes", false, "apply the plan without asking")
	fs.BoolVar(&f.watch, "watch", true, "after applying, print each move's state changes until every move is done or failed")
	return f
}

// check reports flags that contradict each other as a usage error.
func (f *planFlags) check(cmd *command) error {
	if f.dryRun && f.yes {
		return usagef(cmd, "--dry-run and --yes: give one or the other")
	}
	return nil
}

// planCall calls one placement RPC; with apply false the node only plans.
// It returns the response message and its plan.
type planCall func(ctx context.Context, admin nornv1connect.AdminServiceClient, apply bool) (proto.Message, *nornv1.Plan, error)

// planOf unpacks the answer of a placement RPC for a planCall.
func planOf[M any, PM interface {
	*M
	proto.Message
	GetPlan() *nornv1.Plan
}](resp *connect.Response[M], err error) (proto.Message, *nornv1.Plan, error) {
	if err != nil {
		return nil, nil, err
	}
	return PM(resp.Msg), PM(resp.Msg).GetPlan(), nil
}

func runJoin(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	pos, err := e.parse(cmd, fs, args, 1, 1)
	if err != nil {
		return err
	}
	node, err := parseNode(pos[0])
	if err != nil {
		return usagef(cmd, "%v", err)
	}
	admin, err := e.admin()
	if err != nil {
		return err
	}
	ctx, cancel := e.callContext()
	defer cancel()
	resp, err := admin.Join(ctx, connect.NewRequest(&nornv1.JoinRequest{Node: node}))
	if err != nil {
		return err
	}
	r := resp.Msg
	return e.emit(r, func(w io.Writer) {
		fmt.Fprintf(w, "joined %s at ring epoch %d; meta voter: %s\n", r.GetNodeId(), r.GetRingEpoch(), yesNo(r.GetMetaVoter()))
		fmt.Fprintf(w, "run `nornctl rebalance` to move partitions to it\n")
	})
}

func runRebalance(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	f := addPlanFlags(fs)
	pos, err := e.parse(cmd, fs, args, 0, 1)
	if err != nil {
		return err
	}
	if len(pos) == 1 {
		if pos[0] != "status" && pos[0] != "cancel" {
			return usagef(cmd, "unexpected argument %q: rebalance takes none, status or cancel", pos[0])
		}
		var set []string
		fs.Visit(func(fl *flag.Flag) {
			for _, n := range planFlagNames {
				if fl.Name == n {
					set = append(set, "--"+n)
				}
			}
		})
		if pos[0] == "cancel" {
			if f.dryRun {
				return usagef(cmd, "rebalance cancel takes no --dry-run")
			}
			return e.rebalanceCancel(f.watch)
		}
		if len(set) > 0 {
			return usagef(cmd, "rebalance status takes no %s", strings.Join(set, ", "))
		}
		return e.rebalanceStatus()
	}
	if err := f.check(cmd); err != nil {
		return err
	}
	return e.applyPlan(f, "", func(ctx context.Context, admin nornv1connect.AdminServiceClient, apply bool) (proto.Message, *nornv1.Plan, error) {
		return planOf(admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Apply: apply})))
	})
}

func runDrain(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	node, f, err := e.parseNodePlan(cmd, fs, args)
	if err != nil {
		return err
	}
	return e.applyPlan(f, node, func(ctx context.Context, admin nornv1connect.AdminServiceClient, apply bool) (proto.Message, *nornv1.Plan, error) {
		return planOf(admin.Drain(ctx, connect.NewRequest(&nornv1.DrainRequest{Node: node, Apply: apply})))
	})
}

func runDecommission(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	node, f, err := e.parseNodePlan(cmd, fs, args)
	if err != nil {
		return err
	}
	return e.applyPlan(f, node, func(ctx context.Context, admin nornv1connect.AdminServiceClient, apply bool) (proto.Message, *nornv1.Plan, error) {
		return planOf(admin.Decommission(ctx, connect.NewRequest(&nornv1.DecommissionRequest{Node: node, Apply: apply})))
	})
}

func runRemove(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	dead := fs.Bool("dead", false, "confirm that the node is gone for good: its replicas are not read again (required)")
	node, f, err := e.parseNodePlan(cmd, fs, args)
	if err != nil {
		return err
	}
	if !*dead {
		return usagef(cmd, "remove is only for a node gone for good, which --dead confirms; "+
			"a live node is decommissioned instead: nornctl decommission %s", node)
	}
	return e.applyPlan(f, node, func(ctx context.Context, admin nornv1connect.AdminServiceClient, apply bool) (proto.Message, *nornv1.Plan, error) {
		return planOf(admin.Remove(ctx, connect.NewRequest(&nornv1.RemoveRequest{Node: node, Dead: true, Apply: apply})))
	})
}

// parseNodePlan parses the arguments of drain, decommission and remove:
// the flags fs holds, the plan flags and one node.
func (e *env) parseNodePlan(cmd *command, fs *flag.FlagSet, args []string) (string, *planFlags, error) {
	f := addPlanFlags(fs)
	pos, err := e.parse(cmd, fs, args, 1, 1)
	if err != nil {
		return "", nil, err
	}
	node, err := parseNode(pos[0])
	if err != nil {
		return "", nil, usagef(cmd, "%v", err)
	}
	if err := f.check(cmd); err != nil {
		return "", nil, err
	}
	return node, f, nil
}

// admin returns the AdminService client of the node at --addr alone: the
// placement commands turn discovery off so that every call, the watch's
// included, goes to that node.
func (e *env) admin() (nornv1connect.AdminServiceClient, error) {
	c, err := e.client(client.WithDiscovery(0))
	if err != nil {
		return nil, err
	}
	return c.AdminService(), nil
}

// callContext returns the context of one call of the raw admin client,
// which the client library gives no timeout: --timeout's.
func (e *env) callContext() (context.Context, context.CancelFunc) {
	if e.g.timeout > 0 {
		return context.WithTimeout(e.ctx, e.g.timeout)
	}
	return context.WithCancel(e.ctx)
}

// applyPlan runs a placement command once its arguments are parsed: it
// asks the node for the plan, prints it, asks whether to apply it (unless
// --yes), applies it and watches its moves (unless --watch=false). node
// is the node the command is about, "" for rebalance: only rebalance ends
// when its plan moves nothing, as the others still change the node's
// role when applied.
func (e *env) applyPlan(f *planFlags, node string, call planCall) error {
	admin, err := e.admin()
	if err != nil {
		return err
	}
	resp, plan, err := e.callPlan(admin, call, false)
	if err != nil {
		return err
	}
	if node == "" && len(plan.GetMoves()) == 0 {
		return e.emit(resp, func(w io.Writer) { fmt.Fprintln(w, balancedMsg) })
	}
	if f.dryRun {
		return e.emit(resp, func(w io.Writer) { writePlan(w, plan) })
	}
	var shown *nornv1.Plan // the plan the question was about
	if !f.yes {
		tw := newTabWriter(e.progressOut())
		writePlan(tw, plan)
		fmt.Fprintln(tw)
		if err := tw.Flush(); err != nil {
			return err
		}
		ok, err := e.confirm("apply this plan? [y/N] ")
		if err != nil {
			return err
		}
		if !ok {
			return errNotApplied
		}
		shown = plan
	}
	resp, plan, err = e.callPlan(admin, call, true)
	if err != nil {
		switch connect.CodeOf(err) {
		case connect.CodeDeadlineExceeded, connect.CodeUnavailable, connect.CodeCanceled, connect.CodeUnknown, connect.CodeInternal:
			return fmt.Errorf("%w (the plan may have been applied: see `nornctl rebalance status`)", err)
		}
		return err
	}
	if !plan.GetApplied() {
		return fmt.Errorf("the node answered apply with a plan it did not apply (ring epoch %d)", plan.GetRingEpoch())
	}
	if err := e.emit(resp, func(w io.Writer) { writeApplied(w, plan, shown) }); err != nil {
		return err
	}
	if !f.watch || len(plan.GetMoves()) == 0 {
		return nil
	}
	return e.watch(admin, plan)
}

// callPlan calls a placement RPC within --timeout; a response without a
// plan is an error.
func (e *env) callPlan(admin nornv1connect.AdminServiceClient, call planCall, apply bool) (proto.Message, *nornv1.Plan, error) {
	ctx, cancel := e.callContext()
	defer cancel()
	resp, plan, err := call(ctx, admin, apply)
	if err == nil && plan == nil {
		err = errors.New("the node answered without a plan")
	}
	return resp, plan, err
}

// progressOut is where a placement command prints what is not its result
// (the plan it asks about, the watch): stdout for tables, stderr with -o
// json, whose stdout holds one document.
func (e *env) progressOut() io.Writer {
	if e.json() {
		return e.stderr
	}
	return e.stdout
}

// confirm asks question on stderr and reads a line from stdin: true when
// it is y or yes (in any case). No answer (end of input), or e.ctx ending
// first, is errNotApplied.
func (e *env) confirm(question string) (bool, error) {
	fmt.Fprint(e.stderr, question)
	type answer struct {
		line string
		err  error
	}
	// A read of stdin cannot be cancelled: on Ctrl-C the reader is left
	// behind, and the process exits.
	ch := make(chan answer, 1)
	go func() {
		line, err := bufio.NewReader(e.stdin).ReadString('\n')
		ch <- answer{line, err}
	}()
	var a answer
	select {
	case <-e.ctx.Done():
		fmt.Fprintln(e.stderr)
		return false, fmt.Errorf("%w: interrupted", errNotApplied)
	case a = <-ch:
	}
	if a.err != nil && !errors.Is(a.err, io.EOF) {
		return false, fmt.Errorf("reading the answer: %w", a.err)
	}
	if a.err != nil && a.line == "" {
		fmt.Fprintln(e.stderr)
		return false, fmt.Errorf("%w: no answer on standard input (--yes applies without asking)", errNotApplied)
	}
	switch strings.ToLower(strings.TrimSpace(a.line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}

// rebalanceStatus serves `nornctl rebalance status`.
func (e *env) rebalanceStatus() error {
	admin, err := e.admin()
	if err != nil {
		return err
	}
	st, err := e.moveStatus(admin)
	if err != nil {
		return err
	}
	return e.emit(st, func(w io.Writer) { writeMoves(w, st.GetMoves()) })
}

// rebalanceCancel serves `nornctl rebalance cancel`: it cancels the
// moves not yet promoted and, with watch, prints the moves' changes until
// none is under way (the rolled back ones end failed, the promoted ones
// done).
func (e *env) rebalanceCancel(watch bool) error {
	admin, err := e.admin()
	if err != nil {
		return err
	}
	ctx, cancel := e.callContext()
	resp, err := admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{Cancel: true}))
	cancel()
	if err != nil {
		return err
	}
	moves := resp.Msg.GetPlan().GetMoves()
	if err := e.emit(resp.Msg, func(w io.Writer) { writeMoves(w, moves) }); err != nil || !watch {
		return err
	}
	out := e.progressOut()
	last := map[moveKey]string{}
	for _, m := range moves {
		last[keyOf(m)] = m.GetState() + m.GetError()
	}
	failures := 0
	for underway(moves) {
		if err := sleep(e.ctx, e.poll); err != nil {
			return stoppedWatching(err)
		}
		st, err := e.moveStatus(admin)
		if err != nil {
			if failures++; failures >= maxWatchErrors || e.ctx.Err() != nil {
				return fmt.Errorf("watching the moves: %w (see `nornctl rebalance status`)", err)
			}
			continue
		}
		failures = 0
		moves = st.GetMoves()
		for _, m := range moves {
			if k := keyOf(m); last[k] != m.GetState()+m.GetError() {
				last[k] = m.GetState() + m.GetError()
				fmt.Fprintln(out, formatMove(m))
			}
		}
	}
	fmt.Fprintf(out, "no move under way: %s\n", moveSummary(moves))
	return nil
}

// underway reports whether a move is neither queued nor ended.
func underway(moves []*nornv1.MoveStatus) bool {
	for _, m := range moves {
		if s := m.GetState(); s != moveDone && s != moveFailed && s != "queued" {
			return true
		}
	}
	return false
}

// moveStatus calls Status without task counts (which read every task),
// within --timeout.
func (e *env) moveStatus(admin nornv1connect.AdminServiceClient) (*nornv1.StatusResponse, error) {
	ctx, cancel := e.callContext()
	defer cancel()
	resp, err := admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{SkipCounts: true}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// moveKey identifies a move of a plan among Status's moves.
type moveKey struct {
	partition uint32
	from, to  string
}

func keyOf(m *nornv1.MoveStatus) moveKey {
	return moveKey{m.GetPartition(), m.GetFromNode(), m.GetToNode()}
}

// watch polls Status every e.poll and prints on progressOut a line for
// every change of a move of plan (its state or its error), until every
// move has ended: done or failed. It returns an error when a move failed,
// when Status failed maxWatchErrors times in a row, when e.ctx ends, or
// when the node's ring, at the plan's epoch or later, lacks a move of the
// plan (a later plan replaced it). The moves go on whatever it returns.
func (e *env) watch(admin nornv1connect.AdminServiceClient, plan *nornv1.Plan) error {
	out := e.progressOut()
	moves := plan.GetMoves()
	last := make(map[moveKey]*nornv1.MoveStatus, len(moves))
	for _, m := range moves {
		last[keyOf(m)] = m
	}
	fmt.Fprintf(out, "watching %s (Ctrl-C stops watching, not the moves)\n", plural(len(moves), "move"))
	failures := 0
	for {
		if err := sleep(e.ctx, e.poll); err != nil {
			return stoppedWatching(err)
		}
		st, err := e.moveStatus(admin)
		if err != nil {
			if e.ctx.Err() != nil {
				return stoppedWatching(e.ctx.Err())
			}
			if failures++; failures >= maxWatchErrors {
				return fmt.Errorf("watching the moves: %w (they go on: see `nornctl rebalance status`)", err)
			}
			fmt.Fprintf(e.stderr, "nornctl: status: %s (retrying)\n", errorMessage(err))
			continue
		}
		failures = 0
		now := make(map[moveKey]*nornv1.MoveStatus, len(st.GetMoves()))
		for _, m := range st.GetMoves() {
			now[keyOf(m)] = m
		}
		ended, failed, missing := 0, 0, 0
		for _, m := range moves {
			k := keyOf(m)
			cur, ok := now[k]
			if !ok {
				missing++
				continue
			}
			if prev := last[k]; cur.GetState() != prev.GetState() || cur.GetError() != prev.GetError() {
				fmt.Fprintln(out, formatMove(cur))
				last[k] = cur
			}
			switch cur.GetState() {
			case moveDone:
				ended++
			case moveFailed:
				ended++
				failed++
			}
		}
		switch {
		case missing > 0 && st.GetRingEpoch() >= plan.GetRingEpoch():
			return fmt.Errorf("the ring of node %s (epoch %d) lacks %d of the plan's %s: a later plan replaced it; see `nornctl rebalance status`",
				st.GetNodeId(), st.GetRingEpoch(), missing, plural(len(moves), "move"))
		case ended < len(moves):
			continue
		case failed > 0:
			return fmt.Errorf("%d of %s failed (see `nornctl rebalance status`)", failed, plural(len(moves), "move"))
		}
		fmt.Fprintf(out, "%d of %s done\n", len(moves), plural(len(moves), "move"))
		return nil
	}
}

func stoppedWatching(err error) error {
	return fmt.Errorf("stopped watching: %w; the moves go on (see `nornctl rebalance status`)", err)
}

// sleep waits d (none when d <= 0) or until ctx is done, and returns
// ctx's error.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return ctx.Err()
}
