package jepsen

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Verdict is one checker's result.
type Verdict struct {
	Checker string         `json:"checker"`
	Valid   bool           `json:"valid"`
	Skipped string         `json:"skipped,omitempty"` // why the checker did not run
	Counts  map[string]int `json:"counts,omitempty"`
	Details []string       `json:"details,omitempty"` // the first few anomalies
	// ReportOnly: the scenario reports this checker's anomalies without
	// failing (its faults go beyond the promise the checker tests).
	ReportOnly bool `json:"report_only,omitempty"`
}

func (v *Verdict) add(format string, args ...any) {
	if len(v.Details) < 20 {
		v.Details = append(v.Details, fmt.Sprintf(format, args...))
	}
}

// Status is the verdict in one word.
func (v *Verdict) Status() string {
	switch {
	case v.Skipped != "":
		return "skipped"
	case v.Valid:
		return "pass"
	case v.ReportOnly:
		return "reported"
	}
	return "FAIL"
}

// taskState is the porcupine model's state of one task.
type taskState struct {
	Live     uint64 // the live claim, 0 for none
	Long     bool   // whether the live claim has a long lease (cannot expire during the run)
	Last     uint64 // the last granted claim id
	Terminal bool   // a complete or cancel acked by every replica
	Soft     bool   // a complete or cancel acked by fewer (may not have reached the leader)
}

// taskModel is the sequential specification of one task, nondeterministic
// where the outcome of an indeterminate op or a short lease's expiry is
// unknown.
func taskModel(replication uint32) porcupine.Model {
	step := func(st any, in, _ any) []any {
		s := st.(taskState)
		o := in.(*Op)
		c := o.Claim
		legalEnd := func(t taskState) taskState { t.Live = 0; return t }
		switch o.F {
		case "claim":
			if s.Terminal || c <= s.Last || (s.Live != 0 && s.Long) {
				return nil
			}
			return []any{taskState{Live: c, Long: o.Long, Last: c, Soft: s.Soft}}
		case "renew", "yield":
			end := o.F == "yield"
			switch o.Type {
			case "ok":
				if s.Live != c || s.Terminal {
					return nil
				}
				if end {
					return []any{legalEnd(s)}
				}
				return []any{s}
			case "fail":
				if s.Live == c && !s.Terminal {
					if s.Long && !s.Soft {
						return nil // a live long claim of a live task must be renewable
					}
					return []any{legalEnd(s)} // expired (short lease) or ended by a soft terminal
				}
				return []any{s}
			default:
				out := []any{s}
				if s.Live == c && (end || !s.Long) {
					out = append(out, legalEnd(s))
				}
				return out
			}
		case "complete", "cancel":
			eff := s
			if o.W >= replication {
				eff.Terminal, eff.Live = true, 0
			} else {
				eff.Soft = true
			}
			legal := o.F == "cancel" || s.Last == c || s.Terminal || s.Soft
			switch o.Type {
			case "ok":
				if !legal {
					return nil
				}
				return []any{eff}
			case "fail":
				return []any{s}
			default:
				if legal {
					return []any{s, eff}
				}
				return []any{s}
			}
		}
		return []any{s}
	}
	nm := porcupine.NondeterministicModel{
		Init: func() []any { return []any{taskState{}} },
		Step: step,
		Equal: func(a, b any) bool {
			return a.(taskState) == b.(taskState)
		},
		DescribeOperation: func(in, _ any) string {
			o := in.(*Op)
			s := fmt.Sprintf("%s(task %d, claim %d)", o.F, o.Task, o.Claim)
			if o.W != 0 {
				s += fmt.Sprintf(" w=%d", o.W)
			}
			if o.Long {
				s += " long"
			}
			return s + " -> " + o.Type + " " + o.Err
		},
		DescribeState: func(st any) string {
			s := st.(taskState)
			return fmt.Sprintf("live=%d long=%v last=%d terminal=%v soft=%v", s.Live, s.Long, s.Last, s.Terminal, s.Soft)
		},
	}
	m := nm.ToModel()
	m.Partition = func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[uint64][]porcupine.Operation{}
		var keys []uint64
		for _, op := range h {
			id := op.Input.(*Op).Task
			if _, ok := by[id]; !ok {
				keys = append(keys, id)
			}
			by[id] = append(by[id], op)
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	}
	return m
}

