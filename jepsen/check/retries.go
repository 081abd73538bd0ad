package check

import (
	"slices"
	"sort"
	"time"
)

// Retries checks the retry backoff (docs/API.md, "Retries"): after a
// retryable abort (a fail) of a task took effect, no claim of the task
// returned before the fail's call plus its backoff, less tolerance (the
// clocks' spread the promise allows: the skew buffer). The backoff is
// decided on the leader's clock when the fail is applied, after its call;
// the next claim is granted on a leader's clock, before its return: with
// clocks within the bound, an earlier return is an early grant. A fail
// of unknown outcome (info) is checked only when a later claim shows it
// took effect (the next claim of the task after it). A Retry of the task
// (a new life, after a cancel) between the fail and the claim starts
// afresh: its claim is not checked.
func Retries(ops []*Op, tolerance time.Duration) Verdict {
	v := Verdict{Checker: "retries", Counts: map[string]int{}}
	claims := map[uint64][]*Op{} // task -> its ok claims, by claim id
	revived := map[uint64][]*Op{}
	for _, o := range ops {
		if o.F == "claim" && o.Type == "ok" && o.Task != 0 {
			claims[o.Task] = append(claims[o.Task], o)
		}
		if o.F == "retry" && o.Type != "fail" {
			revived[o.Task] = append(revived[o.Task], o)
		}
	}
	for _, cs := range claims {
		sort.Slice(cs, func(i, j int) bool { return cs[i].Claim < cs[j].Claim })
	}
	for _, f := range ops {
		if f.F != "fail" || f.Type == "fail" || f.BackoffMS <= 0 {
			continue
		}
		v.Counts["fails"]++
		// The claim after the failed one: the first with a greater id.
		cs := claims[f.Task]
		i := sort.Search(len(cs), func(i int) bool { return cs[i].Claim > f.Claim })
		if i == len(cs) {
			continue // never claimed again (dead, or the run ended)
		}
		next := cs[i]
		if slices.ContainsFunc(revived[f.Task], func(r *Op) bool { return r.Call < next.Return && r.Ret() > f.Call }) {
			v.Counts["revived"]++
			continue
		}
		v.Counts["retried"]++
		earliest := f.Call + f.BackoffMS*int64(time.Millisecond) - int64(tolerance)
		if next.Return < earliest {
			v.Counts["early"]++
			v.Addf("task %d: claim %d failed (call %.3fs, backoff %d ms), claim %d returned at %.3fs: %s early, beyond the %s tolerance",
				f.Task, f.Claim, float64(f.Call)/1e9, f.BackoffMS, next.Claim, float64(next.Return)/1e9,
				time.Duration(earliest-next.Return+int64(tolerance)).Round(time.Millisecond), tolerance)
		}
	}
	v.Valid = v.Counts["early"] == 0
	return v
}
