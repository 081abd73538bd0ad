package check

import (
	"testing"
	"time"
)

// The priority checker flags a claim that took a lower priority while a
// higher one had been claimable for the settle time and was still
// unclaimed, and accepts the legal variants: the higher one taken by a
// concurrent claim, acked too recently, or possibly held by a claim of
// unknown outcome.
func TestPriorityCatchesPassedOverTask(t *testing.T) {
	const settle = 500 * time.Millisecond
	history := func() []*Op {
		return []*Op{
			{F: "enqueue", Task: 1, Priority: 0, Type: "ok", Call: 0, Return: sec / 10},
			{F: "enqueue", Task: 2, Priority: 3, Type: "ok", Call: 0, Return: sec / 10},
			{F: "claim", Task: 1, Priority: 0, Client: 1, Type: "ok", Call: 2 * sec, Return: 2*sec + sec/10},
			{F: "claim", Task: 2, Priority: 3, Client: 2, Type: "ok", Call: 3 * sec, Return: 3*sec + sec/10},
		}
	}
	if v := Priority(history(), settle); v.Valid || v.Counts["passed-over"] != 1 {
		t.Fatalf("a claim of priority 0 while a task of priority 3 waited passed: %+v", v)
	}
	// Taken by a claim called before this one returned: concurrent, legal.
	ops := history()
	ops[3].Call = 2*sec + sec/20
	if v := Priority(ops, settle); !v.Valid {
		t.Fatalf("a concurrent claim of the higher task failed: %+v", v)
	}
	// Acked less than settle before the claim: within the bound.
	ops = history()
	ops[1].Return = 2*sec - int64(settle)/2
	if v := Priority(ops, settle); !v.Valid {
		t.Fatalf("a task acked within the settle time failed: %+v", v)
	}
	// A claim of unknown outcome may hold it.
	ops = append(history(), &Op{F: "claim", Client: 3, Type: "info", Call: sec, Return: -1})
	if v := Priority(ops, settle); !v.Valid || v.Counts["unknown"] != 1 {
		t.Fatalf("a task a claim of unknown outcome may hold failed: %+v", v)
	}
	// Cancelled before: not claimable.
	ops = append(history(), &Op{F: "cancel", Task: 2, Type: "ok", Call: sec, Return: sec + 1})
	if v := Priority(ops, settle); !v.Valid {
		t.Fatalf("a cancelled task failed: %+v", v)
	}
	// The drain's claims are not checked.
	ops = history()
	ops[2].Drain = true
	if v := Priority(ops, settle); !v.Valid {
		t.Fatalf("a drain claim failed: %+v", v)
	}
}