// CheckLinearizable checks the claim-path ops of every task against the
// task model with porcupine. A timeout is a failure. On failure the
// visualization is written to dir/linearizability.html.
func CheckLinearizable(ops []*Op, replication uint32, timeout time.Duration, dir string) Verdict {
	v := Verdict{Checker: "linearizable", Counts: map[string]int{}}
	var hist []porcupine.Operation
	tasks := map[uint64]bool{}
	for _, o := range ops {
		switch o.F {
		case "claim", "renew", "yield", "complete", "cancel":
		default:
			continue
		}
		if o.Task == 0 || (o.F == "claim" && o.Type != "ok") {
			continue
		}
		tasks[o.Task] = true
		hist = append(hist, porcupine.Operation{ClientId: o.Process, Input: o, Output: o, Call: o.Call, Return: o.Ret()})
	}
	v.Counts["ops"] = len(hist)
	v.Counts["tasks"] = len(tasks)
	model := taskModel(replication)
	res, info := porcupine.CheckOperationsVerbose(model, hist, timeout)
	v.Valid = res == porcupine.Ok
	if !v.Valid {
		if res == porcupine.Unknown {
			v.add("porcupine timed out after %s (counted as a failure)", timeout)
			v.Counts["timeout"] = 1
		} else {
			v.add("porcupine: not linearizable")
			// Is the anomaly only refusals? Without the definite
			// failures of renew, yield and complete, is the rest
			// linearizable (no double grant, no decreasing claim id, no
			// claim of a terminal task)?
			var relaxed []porcupine.Operation
			for _, op := range hist {
				if o := op.Input.(*Op); o.Type == "fail" && (o.F == "renew" || o.F == "yield" || o.F == "complete") &&
					(strings.HasPrefix(o.Err, "failed_precondition") || strings.HasPrefix(o.Err, "not_found")) {
					continue
				}
				relaxed = append(relaxed, op)
			}
			if porcupine.CheckOperationsTimeout(model, relaxed, timeout) == porcupine.Ok {
				v.Counts["spurious-refusals"] = 1
				v.add("only spurious refusals: some renew, yield or complete of a live claim was refused (FAILED_PRECONDITION or NOT_FOUND); " +
					"without those refusals the history is linearizable (no claim granted twice). A Norn bug (docs/JEPSEN.md, known bugs); " +
					"a failure as long as it is not fixed")
			}
		}
		// Name the tasks whose histories fail, with their ops.
		byTask := map[uint64][]porcupine.Operation{}
		for _, op := range hist {
			id := op.Input.(*Op).Task
			byTask[id] = append(byTask[id], op)
		}
		for id, h := range byTask {
			if porcupine.CheckOperationsTimeout(model, h, 5*time.Second) == porcupine.Ok {
				continue
			}
			v.Counts["illegal-tasks"]++
			if v.Counts["illegal-tasks"] > 3 {
				continue
			}
			var b strings.Builder
			for _, op := range h {
				o := op.Input.(*Op)
				fmt.Fprintf(&b, "\n    [%.3fs, %.3fs] p%d %s", float64(o.Call)/1e9, float64(op.Return)/1e9, o.Process, model.DescribeOperation(o, o))
			}
			v.add("task %d not linearizable:%s", id, b.String())
		}
		if dir != "" {
			path := filepath.Join(dir, "linearizability.html")
			if err := porcupine.VisualizePath(model, info, path); err != nil {
				v.add("visualization: %v", err)
			} else {
				v.add("visualization: %s", path)
			}
		}
	}
	return v
}

// claimWindow is a claim as its worker saw it: held from the claim until
// the worker's own conservative view of the lease end.
type claimWindow struct {
	op  *Op
	end int64 // harness time the worker's lease certainly ended
}

