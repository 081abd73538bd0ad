package check

import (
	"testing"
	"time"
)

// A claim after a fail must wait the backoff, less the tolerance.
func TestRetriesCatchesEarlyClaim(t *testing.T) {
	ops := []*Op{
		{Process: 0, F: "claim", Task: 7, Claim: 10, Long: true, Type: "ok", Call: 1 * sec, Return: 2 * sec},
		{Process: 0, F: "fail", Task: 7, Claim: 10, BackoffMS: 3500, Type: "ok", Call: 3 * sec, Return: 3*sec + 1},
		{Process: 1, F: "claim", Task: 7, Claim: 12, Long: true, Type: "ok", Call: 3 * sec, Return: 3*sec + 5e8},
	}
	v := Retries(ops, 2*time.Second)
	if v.Valid || v.Counts["early"] != 1 {
		t.Fatalf("a claim 0.5 s after a fail with a 3.5 s backoff passed: %+v", v)
	}
	// The linearizability model takes it (the backoff is not its part).
	if v := Linearizable(ops, 3, 10*time.Second, ""); !v.Valid {
		t.Fatalf("claim, fail, claim not linearizable: %+v", v)
	}
	// A Retry (a new life, after a cancel) in between starts afresh.
	revived := append(ops[:2:2], &Op{Process: 2, F: "retry", Task: 7, Type: "ok", Call: 3*sec + 1e8, Return: 3*sec + 2e8}, ops[2])
	if v := Retries(revived, 2*time.Second); !v.Valid || v.Counts["revived"] != 1 {
		t.Fatalf("a claim after a fail and a Retry: %+v", v)
	}
	ops[2].Call, ops[2].Return = 4*sec+6e8, 4*sec+7e8 // within the tolerance
	if v := Retries(ops, 2*time.Second); !v.Valid || v.Counts["retried"] != 1 {
		t.Fatalf("a claim within the tolerance failed: %+v", v)
	}
}

// A fail is fenced: one under a claim that is not live is illegal; after
// a fail the task may be claimed again or be dead (the model cannot tell),
// and a retry of the fail is acked again.
func TestLinearizableFail(t *testing.T) {
	ops := []*Op{
		{Process: 0, F: "claim", Task: 7, Claim: 10, Long: true, Type: "ok", Call: 1 * sec, Return: 2 * sec},
		{Process: 0, F: "fail", Task: 7, Claim: 10, Type: "ok", Call: 3 * sec, Return: 4 * sec},
		{Process: 0, F: "fail", Task: 7, Claim: 10, Type: "ok", Call: 5 * sec, Return: 6 * sec},
	}
	if v := Linearizable(ops, 3, 10*time.Second, ""); !v.Valid {
		t.Fatalf("a fail and its retry: %+v", v)
	}
	// A complete of the failed claim is illegal.
	ops[2].F = "complete"
	if v := Linearizable(ops, 3, 10*time.Second, ""); v.Valid {
		t.Fatal("a complete after the claim's fail passed")
	}
	// A fail of a superseded claim is illegal.
	ops = []*Op{
		{Process: 0, F: "claim", Task: 7, Claim: 10, Long: true, Type: "ok", Call: 1 * sec, Return: 2 * sec},
		{Process: 0, F: "yield", Task: 7, Claim: 10, Type: "ok", Call: 2 * sec, Return: 3 * sec},
		{Process: 1, F: "claim", Task: 7, Claim: 12, Long: true, Type: "ok", Call: 3 * sec, Return: 4 * sec},
		{Process: 0, F: "fail", Task: 7, Claim: 10, Type: "ok", Call: 5 * sec, Return: 6 * sec},
	}
	if v := Linearizable(ops, 3, 10*time.Second, ""); v.Valid {
		t.Fatal("a fail of a superseded claim passed")
	}
}

// A Retry of a cancelled task is legal and makes it claimable again; one
// of a completed task is not, and the claim after it breaks terminal
// stability.
func TestRetryOfTerminalTasks(t *testing.T) {
	ops := []*Op{
		{Process: 0, F: "claim", Task: 7, Claim: 10, LeaseMS: 2500, Type: "ok", Call: 1 * sec, Return: 2 * sec},
		{Process: 1, F: "cancel", Task: 7, W: 3, Type: "ok", Call: 2 * sec, Return: 3 * sec},
		{Process: 1, F: "retry", Task: 7, Type: "ok", Call: 3 * sec, Return: 4 * sec},
		{Process: 2, F: "claim", Task: 7, Claim: 14, LeaseMS: 2500, Type: "ok", Call: 4 * sec, Return: 5 * sec},
	}
	for _, v := range []Verdict{Linearizable(ops, 3, 10*time.Second, ""), Terminal(ops, 3), Exclusion(ops)} {
		if !v.Valid {
			t.Fatalf("claim, cancel, retry, claim: %+v", v)
		}
	}
	ops[1].F, ops[1].Claim, ops[1].W = "complete", 10, 2
	if v := Linearizable(ops, 3, 10*time.Second, ""); v.Valid {
		t.Fatal("a retry of a completed task passed")
	}
	if v := Terminal(ops, 3); v.Valid {
		t.Fatal("a claim after a complete and a retry passed")
	}
	// Refused (the clean build): the task stays completed.
	ops[2].Type = "fail"
	ops = ops[:3]
	if v := Linearizable(ops, 3, 10*time.Second, ""); !v.Valid {
		t.Fatalf("a refused retry of a completed task: %+v", v)
	}
}
