package check

import (
	"fmt"
	"sort"
	"time"
)

// FairLight is the fairness key of the light tenant's tasks.
const FairLight = "light"

// Fairness checks fair claims (docs/SCHEDULING.md, "Fair claims") from
// the history of one queue with two tenants of weight 1: a heavy one
// whose backlog of ready tasks never runs dry, and a light one that
// enqueues a task now and then (op "enqueue", Key FairLight, W=3: acked
// when every replica has it); clients claim one task at a time, all
// through one node (op "claim", Key the task's key, ok with its Task).
//
// For each light task whose enqueue was acked at a and whose claim was
// called at c, outside every fault window ([a, c] meets none), it counts
// the heavy claims that surely came after the task was claimable at that
// node and before its claim: called after a + visible (the node's view
// of the other leaders' heads may be that old) and answered before c.
// More than bound fails (the promise: with K keys of weight 1 a key waits
// at most K-1 claims of others, plus one per other concurrent client and
// per claim already picking). A light task acked more than settle before
// the last claim and never claimed outside the windows fails too
// (unclaimed).
//
// Counts: light (acked), judged, heavy-claims, light-claims,
// most-waited (the most heavy claims a judged light task waited), over,
// unclaimed.
func Fairness(ops []Op, windows [][2]int64, visible time.Duration, bound int, settle time.Duration) Verdict {
	v := Verdict{Checker: "fairness", Counts: map[string]int{}}
	claimedAt := map[uint64]int64{}
	var heavy []Op // heavy claims answered, by call
	var lastClaim int64
	for _, o := range ops {
		if o.F != "claim" || o.Type != "ok" || o.Task == 0 {
			continue
		}
		lastClaim = max(lastClaim, o.Return)
		if o.Key == FairLight {
			v.Counts["light-claims"]++
			if c, ok := claimedAt[o.Task]; !ok || o.Call < c {
				claimedAt[o.Task] = o.Call
			}
			continue
		}
		v.Counts["heavy-claims"]++
		heavy = append(heavy, o)
	}
	sort.Slice(heavy, func(i, j int) bool { return heavy[i].Call < heavy[j].Call })
	inWindow := func(from, to int64) bool {
		for _, w := range windows {
			if from < w[1] && w[0] < to {
				return true
			}
		}
		return false
	}
	for _, o := range ops {
		if o.F != "enqueue" || o.Key != FairLight || o.Type != "ok" {
			continue
		}
		v.Counts["light"]++
		a := o.Return
		c, claimed := claimedAt[o.Task]
		if !claimed {
			if a+int64(settle) < lastClaim && !inWindow(a, lastClaim) {
				v.Counts["unclaimed"]++
				v.Addf("light task %d acked at %.3fs, never claimed (claims went on to %.3fs)", o.Task, secs(a), secs(lastClaim))
			}
			continue
		}
		if inWindow(a, c) {
			continue
		}
		v.Counts["judged"]++
		from := a + int64(visible)
		i := sort.Search(len(heavy), func(i int) bool { return heavy[i].Call >= from })
		waited := 0
		for ; i < len(heavy) && heavy[i].Call < c; i++ {
			if heavy[i].Return <= c {
				waited++
			}
		}
		v.Counts["most-waited"] = max(v.Counts["most-waited"], waited)
		if waited > bound {
			v.Counts["over"]++
			v.Addf("light task %d acked at %.3fs, claim called at %.3fs: %d heavy claims called %s after the ack and answered before, want at most %d",
				o.Task, secs(a), secs(c), waited, visible, bound)
		}
	}
	v.Valid = v.Counts["over"] == 0 && v.Counts["unclaimed"] == 0
	if v.Counts["judged"] < minFairJudged {
		v.Valid = false
		v.Addf("%s", fmt.Sprintf("only %d light tasks judged outside the fault windows, want at least %d", v.Counts["judged"], minFairJudged))
	}
	return v
}

// minFairJudged is the fewest light tasks a run must judge: a run that
// judged none proved nothing.
const minFairJudged = 3

func secs(ns int64) float64 { return float64(ns) / 1e9 }
