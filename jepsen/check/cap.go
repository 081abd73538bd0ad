package check

import (
	"fmt"
	"slices"
	"time"
)

// Cap checks a capped queue's limit (docs/JOBQUEUE.md, "Limits"): no
// more than limit tasks held at once outside the fault windows, and no
// more than limit+overshoot within them (the bound the docs state for
// a change of the queue's owner).
//
// A claim counts only while it was surely held: from its answer (it was
// granted before) to the earliest of the call of the op that ended it or
// may have (a complete, yield or fail that was not refused, a cancel of
// the task that was not refused), and its lease's end counted from its
// own call or its last acked renew's (the lease runs from a grant after
// that call, and a leader expires it no earlier in real time: the skew
// buffer covers the clocks' spread). A cancel of the task (not refused)
// called before the claim's answer leaves it nothing: it may have landed
// right after the grant. Every other moment of a claim is left out, so
// a count above the limit is a real overlap.
func Cap(ops []*Op, limit, overshoot int, windows [][2]int64) Verdict {
	v := Verdict{Checker: "cap", Counts: map[string]int{}}
	type key struct{ task, claim uint64 }
	type span struct {
		from, to int64
		task     uint64
		claim    uint64
	}
	spans := map[key]*span{}
	leaseEnd := map[key]int64{}
	for _, o := range ops {
		if o.F == "claim" && o.Type == "ok" && o.Task != 0 {
			k := key{o.Task, o.Claim}
			spans[k] = &span{from: o.Return, to: 1<<62 - 1, task: o.Task, claim: o.Claim}
			leaseEnd[k] = o.Call + o.LeaseMS*int64(time.Millisecond)
		}
	}
	cancels := map[uint64][]int64{} // task -> calls of cancels that may have taken effect
	for _, o := range ops {
		k := key{o.Task, o.Claim}
		switch {
		case o.F == "renew" && o.Type == "ok":
			if _, ok := spans[k]; ok {
				leaseEnd[k] = max(leaseEnd[k], o.Call+o.LeaseMS*int64(time.Millisecond))
			}
		case (o.F == "complete" || o.F == "yield" || o.F == "fail") && o.Type != "fail":
			if s, ok := spans[k]; ok {
				s.to = min(s.to, o.Call)
			}
		case o.F == "cancel" && o.Type != "fail":
			cancels[o.Task] = append(cancels[o.Task], o.Call)
		}
	}
	type edge struct {
		t     int64
		delta int
	}
	var edges []edge
	for k, s := range spans {
		s.to = min(s.to, leaseEnd[k])
		// A cancel ends the claim where it lands, between its call and
		// the claim's end; the task's counters (what the owner counts)
		// leave CLAIMED then. So the claim is surely held only up to the
		// later of the cancel's call and the claim's answer.
		for _, c := range cancels[k.task] {
			s.to = min(s.to, max(c, s.from))
		}
		if s.to <= s.from {
			continue
		}
		v.Counts["claims"]++
		edges = append(edges, edge{s.from, +1}, edge{s.to, -1})
	}
	// Ends before starts at one instant: a span is half open.
	slices.SortFunc(edges, func(a, b edge) int {
		if a.t != b.t {
			if a.t < b.t {
				return -1
			}
			return 1
		}
		return a.delta - b.delta
	})
	inWindow := func(t int64) bool {
		return slices.ContainsFunc(windows, func(w [2]int64) bool { return t >= w[0] && t <= w[1] })
	}
	held, most, mostOutside := 0, 0, 0
	for _, e := range edges {
		held += e.delta
		if e.delta < 0 {
			continue
		}
		most = max(most, held)
		allowed := limit
		if inWindow(e.t) {
			allowed = limit + overshoot
		} else {
			mostOutside = max(mostOutside, held)
		}
		if held > allowed {
			v.Counts["over"]++
			if v.Counts["over"] <= 10 {
				v.Addf("at %.3fs %d tasks were surely held at once, above %d (cap %d%s)", float64(e.t)/1e9, held, allowed, limit,
					map[bool]string{true: fmt.Sprintf(" plus the overshoot %d in a fault window", overshoot), false: ""}[allowed != limit])
			}
		}
	}
	v.Counts["most_held"], v.Counts["most_held_outside_faults"] = most, mostOutside
	v.Valid = v.Counts["over"] == 0
	return v
}
