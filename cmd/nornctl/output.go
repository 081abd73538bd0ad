package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// Prefixes of the enum value names, left out in tables.
const (
	statusPrefix   = "TASK_STATUS_"
	claimEndPrefix = "CLAIM_END_"
)

// statusOrder is the order of statuses in count and status tables.
var statusOrder = []string{"READY", "DELAYED", "CLAIMED", "COMPLETED", "ABORTED", "CANCELLED", "DEAD"}

// jsonOptions renders -o json: proto3 JSON names, unset fields left out.
var jsonOptions = protojson.MarshalOptions{EmitUnpopulated: false}

// emit prints m as one protojson document and a newline with -o json, else
// calls table with a tabwriter (columns separated by tabs) on stdout.
func (e *env) emit(m proto.Message, table func(w io.Writer)) error {
	if e.json() {
		b, err := jsonOptions.Marshal(m)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(e.stdout, "%s\n", b)
		return err
	}
	tw := newTabWriter(e.stdout)
	table(tw)
	return tw.Flush()
}

func newTabWriter(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// writeTask prints one task: its fields, then its claims, updates and
// errors as tables.
func writeTask(w io.Writer, t *nornv1.Task) {
	s := t.GetSpec()
	fmt.Fprintf(w, "ID:\t%d\n", t.GetId())
	fmt.Fprintf(w, "QUEUE:\t%s\n", s.GetQueue())
	if t.GetClaimStateUnknown() {
		// No partition leader answered: the claim state may be behind.
		fmt.Fprintf(w, "STATUS:\t%s? (claim state unknown: no leader of its partition answered; read again)\n", statusName(t.GetStatus()))
	} else {
		fmt.Fprintf(w, "STATUS:\t%s\n", statusName(t.GetStatus()))
	}
	fmt.Fprintf(w, "PRIORITY:\t%d\n", s.GetPriority())
	fmt.Fprintf(w, "PROGRESS:\t%s\n", formatProgress(t.GetProgress()))
	fmt.Fprintf(w, "PAYLOAD:\t%s\n", formatBytes(s.GetPayload()))
	if s.GetNotBefore() != nil {
		fmt.Fprintf(w, "NOT BEFORE:\t%s\n", formatTS(s.GetNotBefore()))
	}
	if s.GetDeadline() != nil {
		fmt.Fprintf(w, "DEADLINE:\t%s\n", formatTS(s.GetDeadline()))
	}
	if s.GetUniqueKey() != "" {
		held := "until finished"
		if d := s.GetUniqueFor(); d != nil {
			held = "until finished, and " + d.AsDuration().String() + " after its enqueue"
		}
		fmt.Fprintf(w, "UNIQUE KEY:\t%q (held %s)\n", s.GetUniqueKey(), held)
	}
	if s.GetFairnessKey() != "" {
		fmt.Fprintf(w, "FAIRNESS KEY:\t%q (weight %d)\n", s.GetFairnessKey(), max(s.GetFairnessWeight(), 1))
	}
	if len(s.GetDependsOn()) > 0 {
		fmt.Fprintf(w, "DEPENDS ON:\t%s\n", joinIDs(s.GetDependsOn()))
	}
	if s.GetMaxClaims() > 0 {
		fmt.Fprintf(w, "MAX CLAIMS:\t%d\n", s.GetMaxClaims())
	}
	if r := s.GetRetry(); r != nil {
		fmt.Fprintf(w, "RETRY:\t%s\n", formatRetry(r))
	}
	if t.GetFailedAttempts() > 0 {
		fmt.Fprintf(w, "FAILED ATTEMPTS:\t%d\n", t.GetFailedAttempts())
	}
	if t.GetLife() > 0 {
		fmt.Fprintf(w, "LIFE:\t%d (retried %d times)\n", t.GetLife(), t.GetLife())
	}
	if t.GetRetryAt() != nil {
		fmt.Fprintf(w, "RETRY AT:\t%s\n", formatTS(t.GetRetryAt()))
	}
	fmt.Fprintf(w, "CREATED:\t%s\n", formatTS(t.GetCreatedAt()))
	fmt.Fprintf(w, "UPDATED:\t%s\n", formatTS(t.GetUpdatedAt()))
	if cc := t.GetCurrentClaim(); cc != nil {
		fmt.Fprintf(w, "CLAIM:\t%d by %s, expires %s\n", cc.GetClaimId(), oneLine(cc.GetWorker()), formatTS(cc.GetExpiry()))
	}
	if t.GetResult() != nil {
		fmt.Fprintf(w, "RESULT:\t%s\n", formatBytes(t.GetResult()))
	}
	if len(t.GetClaims()) > 0 {
		fmt.Fprintf(w, "\nCLAIMS\n")
		fmt.Fprintf(w, "CLAIM ID\tSEQ\tWORKER\tSTART\tEXPIRY\tEND\tENDED AT\n")
		for _, c := range t.GetClaims() {
			end := "-"
			if c.GetEndReason() != nornv1.ClaimEnd_CLAIM_END_UNSPECIFIED {
				end = strings.TrimPrefix(c.GetEndReason().String(), claimEndPrefix)
			}
			fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\t%s\n", c.GetClaimId(), c.GetSeq(), dash(oneLine(c.GetWorker())),
				formatTS(c.GetStart()), formatTS(c.GetExpiry()), end, formatTS(c.GetEndedAt()))
		}
	}
	if len(t.GetUpdates()) > 0 {
		fmt.Fprintf(w, "\nUPDATES\n")
		fmt.Fprintf(w, "CLAIM ID\tSEQ\tAT\tPROGRESS\tMESSAGE\tDATA\n")
		for _, u := range t.GetUpdates() {
			fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\n", u.GetClaimId(), u.GetSeq(), formatTS(u.GetAt()),
				formatProgress(u.GetProgress()), dash(oneLine(u.GetMessage())), formatBytes(u.GetData()))
		}
	}
	if len(t.GetErrors()) > 0 {
		fmt.Fprintf(w, "\nERRORS\n")
		fmt.Fprintf(w, "ATTEMPT\tCODE\tDESCRIPTION\tARGS\n")
		for _, e := range t.GetErrors() {
			attempt := "-"
			if e.GetAttempt() > 0 {
				attempt = strconv.FormatUint(uint64(e.GetAttempt()), 10)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", attempt, e.GetCode(), dash(oneLine(e.GetDescription())), dash(strings.Join(e.GetArgs(), ", ")))
		}
	}
}

