package check

import "testing"

// Three claims held at once under a cap of 2 fail outside a fault window
// and pass within one that allows the overshoot; a claim ended (or whose
// lease ran out, or whose task was cancelled) before another began does
// not overlap it.
func TestCapCountsSurelyHeldClaims(t *testing.T) {
	claim := func(task, id uint64, call, ret int64) *Op {
		return &Op{F: "claim", Task: task, Claim: id, LeaseMS: 10_000, Type: "ok", Call: call, Return: ret}
	}
	ops := []*Op{
		claim(1, 10, 1*sec, 2*sec),
		claim(2, 20, 1*sec, 2*sec),
		claim(3, 30, 3*sec, 4*sec),
		{F: "complete", Task: 1, Claim: 10, Type: "ok", Call: 5 * sec, Return: 6 * sec},
	}
	if v := Cap(ops, 2, 0, nil); v.Valid || v.Counts["over"] != 1 || v.Counts["most_held"] != 3 {
		t.Fatalf("three held at once under a cap of 2 passed: %+v", v)
	}
	if v := Cap(ops, 2, 1, [][2]int64{{3 * sec, 5 * sec}}); !v.Valid || v.Counts["most_held_outside_faults"] != 2 {
		t.Fatalf("the overlap within a fault window allowing one more failed: %+v", v)
	}
	// Task 1 completed (its call) before task 3's claim answered.
	ops[3].Call, ops[3].Return = 3*sec+5e8, 3*sec+6e8
	if v := Cap(ops, 2, 0, nil); !v.Valid {
		t.Fatalf("a claim ended before the third began counted: %+v", v)
	}
	// Its lease ran out first instead (claimed at 1 s for 2 s).
	ops[3].Type = "fail"
	ops[0].LeaseMS = 2000
	if v := Cap(ops, 2, 0, nil); !v.Valid {
		t.Fatalf("a claim whose lease ended before the third began counted: %+v", v)
	}
	// A renew kept it: held again at 4 s.
	ops = append(ops, &Op{F: "renew", Task: 1, Claim: 10, LeaseMS: 2000, Type: "ok", Call: 2*sec + 5e8, Return: 2*sec + 6e8})
	if v := Cap(ops, 2, 0, nil); v.Valid {
		t.Fatalf("a renewed claim was not counted: %+v", v)
	}
	// A cancel of task 2 (acked or not) before the third claim ends it.
	cancel := &Op{F: "cancel", Task: 2, Type: "info", Call: 3 * sec, Return: 6 * sec}
	ops = append(ops, cancel)
	if v := Cap(ops, 2, 0, nil); !v.Valid {
		t.Fatalf("a claim whose task was cancelled counted: %+v", v)
	}
	// So does one called before task 2's claim answered: it may have
	// landed right after the grant.
	cancel.Call, cancel.Return = 1*sec+5e8, 2*sec+5e8
	if v := Cap(ops, 2, 0, nil); !v.Valid || v.Counts["claims"] != 2 {
		t.Fatalf("a claim whose task's cancel was under way counted: %+v", v)
	}
	cancel.Type = "fail" // refused: the task was not cancelled
	if v := Cap(ops, 2, 0, nil); v.Valid {
		t.Fatalf("a refused cancel ended a claim: %+v", v)
	}
}