// CheckExclusion checks that two claims of one short-lease task never
// overlap: the next claim must not have returned before the worker's
// conservative end of the previous one (lease counted from the call of
// the claim or of the last successful renew, cut by its complete or
// yield). Overlaps are counted and listed; with clocks within the skew
// buffer any overlap is a failure.
func CheckExclusion(ops []*Op) Verdict {
	v := Verdict{Checker: "exclusion", Counts: map[string]int{}}
	claims := map[uint64]map[uint64]*claimWindow{} // task -> claim id -> window
	for _, o := range ops {
		if o.F == "claim" && o.Type == "ok" && o.Task != 0 {
			if claims[o.Task] == nil {
				claims[o.Task] = map[uint64]*claimWindow{}
			}
			claims[o.Task][o.Claim] = &claimWindow{op: o, end: o.Call + o.LeaseMS*int64(time.Millisecond)}
		}
	}
	for _, o := range ops { // in call order
		w := claims[o.Task][o.Claim]
		if w == nil || o.F == "claim" {
			continue
		}
		switch {
		case o.F == "renew" && o.Type == "ok":
			if e := o.Call + o.LeaseMS*int64(time.Millisecond); e > w.end {
				w.end = e
			}
		case o.F == "complete" || o.F == "yield":
			if o.Call < w.end {
				w.end = o.Call
			}
		}
	}
	for task, byID := range claims {
		var ws []*claimWindow
		for _, w := range byID {
			ws = append(ws, w)
		}
		sort.Slice(ws, func(i, j int) bool { return ws[i].op.Claim < ws[j].op.Claim })
		for i := 1; i < len(ws); i++ {
			prev, next := ws[i-1], ws[i]
			if prev.op.Long {
				continue // long leases: the linearizability checker's job
			}
			v.Counts["pairs"]++
			if overlap := prev.end - next.op.Return; overlap > 0 {
				v.Counts["overlaps"]++
				v.add("task %d: claim %d (client %d) held until %.3fs, claim %d (client %d) granted by %.3fs: overlap %s",
					task, prev.op.Claim, prev.op.Client, float64(prev.end)/1e9, next.op.Claim, next.op.Client,
					float64(next.op.Return)/1e9, time.Duration(overlap).Round(time.Millisecond))
			}
		}
	}
	v.Valid = v.Counts["overlaps"] == 0
	return v
}

// CheckTerminal checks that no claim of a task was granted after a
// complete or cancel of it was acked by every replica.
func CheckTerminal(ops []*Op, replication uint32) Verdict {
	v := Verdict{Checker: "terminal-stable", Counts: map[string]int{}}
	term := map[uint64]*Op{}
	for _, o := range ops {
		if (o.F == "complete" || o.F == "cancel") && o.Type == "ok" && o.W >= replication {
			if t := term[o.Task]; t == nil || o.Return < t.Return {
				term[o.Task] = o
			}
		}
	}
	v.Counts["terminal"] = len(term)
	for _, o := range ops {
		if o.F != "claim" || o.Type != "ok" {
			continue
		}
		if t := term[o.Task]; t != nil && o.Call > t.Return {
			v.Counts["claims-after-terminal"]++
			v.add("task %d: %s acked w=%d at %.3fs, claimed again (claim %d) at %.3fs", o.Task, t.F, t.W,
				float64(t.Return)/1e9, o.Claim, float64(o.Call)/1e9)
		}
	}
	v.Valid = v.Counts["claims-after-terminal"] == 0
	return v
}