// formatRetry is a retry policy on one line: "5 attempts, 1s x2 up to
// 1h0m0s, jitter 0.2".
func formatRetry(r *nornv1.RetryPolicy) string {
	attempts := "unlimited attempts"
	if r.GetMaxAttempts() > 0 {
		attempts = fmt.Sprintf("%d attempts", r.GetMaxAttempts())
	}
	if r.GetInitialBackoff() == nil {
		return attempts + ", no wait"
	}
	s := fmt.Sprintf("%s, %s", attempts, r.GetInitialBackoff().AsDuration())
	if m := r.GetMultiplier(); m > 1 {
		s += fmt.Sprintf(" x%g up to %s", m, r.GetMaxBackoff().AsDuration())
	}
	if j := r.GetJitter(); j > 0 {
		s += fmt.Sprintf(", jitter %g", j)
	}
	return s
}

// writeTaskList prints one row per task.
func writeTaskList(w io.Writer, tasks []*nornv1.Task) {
	fmt.Fprintf(w, "ID\tQUEUE\tSTATUS\tPRIORITY\tPROGRESS\tCLAIMS\tCREATED\tPAYLOAD\tLAST ERROR\n")
	for _, t := range tasks {
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\n", t.GetId(), t.GetSpec().GetQueue(), statusName(t.GetStatus()),
			t.GetSpec().GetPriority(), formatProgress(t.GetProgress()), len(t.GetClaims()), formatTS(t.GetCreatedAt()),
			formatBytes(t.GetSpec().GetPayload()), lastError(t))
	}
}

// lastError is a task's last error, its code and description cut short
// ("-" for none): what a list of dead tasks is read for.
func lastError(t *nornv1.Task) string {
	errs := t.GetErrors()
	if len(errs) == 0 {
		return "-"
	}
	e := errs[len(errs)-1]
	s := e.GetCode()
	if d := e.GetDescription(); d != "" {
		s += ": " + d
	}
	if r := []rune(s); len(r) > 60 {
		s = string(r[:57]) + "..."
	}
	return strings.Join(strings.Fields(s), " ")
}

// writeCounts prints the count of every status, then the total.
func writeCounts(w io.Writer, r *nornv1.CountTasksResponse) {
	fmt.Fprintf(w, "STATUS\tCOUNT\n")
	for _, s := range sortedStatuses(r.GetByStatus()) {
		fmt.Fprintf(w, "%s\t%d\n", s, r.GetByStatus()[s])
	}
	fmt.Fprintf(w, "TOTAL\t%d\n", r.GetTotal())
}

