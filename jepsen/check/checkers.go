package check

// The checkers of the whole history but linearizability: exclusion of
// short leases, terminal stability, the total queue, liveness.

import (
	"sort"
	"strings"
	"time"
)

// claimWindow is a claim as its worker saw it: held from the claim until
// the worker's own conservative view of the lease end.
type claimWindow struct {
	op  *Op
	end int64 // harness time the worker's lease certainly ended
	// cancelled is the return of the first acked cancel of the task
	// called after the claim (0: none): the claim ended by then.
	cancelled int64
}

// Exclusion checks that two claims of one short-lease task never
// overlap: the next claim must not have returned before the worker's
// conservative end of the previous one (lease counted from the call of
// the claim or of the last successful renew, cut by its complete or
// yield). Overlaps are counted and listed; with clocks within the skew
// buffer any overlap is a failure.
func Exclusion(ops []*Op) Verdict {
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
		if o.F == "cancel" && o.Type == "ok" {
			// A cancel ends the task's claim by the time it is acked (its
			// worker learns at its next renew): a Retry may give the task
			// to another worker next, which is not two workers at once. A
			// renew acked while the cancel ran was decided before it: it
			// extends the lease no further than the cancel's return
			// (seed 66278: a renew called 0.3 ms after the cancel's call
			// was counted as extending past it).
			for _, w := range claims[o.Task] {
				if w.op.Call < o.Call && w.cancelled == 0 {
					w.cancelled = o.Return
					w.end = min(w.end, o.Return)
				}
			}
			continue
		}
		w := claims[o.Task][o.Claim]
		if w == nil || o.F == "claim" {
			continue
		}
		switch {
		case o.F == "renew" && o.Type == "ok":
			e := o.Call + o.LeaseMS*int64(time.Millisecond)
			if w.cancelled != 0 && o.Call < w.cancelled {
				e = min(e, w.cancelled)
			}
			w.end = max(w.end, e)
		case o.F == "complete" || o.F == "yield" || o.F == "fail":
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
				v.Addf("task %d: claim %d (client %d) held until %.3fs, claim %d (client %d) granted by %.3fs: overlap %s",
					task, prev.op.Claim, prev.op.Client, float64(prev.end)/1e9, next.op.Claim, next.op.Client,
					float64(next.op.Return)/1e9, time.Duration(overlap).Round(time.Millisecond))
			}
		}
	}
	v.Valid = v.Counts["overlaps"] == 0
	return v
}

// Terminal checks that no claim of a task was granted after a complete
// of it was acked (at any w: the partition's group decides a complete),
// or a cancel of it acked by every replica, unless a Retry (a new life)
// of the cancelled task was acked in between: a completed task is never
// retried.
func Terminal(ops []*Op, replication uint32) Verdict {
	v := Verdict{Checker: "terminal-stable", Counts: map[string]int{}}
	term := map[uint64]*Op{}
	retries := map[uint64][]*Op{}
	for _, o := range ops {
		if o.Type == "ok" && (o.F == "complete" || (o.F == "cancel" && o.W >= replication)) {
			if t := term[o.Task]; t == nil || o.Return < t.Return {
				term[o.Task] = o
			}
		}
		if o.F == "retry" && o.Type != "fail" {
			retries[o.Task] = append(retries[o.Task], o)
		}
	}
	v.Counts["terminal"] = len(term)
	revived := func(t, claim *Op) bool {
		if t.F != "cancel" {
			return false
		}
		for _, r := range retries[t.Task] {
			if r.Call < claim.Ret() && r.Ret() > t.Call {
				return true
			}
		}
		return false
	}
	for _, o := range ops {
		if o.F != "claim" || o.Type != "ok" {
			continue
		}
		if t := term[o.Task]; t != nil && o.Call > t.Return && !revived(t, o) {
			v.Counts["claims-after-terminal"]++
			v.Addf("task %d: %s acked w=%d at %.3fs, claimed again (claim %d) at %.3fs", o.Task, t.F, t.W,
				float64(t.Return)/1e9, o.Claim, float64(o.Call)/1e9)
		}
	}
	v.Valid = v.Counts["claims-after-terminal"] == 0
	return v
}

// Queue is Jepsen's total queue (the total-queue checker): every acked
// enqueue is delivered (claimed) or ended; nothing comes out that was not
// enqueued; duplicates (a task claimed again after a complete of it was
// acked, with any w) are counted, not failed, and so are redeliveries (a
// task claimed more than once, which yields and expired short leases make
// legal). final holds the R=N status of each acked task never delivered.
func Queue(ops []*Op, final map[uint64]string) Verdict {
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
				v.Addf("task %d delivered with payload %q never enqueued under it", o.Task, o.Payload)
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
			v.Addf("task %d acked (w=2) at %.3fs, read with r=2 at %.3fs via %s: not found", o.Task, float64(t)/1e9, float64(o.Call)/1e9, o.Node)
		}
	}
	for id := range acked {
		if delivered[id] > 0 {
			continue
		}
		st := final[id]
		switch {
		case st == "TASK_STATUS_COMPLETED" || st == "TASK_STATUS_CANCELLED" || st == "TASK_STATUS_ABORTED" || st == "TASK_STATUS_DEAD":
			v.Counts["ended-undelivered"]++
		case st == "TASK_STATUS_CLAIMED":
			v.Counts["held"]++ // claimed by an indeterminate claim or an abandoned long lease
		default:
			v.Counts["lost"]++
			v.Addf("task %d (%s) acked, never delivered, final read: %s", id, acked[id], st)
		}
	}
	v.Valid = v.Counts["lost"] == 0 && v.Counts["unexpected"] == 0 && v.Counts["acked-read-not-found"] == 0
	return v
}

// Liveness wants at least minOps successful ops before the first fault
// (or in the whole run without faults), and a successful claim within
// 10 s after the heal.
func Liveness(ops []*Op, firstFault, heal, firstClaimAfterHeal int64, minOps int) Verdict {
	v := Verdict{Checker: "liveness", Counts: map[string]int{}}
	for _, o := range ops {
		if o.Type == "ok" && (firstFault < 0 || o.Return < firstFault) {
			v.Counts["ok-before-fault"]++
		}
	}
	v.Valid = true
	if v.Counts["ok-before-fault"] < minOps {
		v.Valid = false
		v.Addf("%d successful ops before the first fault, want >= %d", v.Counts["ok-before-fault"], minOps)
	}
	if firstClaimAfterHeal < 0 {
		v.Valid = false
		v.Addf("no successful claim after the heal")
	} else {
		ms := int((firstClaimAfterHeal - heal) / int64(time.Millisecond))
		v.Counts["ms-to-claim-after-heal"] = ms
		if ms > 10000 {
			v.Valid = false
			v.Addf("first claim %d ms after the heal, want <= 10000", ms)
		}
	}
	return v
}
