package storage

import (
	"math"
	"slices"
	"testing"
)

// Scanning backwards pages through the same tasks as forwards, newest
// first, from any id on (the ids at or below it).
func TestScanBackIsScanReversed(t *testing.T) {
	s, _ := memStore(t)
	var all, inQ []uint64
	for id := uint64(1); id <= 50; id++ {
		q := "q"
		if id%3 == 0 {
			q = "other"
		}
		mustMerge(t, s, 0, newTask(id*7, q, int32(id%2)))
		all = append(all, id*7)
		if q == "q" {
			inQ = append(inQ, id*7)
		}
	}
	slices.Reverse(all)
	slices.Reverse(inQ)
	collect := func(scan func(from uint64, limit int) ([]*StoredTask, uint64, bool, error), from uint64) []uint64 {
		t.Helper()
		var got []uint64
		for {
			tasks, next, more, err := scan(from, 4)
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range tasks {
				got = append(got, st.Task.ID)
			}
			if !more {
				return got
			}
			from = next
		}
	}
	queueBack := func(from uint64, limit int) ([]*StoredTask, uint64, bool, error) {
		return s.ScanQueueBack(0, "q", from, limit)
	}
	tasksBack := func(from uint64, limit int) ([]*StoredTask, uint64, bool, error) {
		return s.ScanTasksBack(0, from, limit)
	}
	if got := collect(queueBack, math.MaxUint64); !slices.Equal(got, inQ) {
		t.Fatalf("queue backwards %v, want %v", got, inQ)
	}
	if got := collect(tasksBack, math.MaxUint64); !slices.Equal(got, all) {
		t.Fatalf("tasks backwards %v, want %v", got, all)
	}
	// From an id on: that id and the older ones.
	if got := collect(queueBack, 70); !slices.Equal(got, []uint64{70, 56, 49, 35, 28, 14, 7}) {
		t.Fatalf("queue backwards from 70: %v", got)
	}
	if got := collect(tasksBack, 20); !slices.Equal(got, []uint64{14, 7}) {
		t.Fatalf("tasks backwards from 20: %v", got)
	}
	if got := collect(tasksBack, 6); len(got) != 0 {
		t.Fatalf("tasks backwards from below the oldest: %v", got)
	}
}