// sortedStatuses returns the keys of a by-status map: the known statuses
// in statusOrder (every one, even when missing), then any others sorted.
func sortedStatuses(m map[string]uint64) []string {
	out := slices.Clone(statusOrder)
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(statusOrder, k) {
			out = append(out, k)
		}
	}
	return out
}

// writeClaimed prints one row per claimed task.
func writeClaimed(w io.Writer, tasks []*nornv1.ClaimedTask) {
	fmt.Fprintf(w, "ID\tCLAIM ID\tEXPIRY\tQUEUE\tPRIORITY\tPAYLOAD\n")
	for _, ct := range tasks {
		t := ct.GetTask()
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%d\t%s\n", t.GetId(), ct.GetClaimId(), formatTS(ct.GetExpiry()),
			t.GetSpec().GetQueue(), t.GetSpec().GetPriority(), formatBytes(t.GetSpec().GetPayload()))
	}
}

// writeStatus prints the node, the cluster's nodes, one row per
// partition, and a rebalance's progress while it has moves not done.
func writeStatus(w io.Writer, st *nornv1.StatusResponse) {
	fmt.Fprintf(w, "NODE:\t%s\n", st.GetNodeId())
	fmt.Fprintf(w, "VERSION:\t%s\n", formatBuild(st.GetVersion(), st.GetBuild()))
	fmt.Fprintf(w, "UPTIME:\t%s\n", st.GetUptime().AsDuration().Round(time.Second))
	fmt.Fprintf(w, "SECURITY:\t%s\n", securityLine(st.GetSecurity()))
	fmt.Fprintf(w, "RING EPOCH:\t%d\n", st.GetRingEpoch())
	fmt.Fprintf(w, "PARTITIONS:\t%d\n", len(st.GetPartitions()))
	health := "healthy"
	if !st.GetHealthy() {
		health = "UNHEALTHY: " + strings.Join(st.GetProblems(), "; ")
	}
	fmt.Fprintf(w, "HEALTH:\t%s\n", health)
	if len(st.GetNodes()) > 0 {
		fmt.Fprintf(w, "\nNODE\tADDRESS\tSTATE\tROLE\tREPLICAS\tLEADS\tFAIR SHARE\tCLOCK OFFSET\tFROM MEDIAN\tACCESS\n")
		for _, n := range st.GetNodes() {
			dur := func(d *durationpb.Duration) string {
				if d == nil {
					return "-"
				}
				return d.AsDuration().Round(100 * time.Microsecond).String()
			}
			replicas, leads, share := "-", "-", "-" // a node that reports no role predates placement
			if n.GetRole() != "" {
				replicas = strconv.FormatUint(uint64(n.GetReplicas()), 10)
				leads = strconv.FormatUint(uint64(n.GetLeaders()), 10)
				share = strconv.FormatFloat(n.GetLeaderShare(), 'f', 1, 64)
			}
			if n.GetState() != "alive" {
				// What it last gossiped: it leads nothing it can be
				// reached for, and its counts are stale.
				leads, share = "-", "-"
			}
			sec := n.GetSecurity()
			if n.GetId() == st.GetNodeId() {
				sec = st.GetSecurity()
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.GetId(), n.GetApiAddress(), n.GetState(), dash(n.GetRole()), replicas,
				leads, share, dur(n.GetClockOffset()), dur(n.GetMedianOffset()), accessCell(sec))
		}
		if differ := securityDiffers(st); differ != "" {
			fmt.Fprintf(w, "\nWARNING: the nodes' security settings differ (%s): a node restarted without the others' -auth-file or TLS lets in what they refuse\n", differ)
		}
	}
	keys := map[string]uint64{}
	for _, p := range st.GetPartitions() {
		for k, v := range p.GetCounts() {
			keys[k] += v
		}
	}
	statuses := sortedStatuses(keys)
	fmt.Fprintf(w, "\nPARTITION\tCOHORT\tLEADER\tTERM\tINDEX\tSTATE\tREPLICAS\t%s\n", strings.Join(statuses, "\t"))
	for _, p := range st.GetPartitions() {
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%d\t%s\t%s", p.GetId(), dash(strings.Join(p.GetCohort(), ",")), dash(p.GetLeader()),
			p.GetRaftTerm(), p.GetRaftIndex(), dash(p.GetRaftState()), replicaRoots(p))
		for _, s := range statuses {
			fmt.Fprintf(w, "\t%d", p.GetCounts()[s])
		}
		fmt.Fprintln(w)
	}
	if len(st.GetPartitions()) > 0 && len(keys) > 0 {
		// The cluster's totals, each partition counted once (from the
		// answering node's replica): of every partition when it holds
		// them all.
		label := "TOTAL"
		if n := int(st.GetPartitionCount()); n > len(st.GetPartitions()) {
			label = fmt.Sprintf("TOTAL (%d of %d partitions)", len(st.GetPartitions()), n)
		}
		fmt.Fprintf(w, "%s\t\t\t\t\t\t", label)
		for _, s := range statuses {
			fmt.Fprintf(w, "\t%d", keys[s])
		}
		fmt.Fprintln(w)
	}
	if ms := st.GetMoves(); !allDone(ms) {
		fmt.Fprintf(w, "\nrebalance: %s (see `nornctl rebalance status`)\n", moveSummary(ms))
	}
}