// CheckQueue is Jepsen's total queue: every acked enqueue is delivered
// (claimed) or ended; nothing comes out that was not enqueued; duplicates
// (a task claimed again after a complete of it was acked, with any w) are
// counted, not failed, and so are redeliveries (a task claimed more than
// once, which yields and expired short leases make legal). final holds the
// R=N status of each acked task never delivered.
func CheckQueue(ops []*Op, final map[uint64]string) Verdict {
	v := Verdict{Checker: "total-queue", Counts: map[string]int{}}
	attempted := map[string]bool{}
	acked := map[uint64]string{}
	for _, o := range ops {
		if o.F == "enqueue" && o.Type != "fail" {
			attempted[o.Payload] = true
			if o.Type == "ok" {
				acked[o.Task] = o.Payload
			}
		}
	}
	delivered := map[uint64]int{}
	for _, o := range ops {
		if o.F == "claim" && o.Type == "ok" && o.Task != 0 {
			delivered[o.Task]++
			if !attempted[o.Payload] || (acked[o.Task] != "" && acked[o.Task] != o.Payload) {
				v.Counts["unexpected"]++
				v.add("task %d delivered with payload %q never enqueued under it", o.Task, o.Payload)
			}
		}
	}
	v.Counts["attempted"] = len(attempted)
	v.Counts["acked"] = len(acked)
	v.Counts["delivered"] = len(delivered)
	done := map[uint64]int64{} // task -> first acked complete
	for _, o := range ops {
		if o.F == "complete" && o.Type == "ok" {
			if t, ok := done[o.Task]; !ok || o.Return < t {
				done[o.Task] = o.Return
			}
		}
	}
	for _, o := range ops {
		if t, ok := done[o.Task]; ok && o.F == "claim" && o.Type == "ok" && o.Call > t {
			v.Counts["duplicated"]++ // delivered again after an acked complete (any w)
		}
	}
	for id, k := range delivered {
		if k > 1 {
			v.Counts["redelivered"]++ // claimed more than once: yields and expired short leases
		}
		if _, ok := acked[id]; !ok {
			v.Counts["recovered"]++ // an indeterminate enqueue that took effect
		}
	}
	ackedAt := map[uint64]int64{}
	for _, o := range ops {
		if o.F == "enqueue" && o.Type == "ok" {
			ackedAt[o.Task] = o.Return
		}
	}
	for _, o := range ops {
		if t, ok := ackedAt[o.Task]; ok && o.F == "read" && o.Type == "fail" && strings.HasPrefix(o.Err, "not_found") && o.Call > t {
			v.Counts["acked-read-not-found"]++
			v.add("task %d acked (w=2) at %.3fs, read with r=2 at %.3fs via %s: not found", o.Task, float64(t)/1e9, float64(o.Call)/1e9, o.Node)
		}
	}
	for id := range acked {
		if delivered[id] > 0 {
			continue
		}
		st := final[id]
		switch {
		case st == "TASK_STATUS_COMPLETED" || st == "TASK_STATUS_CANCELLED" || st == "TASK_STATUS_ABORTED":
			v.Counts["ended-undelivered"]++
		case st == "TASK_STATUS_CLAIMED":
			v.Counts["held"]++ // claimed by an indeterminate claim or an abandoned long lease
		default:
			v.Counts["lost"]++
			v.add("task %d (%s) acked, never delivered, final read: %s", id, acked[id], st)
		}
	}
	v.Valid = v.Counts["lost"] == 0 && v.Counts["unexpected"] == 0 && v.Counts["acked-read-not-found"] == 0
	return v
}

// CheckLiveness: at least minOps successful ops before the first fault
// (or in the whole run without faults), and a successful claim within
// 10 s after the heal.
func CheckLiveness(ops []*Op, firstFault, heal, firstClaimAfterHeal int64, minOps int) Verdict {
	v := Verdict{Checker: "liveness", Counts: map[string]int{}}
	for _, o := range ops {
		if o.Type == "ok" && (firstFault < 0 || o.Return < firstFault) {
			v.Counts["ok-before-fault"]++
		}
	}
	v.Valid = true
	if v.Counts["ok-before-fault"] < minOps {
		v.Valid = false
		v.add("%d successful ops before the first fault, want >= %d", v.Counts["ok-before-fault"], minOps)
	}
	if firstClaimAfterHeal < 0 {
		v.Valid = false
		v.add("no successful claim after the heal")
	} else {
		ms := int((firstClaimAfterHeal - heal) / int64(time.Millisecond))
		v.Counts["ms-to-claim-after-heal"] = ms
		if ms > 10000 {
			v.Valid = false
			v.add("first claim %d ms after the heal, want <= 10000", ms)
		}
	}
	return v
}

// Summary formats verdicts as a table row.
func Summary(vs []Verdict) string {
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "%s=%s ", v.Checker, v.Status())
	}
	return strings.TrimSpace(b.String())
}

// ReadHistory reads a history.jsonl file.
func ReadHistory(path string) ([]*Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []*Op
	dec := json.NewDecoder(f)
	for dec.More() {
		o := new(Op)
		if err := dec.Decode(o); err != nil {
			return nil, err
		}
		ops = append(ops, o)
	}
	return ops, nil
}
