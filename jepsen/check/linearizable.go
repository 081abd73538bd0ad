package check

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// taskState is the porcupine model's state of one task.
type taskState struct {
	Live     uint64 // the live claim, 0 for none
	Long     bool   // whether the live claim has a long lease (cannot expire during the run)
	Last     uint64 // the last granted claim id
	Terminal bool   // a complete (any w: the group decides it) or a cancel acked by every replica
	TermBy   uint64 // the claim whose complete made the task terminal, 0 for a cancel
	Soft     bool   // a cancel acked by fewer (may not have reached the leader)
	Failed   uint64 // the last claim whose attempt failed (a retryable abort took effect)
}

// deadlineSlack is how long before a task's deadline the model lets its
// claim end without an op: more than the skew buffer a leader's clock
// may run ahead.
const deadlineSlack = 3 * time.Second

// taskModel is the sequential specification of one task, nondeterministic
// where the outcome of an indeterminate op or a short lease's expiry is
// unknown. deadlines are the tasks' deadlines (TaskDeadlines): from
// deadlineSlack before one, a claim may end without an op (the leader
// cancels the task; the deadlines checker judges the time).
func taskModel(replication uint32, deadlines map[uint64]int64) porcupine.Model {
	step := func(st any, in, _ any) []any {
		s := st.(taskState)
		o := in.(*Op)
		c := o.Claim
		legalEnd := func(t taskState) taskState { t.Live = 0; return t }
		d, ok := deadlines[o.Task]
		pastDeadline := ok && o.Ret() >= d-int64(deadlineSlack)
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
					if s.Long && !s.Soft && !pastDeadline {
						return nil // a live long claim of a live task must be renewable
					}
					return []any{legalEnd(s)} // expired (short lease) or ended by a soft terminal
				}
				return []any{s}
			default:
				out := []any{s}
				if s.Live == c && (end || !s.Long || pastDeadline) {
					out = append(out, legalEnd(s))
				}
				return out
			}
		case "fail":
			// A retryable abort is fenced like a complete: it takes
			// effect only under the live claim, and ends it. Then the
			// task is claimable again (after its backoff: the retries
			// checker's part), or dead when it was the last attempt
			// allowed, which the model cannot tell (expired short
			// leases count as attempts too): both are legal. A retry of
			// the same fail is acked again and changes nothing.
			again := s.Failed == c && c != 0
			legal := (s.Live == c && !s.Terminal) || again
			retried := s
			retried.Live, retried.Failed = 0, c
			dead := retried
			dead.Terminal, dead.TermBy = true, 0
			switch {
			case o.Type == "fail":
				return []any{s}
			case !legal && o.Type == "ok":
				return nil
			case !legal:
				return []any{s}
			case again && o.Type == "ok":
				return []any{s}
			case again:
				return []any{s}
			case o.Type == "ok":
				return []any{retried, dead}
			}
			return []any{s, retried, dead}
		case "retry":
			// A Retry gives a cancelled (or dead) task a new life: it is
			// claimable again, its claim ids still growing. A completed
			// task is never retried: its result was accepted.
			legal := s.Terminal && s.TermBy == 0
			revived := taskState{Last: s.Last, Failed: s.Failed}
			switch {
			case o.Type == "fail":
				return []any{s}
			case o.Type == "ok" && !legal:
				return nil
			case o.Type == "ok":
				return []any{revived}
			case legal:
				return []any{s, revived}
			}
			return []any{s}
		case "complete", "cancel":
			// A complete is fenced (DESIGN 4, 7.3a): it takes effect only
			// under the live claim, and then the task is terminal at any
			// w, the group having decided it; a retry of the same complete
			// after an indeterminate one may be acked again. A cancel
			// needs no claim; below w = N it may not have reached the
			// leader (soft).
			eff := s
			switch {
			case o.F == "complete":
				eff.Terminal, eff.Live, eff.TermBy = true, 0, c
			case o.W >= replication:
				eff.Terminal, eff.Live, eff.TermBy = true, 0, 0
			default:
				eff.Soft = true
			}
			legal := o.F == "cancel" || (s.Live == c && !s.Terminal) || (s.Terminal && s.TermBy == c && c != 0)
			if o.F == "complete" && s.Terminal && s.TermBy == c {
				eff = s // the retry changes nothing
			}
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
			return fmt.Sprintf("live=%d long=%v last=%d terminal=%v by=%d soft=%v failed=%d", s.Live, s.Long, s.Last, s.Terminal, s.TermBy, s.Soft, s.Failed)
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

// Linearizable checks the claim-path ops of every task against the
// task model with porcupine. A timeout is a failure. On failure the
// visualization is written to dir/linearizability.html.
func Linearizable(ops []*Op, replication uint32, timeout time.Duration, dir string) Verdict {
	v := Verdict{Checker: "linearizable", Counts: map[string]int{}}
	var hist []porcupine.Operation
	tasks := map[uint64]bool{}
	for _, o := range ops {
		switch o.F {
		case "claim", "renew", "yield", "complete", "cancel", "fail", "retry":
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
	model := taskModel(replication, TaskDeadlines(ops))
	res, info := porcupine.CheckOperationsVerbose(model, hist, timeout)
	v.Valid = res == porcupine.Ok
	if !v.Valid {
		if res == porcupine.Unknown {
			v.Addf("porcupine timed out after %s (counted as a failure)", timeout)
			v.Counts["timeout"] = 1
		} else {
			v.Addf("porcupine: not linearizable")
			// Is the anomaly only refusals? Without the definite
			// failures of renew, yield and complete, is the rest
			// linearizable (no double grant, no decreasing claim id, no
			// claim of a terminal task)?
			var relaxed []porcupine.Operation
			for _, op := range hist {
				if o := op.Input.(*Op); o.Type == "fail" && (o.F == "renew" || o.F == "yield" || o.F == "complete" || o.F == "fail") &&
					(strings.HasPrefix(o.Err, "failed_precondition") || strings.HasPrefix(o.Err, "not_found")) {
					continue
				}
				relaxed = append(relaxed, op)
			}
			if porcupine.CheckOperationsTimeout(model, relaxed, timeout) == porcupine.Ok {
				v.Counts["spurious-refusals"] = 1
				v.Addf("only spurious refusals: some renew, yield or complete of a live claim was refused (FAILED_PRECONDITION or NOT_FOUND); " +
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
			v.Addf("task %d not linearizable:%s", id, b.String())
		}
		if dir != "" {
			path := filepath.Join(dir, "linearizability.html")
			if err := porcupine.VisualizePath(model, info, path); err != nil {
				v.Addf("visualization: %v", err)
			} else {
				v.Addf("visualization: %s", path)
			}
		}
	}
	return v
}
