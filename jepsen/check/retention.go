package check

import (
	"strings"
	"time"
)

// Retention checks a queue's retention (QueueSettings.retention) from a
// history of the tasks of one queue with it: enqueues, claims, completes,
// reads during the run (F "read", R=2) and a final read (F "final", R=3,
// every replica) once every completed task is past its retention plus
// settle. A task deleted is read as NOT_FOUND (Type "fail", Err
// "not_found: ...").
//
//   - early: a read finds a task gone before retention (less slack) has
//     passed since its first complete was called (or one never called);
//     retention counts from the event that ended it, which no complete
//     precedes.
//   - reappeared: a read called more than settle after a read found the
//     task gone finds it again (settle covers the replicas' passes, a
//     monitor interval apart: a quorum read may meet one that has not
//     run yet).
//   - kept: the final read finds a task whose complete was acknowledged
//     more than retention plus settle before it.
func Retention(ops []Op, retention, slack, settle time.Duration) Verdict {
	v := Verdict{Checker: "retention", Counts: map[string]int{}}
	ended := map[uint64]int64{}   // first complete called (any outcome but a definite fail)
	acked := map[uint64]int64{}   // first complete acknowledged
	gone := map[uint64]int64{}    // first read that found the task gone (its return)
	enqueued := map[uint64]bool{} // acknowledged enqueues
	for _, o := range ops {
		switch {
		case o.F == "enqueue" && o.Type == "ok":
			enqueued[o.Task] = true
		case o.F == "complete" && o.Type != "fail":
			if t, ok := ended[o.Task]; !ok || o.Call < t {
				ended[o.Task] = o.Call
			}
			if o.Type == "ok" {
				if t, ok := acked[o.Task]; !ok || o.Return < t {
					acked[o.Task] = o.Return
				}
			}
		}
	}
	v.Counts["tasks"] = len(enqueued)
	v.Counts["completed"] = len(acked)
	notFound := func(o Op) bool { return o.Type == "fail" && strings.HasPrefix(o.Err, "not_found") }
	for _, o := range ops {
		if (o.F != "read" && o.F != "final") || !notFound(o) {
			continue
		}
		if t, ok := gone[o.Task]; !ok || o.Return < t {
			gone[o.Task] = o.Return
		}
		e, ok := ended[o.Task]
		if !ok || o.Return < e+int64(retention-slack) {
			v.Counts["early"]++
			if !ok {
				v.Addf("task %d read gone via %s at %.3fs, never completed", o.Task, o.Node, seconds(o.Return))
			} else {
				v.Addf("task %d read gone via %s at %.3fs, %.3fs after its complete was called (retention %s)", o.Task, o.Node, seconds(o.Return), seconds(o.Return-e), retention)
			}
		}
	}
	v.Counts["deleted"] = len(gone)
	for _, o := range ops {
		if (o.F != "read" && o.F != "final") || o.Type != "ok" {
			continue
		}
		if t, ok := gone[o.Task]; ok && o.Call > t+int64(settle) {
			v.Counts["reappeared"]++
			v.Addf("task %d read gone at %.3fs, found again by a read via %s called at %.3fs", o.Task, seconds(t), o.Node, seconds(o.Call))
		}
		if t, ok := acked[o.Task]; ok && o.F == "final" && o.Call > t+int64(retention+settle) {
			v.Counts["kept"]++
			v.Addf("task %d completed at %.3fs, still read at %.3fs (retention %s)", o.Task, seconds(t), seconds(o.Call), retention)
		}
	}
	if len(acked) == 0 {
		v.Skipped = "no task of the retained queue was completed"
	}
	v.Valid = v.Counts["early"] == 0 && v.Counts["reappeared"] == 0 && v.Counts["kept"] == 0
	return v
}

func seconds(ns int64) float64 { return float64(ns) / 1e9 }