// writePlan prints a placement plan: its moves and how many replicas they
// are, then each node's role and replica count before and after.
func writePlan(w io.Writer, p *nornv1.Plan) {
	if len(p.GetMoves()) == 0 {
		fmt.Fprintf(w, "no replica moves\n")
	} else {
		fmt.Fprintf(w, "PARTITION\tFROM\tTO\n")
		for _, m := range p.GetMoves() {
			fmt.Fprintf(w, "%d\t%s\t%s\n", m.GetPartition(), m.GetFromNode(), m.GetToNode())
		}
		var total uint64
		for _, l := range p.GetLoads() {
			total += uint64(l.GetBefore())
		}
		if total > 0 {
			fmt.Fprintf(w, "\nmoving %d of %d replicas\n", len(p.GetMoves()), total)
		} else {
			fmt.Fprintf(w, "\nmoving %s\n", plural(len(p.GetMoves()), "replica"))
		}
	}
	if len(p.GetLoads()) > 0 {
		fmt.Fprintf(w, "\nNODE\tROLE\tBEFORE\tAFTER\n")
		for _, l := range p.GetLoads() {
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\n", l.GetNodeId(), dash(l.GetRole()), l.GetBefore(), l.GetAfter())
		}
	}
}

// writeApplied prints an applied plan: in full unless it has the same
// moves as shown, the plan printed before the question (nil: none was).
func writeApplied(w io.Writer, applied, shown *nornv1.Plan) {
	switch {
	case shown == nil:
		writePlan(w, applied)
		fmt.Fprintln(w)
	case !sameMoves(applied, shown):
		fmt.Fprintf(w, "the ring changed since the plan above was made; the node applied this plan:\n\n")
		writePlan(w, applied)
		fmt.Fprintln(w)
	}
	n := len(applied.GetMoves())
	if n == 0 {
		fmt.Fprintf(w, "applied at ring epoch %d; nothing to move\n", applied.GetRingEpoch())
		return
	}
	fmt.Fprintf(w, "queued %s at ring epoch %d\n", plural(n, "move"), applied.GetRingEpoch())
}

// sameMoves reports whether plans a and b move the same replicas.
func sameMoves(a, b *nornv1.Plan) bool {
	return slices.EqualFunc(a.GetMoves(), b.GetMoves(), func(x, y *nornv1.MoveStatus) bool { return keyOf(x) == keyOf(y) })
}

// writeMoves prints the moves of a rebalance with their states, then how
// many are done.
func writeMoves(w io.Writer, moves []*nornv1.MoveStatus) {
	if len(moves) == 0 {
		fmt.Fprintf(w, "no rebalance under way\n")
		return
	}
	fmt.Fprintf(w, "PARTITION\tFROM\tTO\tSTATE\tERROR\n")
	for _, m := range moves {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", m.GetPartition(), m.GetFromNode(), m.GetToNode(), dash(m.GetState()), dash(oneLine(m.GetError())))
	}
	fmt.Fprintf(w, "\n%s\n", moveSummary(moves))
}

// moveSummary counts moves: "3 of 10 moves done", and ", 1 failed" when
// some failed.
func moveSummary(moves []*nornv1.MoveStatus) string {
	done, failed := 0, 0
	for _, m := range moves {
		switch m.GetState() {
		case moveDone:
			done++
		case moveFailed:
			failed++
		}
	}
	s := fmt.Sprintf("%d of %s done", done, plural(len(moves), "move"))
	if failed > 0 {
		s += fmt.Sprintf(", %d failed", failed)
	}
	return s
}

// allDone reports whether every move is done (true for none).
func allDone(moves []*nornv1.MoveStatus) bool {
	for _, m := range moves {
		if m.GetState() != moveDone {
			return false
		}
	}
	return true
}

// formatMove is one line of a watch: "p12 n1 -> n4: catching-up", and the
// move's error in parentheses when it has one.
func formatMove(m *nornv1.MoveStatus) string {
	s := fmt.Sprintf("p%d %s -> %s: %s", m.GetPartition(), m.GetFromNode(), m.GetToNode(), dash(m.GetState()))
	if m.GetError() != "" {
		s += " (" + oneLine(m.GetError()) + ")"
	}
	return s
}

