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
var statusOrder = []string{"READY", "DELAYED", "CLAIMED", "COMPLETED", "ABORTED", "CANCELLED"}

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
	fmt.Fprintf(w, "STATUS:\t%s\n", statusName(t.GetStatus()))
	fmt.Fprintf(w, "PRIORITY:\t%d\n", s.GetPriority())
	fmt.Fprintf(w, "PROGRESS:\t%s\n", formatProgress(t.GetProgress()))
	fmt.Fprintf(w, "PAYLOAD:\t%s\n", formatBytes(s.GetPayload()))
	if s.GetNotBefore() != nil {
		fmt.Fprintf(w, "NOT BEFORE:\t%s\n", formatTS(s.GetNotBefore()))
	}
	if len(s.GetDependsOn()) > 0 {
		fmt.Fprintf(w, "DEPENDS ON:\t%s\n", joinIDs(s.GetDependsOn()))
	}
	if s.GetMaxClaims() > 0 {
		fmt.Fprintf(w, "MAX CLAIMS:\t%d\n", s.GetMaxClaims())
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
		fmt.Fprintf(w, "CODE\tDESCRIPTION\tARGS\n")
		for _, e := range t.GetErrors() {
			fmt.Fprintf(w, "%s\t%s\t%s\n", e.GetCode(), dash(oneLine(e.GetDescription())), dash(strings.Join(e.GetArgs(), ", ")))
		}
	}
}

// writeTaskList prints one row per task.
func writeTaskList(w io.Writer, tasks []*nornv1.Task) {
	fmt.Fprintf(w, "ID\tQUEUE\tSTATUS\tPRIORITY\tPROGRESS\tCLAIMS\tCREATED\tPAYLOAD\n")
	for _, t := range tasks {
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", t.GetId(), t.GetSpec().GetQueue(), statusName(t.GetStatus()),
			t.GetSpec().GetPriority(), formatProgress(t.GetProgress()), len(t.GetClaims()), formatTS(t.GetCreatedAt()),
			formatBytes(t.GetSpec().GetPayload()))
	}
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

// writeStatus prints the node, then one row per partition.
func writeStatus(w io.Writer, st *nornv1.StatusResponse) {
	fmt.Fprintf(w, "NODE:\t%s\n", st.GetNodeId())
	fmt.Fprintf(w, "VERSION:\t%s\n", st.GetVersion())
	fmt.Fprintf(w, "UPTIME:\t%s\n", st.GetUptime().AsDuration().Round(time.Second))
	fmt.Fprintf(w, "RING EPOCH:\t%d\n", st.GetRingEpoch())
	fmt.Fprintf(w, "PARTITIONS:\t%d\n", len(st.GetPartitions()))
	health := "healthy"
	if !st.GetHealthy() {
		health = "UNHEALTHY: " + strings.Join(st.GetProblems(), "; ")
	}
	fmt.Fprintf(w, "HEALTH:\t%s\n", health)
	if len(st.GetNodes()) > 0 {
		fmt.Fprintf(w, "\nNODE\tADDRESS\tSTATE\tCLOCK OFFSET\tFROM MEDIAN\n")
		for _, n := range st.GetNodes() {
			dur := func(d *durationpb.Duration) string {
				if d == nil {
					return "-"
				}
				return d.AsDuration().Round(100 * time.Microsecond).String()
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", n.GetId(), n.GetApiAddress(), n.GetState(), dur(n.GetClockOffset()), dur(n.GetMedianOffset()))
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
