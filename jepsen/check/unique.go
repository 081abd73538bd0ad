package check

import (
	"slices"
	"strings"
)

// Unique checks unique keys (docs/SCHEDULING.md) from a history of the
// tasks of one queue whose enqueues all carry a key (Op.Key): enqueues
// (Task: the id answered, or the id an indeterminate one's WriteFailure
// named; Duplicate), claims, completes and cancels during the run, then
// a final read (F "final", R=3) of every task listed in the queue or
// named by an enqueue (Key: its key, Payload: its status; Type "fail"
// with Err "not_found..." when no replica has it).
//
//   - orphan: the final read finds a task no enqueue named: it was
//     created behind another answer (a duplicate's, say).
//   - wrong-key: an enqueue answered a task (created or duplicate) whose
//     key is not the enqueue's.
//   - lost: an enqueue answered "created" and no replica has the task.
//   - dangling: an enqueue answered a duplicate naming a task no replica
//     has and no indeterminate enqueue named (one whose write may have
//     failed: the holder the design lets a duplicate name).
//   - overlap: task Y was created (its enqueue answered "created", or a
//     Retry of it was acked: a new life) while task X of the same key
//     was surely live: X's creation was answered before Y's was called,
//     and no complete or cancel of X was called between X's creation
//     and Y's answer.
//   - live-at-end: the final read finds two tasks of one key not
//     finished.
func Unique(ops []Op) Verdict {
	v := Verdict{Checker: "unique", Counts: map[string]int{}}
	type fin struct {
		found    bool
		key      string
		status   string
		notFound bool
	}
	final := map[uint64]fin{}
	named := map[uint64]bool{}
	indeterminate := map[uint64]bool{}
	var ends []Op // completes and cancels, not definitely failed
	var creations []Op
	for _, o := range ops {
		switch {
		case o.F == "final" && o.Type == "ok":
			final[o.Task] = fin{found: true, key: o.Key, status: o.Payload}
		case o.F == "final" && o.Type == "fail" && strings.HasPrefix(o.Err, "not_found"):
			final[o.Task] = fin{notFound: true}
		case o.F == "enqueue" && o.Task != 0:
			named[o.Task] = true
			if o.Type != "ok" {
				indeterminate[o.Task] = true
			} else if !o.Duplicate {
				creations = append(creations, o)
			}
		case (o.F == "complete" || o.F == "cancel") && o.Type != "fail":
			ends = append(ends, o)
		case o.F == "retry" && o.Type == "ok":
			v.Counts["retried"]++
			creations = append(creations, o)
		}
	}
	for _, o := range ops {
		if o.F != "enqueue" || o.Type != "ok" {
			continue
		}
		v.Counts["enqueued"]++
		if o.Duplicate {
			v.Counts["duplicates"]++
		}
		f := final[o.Task]
		switch {
		case f.found && f.key != o.Key:
			v.Counts["wrong-key"]++
			v.Addf("an enqueue of key %q via %s at %.3fs answered task %d (duplicate %v), whose key is %q", o.Key, o.Node, seconds(o.Return), o.Task, o.Duplicate, f.key)
		case f.notFound && !o.Duplicate:
			v.Counts["lost"]++
			v.Addf("task %d of key %q, created by an enqueue via %s at %.3fs, is on no replica", o.Task, o.Key, o.Node, seconds(o.Return))
		case f.notFound && !indeterminate[o.Task]:
			v.Counts["dangling"]++
			v.Addf("an enqueue of key %q via %s at %.3fs answered the duplicate %d, on no replica and named by no failed enqueue", o.Key, o.Node, seconds(o.Return), o.Task)
		}
	}
	liveByKey := map[string][]uint64{}
	ids := make([]uint64, 0, len(final))
	for id := range final {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		f := final[id]
		if !f.found {
			continue
		}
		v.Counts["tasks"]++
		if !named[id] {
			v.Counts["orphan"]++
			v.Addf("task %d of key %q (%s) was created, and no enqueue answered or named it", id, f.key, f.status)
		}
		switch f.status {
		case "COMPLETED", "CANCELLED", "ABORTED", "DEAD":
		default:
			liveByKey[f.key] = append(liveByKey[f.key], id)
		}
	}
	for key, live := range liveByKey {
		if len(live) > 1 {
			v.Counts["live-at-end"]++
			v.Addf("key %q has %d tasks not finished at the end: %v", key, len(live), live)
		}
	}
	byKey := map[string][]Op{}
	for _, o := range creations {
		byKey[o.Key] = append(byKey[o.Key], o)
	}
	// ended reports whether a complete or cancel of task id was called
	// from from to to.
	ended := func(id uint64, from, to int64) bool {
		for _, e := range ends {
			if e.Task == id && e.Call >= from && e.Call < to {
				return true
			}
		}
		return false
	}
	for key, cs := range byKey {
		for _, x := range cs {
			for _, y := range cs {
				if x.Task == y.Task || x.Return >= y.Call || ended(x.Task, x.Call, y.Return) {
					continue
				}
				v.Counts["overlap"]++
				v.Addf("key %q: task %d was created by an enqueue via %s answered at %.3fs, while task %d (created at %.3fs) was live: no complete or cancel of it was called before",
					key, y.Task, y.Node, seconds(y.Return), x.Task, seconds(x.Return))
			}
		}
	}
	if v.Counts["enqueued"] == 0 {
		v.Skipped = "no enqueue with a unique key succeeded"
	}
	v.Valid = v.Counts["orphan"] == 0 && v.Counts["wrong-key"] == 0 && v.Counts["lost"] == 0 &&
		v.Counts["dangling"] == 0 && v.Counts["overlap"] == 0 && v.Counts["live-at-end"] == 0
	return v
}
