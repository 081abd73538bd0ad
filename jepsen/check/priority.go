package check

import (
	"sort"
	"time"
)

// unknownClaimSpan is how long after its call a claim whose outcome is
// unknown (info) may still have taken a task: the workload's op timeout
// (3 s) and a margin.
const unknownClaimSpan = 5 * time.Second

// Priority checks the claim order across the cluster (docs/API.md,
// "Claim order"): no claim took a task of lower priority than a task
// that had been claimable for settle already when the claim was called
// and was still unclaimed when it returned. A task counts as claimable
// from its enqueue's ack (plus settle, which covers the bound on the
// other leaders' reports) until the call of the first claim that got it
// or of a cancel of it; a task some claim of unknown outcome may have
// taken is left out. The drain's claims are not checked (they take many
// tasks at once after the run).
func Priority(ops []*Op, settle time.Duration) Verdict {
	v := Verdict{Checker: "priority", Counts: map[string]int{}}
	type task struct {
		id            uint64
		pr            int32
		enqueued      int64 // its enqueue's call
		claimableFrom int64 // its enqueue's ack plus settle
		taken         int64 // the call of the first claim or cancel of it
	}
	byID := map[uint64]*task{}
	var tasks []*task
	for _, o := range ops {
		if o.F == "enqueue" && o.Type == "ok" && o.Task != 0 {
			t := &task{id: o.Task, pr: o.Priority, enqueued: o.Call, claimableFrom: o.Return + int64(settle), taken: 1<<62 - 1}
			byID[o.Task] = t
			tasks = append(tasks, t)
		}
	}
	var unknown []int64 // calls of claims whose outcome is unknown
	for _, o := range ops {
		switch {
		case o.F == "claim" && o.Type == "ok", o.F == "cancel":
			if t := byID[o.Task]; t != nil && o.Call < t.taken {
				t.taken = o.Call
			}
		case o.F == "claim" && o.Type == "info":
			unknown = append(unknown, o.Call)
		}
	}
	sort.Slice(unknown, func(i, j int) bool { return unknown[i] < unknown[j] })
	// mayBeHeld reports whether a claim of unknown outcome may have taken
	// t before by.
	mayBeHeld := func(t *task, by int64) bool {
		i := sort.Search(len(unknown), func(i int) bool { return unknown[i]+int64(unknownClaimSpan) > t.enqueued })
		return i < len(unknown) && unknown[i] < by
	}
	sort.Slice(tasks, func(i, j int) bool { return tasks[i].pr > tasks[j].pr })
	for _, c := range ops {
		if c.F != "claim" || c.Type != "ok" || c.Drain {
			continue
		}
		got := byID[c.Task]
		if got == nil {
			continue
		}
		v.Counts["claims"]++
		for _, t := range tasks {
			if t.pr <= got.pr {
				break
			}
			if t.claimableFrom > c.Call || t.taken < c.Return {
				continue
			}
			if mayBeHeld(t, c.Return) {
				v.Counts["unknown"]++
				continue
			}
			v.Counts["passed-over"]++
			v.Addf("claim of task %d (priority %d) by client %d through %s at %.3fs-%.3fs passed over task %d (priority %d), claimable since %.3fs, first taken at %s",
				c.Task, got.pr, c.Client, c.Node, float64(c.Call)/1e9, float64(c.Return)/1e9, t.id, t.pr,
				float64(t.claimableFrom)/1e9, takenAt(t.taken))
		}
	}
	v.Valid = v.Counts["passed-over"] == 0
	return v
}

func takenAt(ns int64) string {
	if ns >= 1<<62-1 {
		return "never"
	}
	return time.Duration(ns).Round(time.Millisecond).String()
}
