package check

import (
	"slices"
	"time"
)

// ScheduledTask is a task a schedule enqueued, as the final read found
// it: its id and its creation time (Unix ms: the tick's).
type ScheduledTask struct {
	ID        uint64
	CreatedMs int64
}

// Schedule checks a periodic schedule (docs/SCHEDULING.md) from the
// ticks it should have run (every tick from its creation to the last
// one it recorded, Unix ms), the tasks of its queue, and how many ticks
// it says it skipped (older than its catch-up window, or overlapping).
//
//   - twice: a tick with more than one task (a leader change or a retry
//     ran it again under another id).
//   - missing: more ticks without a task than the schedule says it
//     skipped.
//   - stray: a task whose creation time is no tick.
func Schedule(ticks []int64, tasks []ScheduledTask, skipped uint64) Verdict {
	v := Verdict{Checker: "schedule", Counts: map[string]int{"ticks": len(ticks), "tasks": len(tasks), "skipped": int(skipped)}}
	byTick := map[int64][]uint64{}
	for _, t := range tasks {
		byTick[t.CreatedMs] = append(byTick[t.CreatedMs], t.ID)
	}
	isTick := map[int64]bool{}
	for _, tick := range ticks {
		isTick[tick] = true
		switch ids := byTick[tick]; {
		case len(ids) > 1:
			v.Counts["twice"]++
			slices.Sort(ids)
			v.Addf("tick %s has %d tasks: %v", time.UnixMilli(tick).UTC().Format("15:04:05.000"), len(ids), ids)
		case len(ids) == 0:
			v.Counts["missing"]++
		}
	}
	if v.Counts["missing"] > int(skipped) {
		v.Addf("%d ticks have no task, and the schedule skipped %d", v.Counts["missing"], skipped)
	}
	for _, t := range tasks {
		if !isTick[t.CreatedMs] {
			v.Counts["stray"]++
			v.Addf("task %d was created at %d ms, no tick of the schedule", t.ID, t.CreatedMs)
		}
	}
	if len(ticks) == 0 {
		v.Skipped = "the schedule ran no tick"
	}
	v.Valid = v.Counts["twice"] == 0 && v.Counts["stray"] == 0 && v.Counts["missing"] <= int(skipped)
	return v
}