// plural is n and noun, with an s unless n is 1: "1 move", "2 moves".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// replicaRoots summarizes a partition's replica tree roots: "agree" and
// the root when every replica has the same, else each replica's root (or
// "?" when it did not answer).
func replicaRoots(p *nornv1.PartitionStatus) string {
	rs := p.GetReplicaRoots()
	if len(rs) == 0 {
		return "-"
	}
	short := func(r uint64) string { return fmt.Sprintf("%016x", r)[:8] }
	if p.GetReplicasAgree() {
		return "agree " + short(rs[0].GetRoot())
	}
	// The replicas that answered agree, and the others could not be
	// asked: say so rather than DIFFER.
	var known []uint64
	var unknown []string
	for _, r := range rs {
		if r.GetError() != "" {
			unknown = append(unknown, r.GetNodeId())
		} else {
			known = append(known, r.GetRoot())
		}
	}
	if len(known) > 0 && len(unknown) > 0 && !slices.ContainsFunc(known, func(r uint64) bool { return r != known[0] }) {
		return "agree " + short(known[0]) + " (" + strings.Join(unknown, ",") + " unknown)"
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		v := short(r.GetRoot())
		if r.GetError() != "" {
			v = "?"
		}
		parts[i] = r.GetNodeId() + ":" + v
	}
	return "DIFFER " + strings.Join(parts, ",")
}

// statusName is a TaskStatus without its prefix ("READY").
func statusName(s nornv1.TaskStatus) string { return strings.TrimPrefix(s.String(), statusPrefix) }

// formatTS formats a protobuf timestamp for a table; "-" when unset.
func formatTS(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return formatTime(ts.AsTime())
}

// formatTime formats t in the local zone, to the millisecond.
func formatTime(t time.Time) string { return t.Local().Format("2006-01-02T15:04:05.000Z07:00") }

func formatProgress(p float64) string { return strconv.FormatFloat(p*100, 'f', -1, 64) + "%" }

// maxShownBytes is the longest payload or result shown as text in a table.
const maxShownBytes = 60

// formatBytes shows a payload in a table cell: quoted when it is short,
// printable UTF-8 text; otherwise its size ("-" when empty).
func formatBytes(b []byte) string {
	if len(b) == 0 {
		return "-"
	}
	if len(b) <= maxShownBytes && utf8.Valid(b) && isPrintable(string(b)) {
		return strconv.Quote(string(b))
	}
	return fmt.Sprintf("<%d bytes>", len(b))
}

func isPrintable(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// oneLine replaces line breaks and tabs, which would break a table row.
func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ", "\t", " ").Replace(s)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func joinIDs(ids []uint64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(parts, ",")
}

// securityLine sums up a node's SecurityStatus.
func securityLine(s *nornv1.SecurityStatus) string {
	var parts []string
	if s.GetTls() {
		parts = append(parts, "TLS")
	} else {
		parts = append(parts, "cleartext")
	}
	if s.GetGossipEncrypted() {
		parts = append(parts, "gossip encrypted")
	} else {
		parts = append(parts, "gossip in cleartext")
	}
	if s.GetInsecure() {
		parts = append(parts, "INSECURE (-insecure)")
	}
	return strings.Join(parts, ", ")
}

// accessCell is a node's security in the NODE table: TLS or cleartext,
// and its access file's digest ("open" without one); "?" when the node
// gossips none.
func accessCell(sec *nornv1.SecurityStatus) string {
	if sec == nil {
		return "?"
	}
	out := "cleartext"
	if sec.GetTls() {
		out = "tls"
	}
	if sec.GetAccessControl() {
		return out + ", rules " + sec.GetAccessDigest()
	}
	return out + ", open"
}

// securityDiffers names the settings on which the nodes that gossip
// theirs disagree ("" when they agree).
func securityDiffers(st *nornv1.StatusResponse) string {
	seen := map[string][]string{} // accessCell -> node ids
	for _, n := range st.GetNodes() {
		sec := n.GetSecurity()
		if n.GetId() == st.GetNodeId() {
			sec = st.GetSecurity()
		}
		if sec == nil {
			continue
		}
		c := accessCell(sec)
		seen[c] = append(seen[c], n.GetId())
	}
	if len(seen) < 2 {
		return ""
	}
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(seen)) {
		parts = append(parts, strings.Join(seen[c], ",")+": "+c)
	}
	return strings.Join(parts, "; ")
}
