package check

import (
	"testing"
	"time"
)

// A claim or complete called past a task's deadline plus the tolerance
// that took effect fails the checker; one called before passes; a task
// whose deadline passed and that has not ended at its final read fails.
func TestDeadlinesCatchesLateOps(t *testing.T) {
	ops := []*Op{
		{Process: 0, F: "enqueue", Task: 7, Type: "ok", Call: 0, Return: 1e8, Deadline: 2 * sec},
		{Process: 0, F: "enqueue", Task: 8, Type: "ok", Call: 0, Return: 1e8},
		{Process: 1, F: "claim", Task: 7, Claim: 10, Long: true, Type: "ok", Call: 1 * sec, Return: 1*sec + 1e7},
		{Process: 1, F: "renew", Task: 7, Claim: 10, Type: "ok", Call: 1*sec + 2e7, Return: 1*sec + 3e7},
		{Process: 1, F: "complete", Task: 7, Claim: 10, Type: "ok", Call: 2*sec + 1e8, Return: 2*sec + 2e8},
		{Process: 2, F: "claim", Task: 8, Claim: 11, Type: "ok", Call: 9 * sec, Return: 9*sec + 1e7},
	}
	final := map[uint64]string{7: "TASK_STATUS_COMPLETED"}
	v := Deadlines(ops, final, 20*sec, 50*time.Millisecond, 5*time.Second)
	if v.Valid || v.Counts["complete-past-deadline"] != 1 {
		t.Fatalf("a complete 100 ms past the deadline passed: %+v", v)
	}
	if v := Deadlines(ops, final, 20*sec, 2*time.Second, 5*time.Second); !v.Valid || v.Counts["completed-in-time"] != 1 {
		t.Fatalf("a complete within the tolerance failed: %+v", v)
	}
	ops[2].Call = 2*sec + 5e7
	if v := Deadlines(ops, final, 20*sec, 50*time.Millisecond, 5*time.Second); v.Counts["claim-past-deadline"] != 1 {
		t.Fatalf("a claim at the deadline plus the tolerance passed: %+v", v)
	}
	ops[2].Call, ops[4].Type = 1*sec, "fail"
	for st, valid := range map[string]bool{"TASK_STATUS_CANCELLED": true, "TASK_STATUS_CLAIMED": false, "TASK_STATUS_READY": false} {
		final[7] = st
		if v := Deadlines(ops, final, 20*sec, 50*time.Millisecond, 5*time.Second); v.Valid != valid {
			t.Fatalf("final %s: %+v, want valid %v", st, v, valid)
		}
	}
	// Read before the deadline had settled: not judged.
	final[7] = "TASK_STATUS_CLAIMED"
	if v := Deadlines(ops, final, 6*sec, 50*time.Millisecond, 5*time.Second); !v.Valid || v.Counts["read"] != 0 {
		t.Fatalf("a final read within the settle time was judged: %+v", v)
	}
}

// The model lets a long claim's renew fail once its task's deadline is
// near (the leader cancels it), and not before.
func TestLinearizableDeadline(t *testing.T) {
	ops := []*Op{
		{Process: 0, F: "enqueue", Task: 7, Type: "ok", Call: 0, Return: 1e8, Deadline: 10 * sec},
		{Process: 1, F: "claim", Task: 7, Claim: 10, Long: true, Type: "ok", Call: 1 * sec, Return: 1*sec + 1e7},
		{Process: 1, F: "renew", Task: 7, Claim: 10, Type: "fail", Call: 10 * sec, Return: 10*sec + 1e7},
	}
	if v := Linearizable(ops, 3, 10*time.Second, ""); !v.Valid {
		t.Fatalf("a renew failed at the deadline: %+v", v)
	}
	ops[2].Call, ops[2].Return = 2*sec, 2*sec+1e7
	if v := Linearizable(ops, 3, 10*time.Second, ""); v.Valid {
		t.Fatalf("a renew of a long claim failed 8 s before the deadline, and the model took it: %+v", v)
	}
}
