package check

import (
	"time"
)

// Deadlines checks TaskSpec.deadline (docs/API.md, "Deadlines"): no
// claim of a task is granted, and no complete of it is taken, at or
// after its deadline. The claim FSM decides on the leader's clock, after
// the op's call: an op called at the deadline plus tolerance (the
// clocks' spread: the skew buffer when the run moved a node's clock, a
// rounding margin otherwise) that succeeded was taken late. And a task
// whose deadline passed settle before its final read (final: R=N
// statuses) has ended: the monitor cancelled it, or it was completed,
// aborted or dead before.
func Deadlines(ops []*Op, final map[uint64]string, finalAt int64, tolerance, settle time.Duration) Verdict {
	v := Verdict{Checker: "deadlines", Counts: map[string]int{}}
	dl := TaskDeadlines(ops)
	v.Counts["tasks"] = len(dl)
	for _, o := range ops {
		d, ok := dl[o.Task]
		if !ok || o.Type != "ok" || (o.F != "claim" && o.F != "complete") {
			continue
		}
		if o.Call < d+int64(tolerance) {
			if o.F == "complete" {
				v.Counts["completed-in-time"]++
			}
			continue
		}
		v.Counts[o.F+"-past-deadline"]++
		v.Addf("task %d: %s (claim %d) called at %.3fs, %s past its deadline (%.3fs), took effect (tolerance %s)",
			o.Task, o.F, o.Claim, float64(o.Call)/1e9, time.Duration(o.Call-d).Round(time.Millisecond), float64(d)/1e9, tolerance)
	}
	for id, d := range dl {
		st, read := final[id]
		if !read || d+int64(settle) > finalAt {
			continue
		}
		v.Counts["read"]++
		switch st {
		case "TASK_STATUS_CANCELLED":
			v.Counts["cancelled"]++
		case "TASK_STATUS_COMPLETED", "TASK_STATUS_ABORTED", "TASK_STATUS_DEAD", "NOT_FOUND":
		default:
			v.Counts["not-ended"]++
			v.Addf("task %d: deadline %.3fs, final read %s: not ended", id, float64(d)/1e9, st)
		}
	}
	v.Valid = v.Counts["claim-past-deadline"] == 0 && v.Counts["complete-past-deadline"] == 0 && v.Counts["not-ended"] == 0
	return v
}

// TaskDeadlines returns the deadline of every task enqueued with one (an
// acked enqueue), on the history's clock.
func TaskDeadlines(ops []*Op) map[uint64]int64 {
	out := map[uint64]int64{}
	for _, o := range ops {
		if o.F == "enqueue" && o.Type == "ok" && o.Deadline != 0 {
			out[o.Task] = o.Deadline
		}
	}
	return out
}
