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
