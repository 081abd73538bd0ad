package check

import (
	"strings"
	"testing"
	"time"
)

const sec = int64(time.Second)

// Hand-made histories: each checker must flag its anomaly and accept the
// legal variant. These run without root, in `make test`.

func TestLinearizableCatchesDoubleClaim(t *testing.T) {
	ops := []*Op{
		{Process: 0, F: "claim", Task: 7, Claim: 10, Long: true, Type: "ok", Call: 1 * sec, Return: 2 * sec},
		{Process: 1, F: "claim", Task: 7, Claim: 12, Long: true, Type: "ok", Call: 3 * sec, Return: 4 * sec},
	}
	if v := Linearizable(ops, 3, 10*time.Second, t.TempDir()); v.Valid {
		t.Fatalf("two live long claims of one task passed: %+v", v)
	}
	// After a yield the second claim is legal.
	ops = append(ops[:1], &Op{Process: 0, F: "yield", Task: 7, Claim: 10, Type: "ok", Call: 2 * sec, Return: 3 * sec}, ops[1])
	ops[2].Call, ops[2].Return = 4*sec, 5*sec
	if v := Linearizable(ops, 3, 10*time.Second, ""); !v.Valid {
		t.Fatalf("claim, yield, claim failed: %+v", v)
	}
}

func TestLinearizableCatchesRenewOfSupersededClaim(t *testing.T) {
	ops := []*Op{
		{Process: 0, F: "claim", Task: 7, Claim: 10, Type: "ok", Call: 1 * sec, Return: 2 * sec}, // short: may expire
		{Process: 1, F: "claim", Task: 7, Claim: 12, Type: "ok", Call: 6 * sec, Return: 7 * sec},
		{Process: 0, F: "renew", Task: 7, Claim: 10, Type: "ok", Call: 8 * sec, Return: 9 * sec},
	}
	if v := Linearizable(ops, 3, 10*time.Second, ""); v.Valid {
		t.Fatal("a renew of a superseded claim passed")
	}
	ops[2].Type = "fail"
	if v := Linearizable(ops, 3, 10*time.Second, ""); !v.Valid {
		t.Fatalf("legal history failed: %+v", v)
	}
	// Claim ids go up.
	ops[1].Claim = 9
	if v := Linearizable(ops, 3, 10*time.Second, ""); v.Valid {
		t.Fatal("a decreasing claim id passed")
	}
}

func TestExclusionCatchesOverlap(t *testing.T) {
	ops := []*Op{
		{F: "claim", Task: 7, Claim: 10, LeaseMS: 2500, Type: "ok", Call: 1 * sec, Return: 2 * sec},
		{F: "renew", Task: 7, Claim: 10, LeaseMS: 2500, Type: "ok", Call: 3 * sec, Return: 3*sec + 1},
		{F: "claim", Task: 7, Claim: 12, LeaseMS: 2500, Type: "ok", Call: 4 * sec, Return: 5 * sec},
	}
	v := Exclusion(ops)
	if v.Valid || v.Counts["overlaps"] != 1 {
		t.Fatalf("overlap of 0.5 s not caught: %+v", v)
	}
	ops[2].Call, ops[2].Return = 6*sec, 7*sec
	if v := Exclusion(ops); !v.Valid {
		t.Fatalf("claims after the lease flagged: %+v", v)
	}
}

// A renew acked while a cancel ran was decided before the cancel: the
// claim ended by the cancel's ack, and a claim after a Retry is no
// overlap (seed 66278). A renew called after the ack that succeeds is
// the claim still live (the cancel had not reached its leader).
func TestExclusionCancelDuringRenew(t *testing.T) {
	ms := sec / 1000
	ops := []*Op{
		{F: "claim", Task: 7, Claim: 10, LeaseMS: 2500, Type: "ok", Call: 2014 * ms, Return: 2020 * ms},
		{F: "cancel", Task: 7, W: 3, Type: "ok", Call: 2090 * ms, Return: 2098 * ms},
		{F: "renew", Task: 7, Claim: 10, LeaseMS: 2500, Type: "ok", Call: 2091 * ms, Return: 2097 * ms},
		{F: "retry", Task: 7, Type: "ok", Call: 2146 * ms, Return: 2150 * ms},
		{F: "claim", Task: 7, Claim: 26, LeaseMS: 2500, Type: "ok", Call: 2137 * ms, Return: 2160 * ms},
	}
	if v := Exclusion(ops); !v.Valid {
		t.Fatalf("a renew concurrent with the cancel: %+v", v)
	}
	ops[2].Call, ops[2].Return = 2100*ms, 2101*ms
	if v := Exclusion(ops); v.Valid {
		t.Fatalf("a renew acked after the cancel's ack, then another claim within its lease: %+v", v)
	}
}

func TestTerminalAndQueue(t *testing.T) {
	ops := []*Op{
		{F: "enqueue", Task: 7, Payload: "a", Type: "ok", Call: 0, Return: 1},
		{F: "enqueue", Task: 8, Payload: "b", Type: "ok", Call: 0, Return: 1},
		{F: "cancel", Task: 7, W: 3, Type: "ok", Call: 1 * sec, Return: 2 * sec},
		{F: "claim", Task: 7, Claim: 4, Payload: "a", Type: "ok", Call: 3 * sec, Return: 4 * sec},
		{F: "claim", Task: 9, Claim: 5, Payload: "zzz", Type: "ok", Call: 3 * sec, Return: 4 * sec},
	}
	if v := Terminal(ops, 3); v.Valid {
		t.Fatal("a claim after a W=N cancel passed")
	}
	v := Queue(ops, map[uint64]string{8: "TASK_STATUS_READY"})
	if v.Valid || v.Counts["lost"] != 1 || v.Counts["unexpected"] != 1 {
		t.Fatalf("lost and unexpected not both caught: %+v", v)
	}
	ops = append(ops[:2], &Op{F: "read", Task: 8, Type: "fail", Err: "not_found: task 8", Call: 2 * sec, Return: 3 * sec})
	v = Queue(ops, map[uint64]string{7: "TASK_STATUS_CANCELLED", 8: "TASK_STATUS_READY"})
	if v.Valid || v.Counts["acked-read-not-found"] != 1 {
		t.Fatalf("an acked task read as not found not caught: %+v", v)
	}
}

// TestReportOnlyStatus: a reported checker's failure reads "reported".
func TestReportOnlyStatus(t *testing.T) {
	v := Verdict{Checker: "exclusion", ReportOnly: true}
	if v.Status() != "reported" {
		t.Fatalf("status %q", v.Status())
	}
	v.Valid = true
	if v.Status() != "pass" {
		t.Fatalf("status %q", v.Status())
	}
}

func TestCountsProblems(t *testing.T) {
	ops := []*Op{
		{F: "enqueue", Type: "ok", Task: 1, Payload: "a"},
		{F: "enqueue", Type: "ok", Task: 2, Payload: "b"},
		{F: "enqueue", Type: "info", Payload: "c"},
		{F: "enqueue", Type: "fail", Payload: "d"},
		{F: "complete", Type: "ok", Task: 1},
	}
	replicas := func(n2 map[string]uint64) map[uint32]map[string]map[string]uint64 {
		return map[uint32]map[string]map[string]uint64{
			0: {"n1": {"COMPLETED": 1}, "n2": {"COMPLETED": 1}},
			1: {"n1": {"READY": 1}, "n2": n2},
		}
	}
	good := CountsObservation{Replicas: replicas(map[string]uint64{"READY": 1}),
		Counted: map[string]uint64{"COMPLETED": 1, "READY": 1}, Listed: map[string]uint64{"COMPLETED": 1, "READY": 1}}
	if p := CountsProblems(ops, good); len(p) != 0 {
		t.Fatalf("a good observation: %v", p)
	}
	withInfo := good
	withInfo.Counted = map[string]uint64{"COMPLETED": 1, "READY": 2}
	withInfo.Listed = withInfo.Counted
	if p := CountsProblems(ops, withInfo); len(p) != 0 {
		t.Fatalf("an indeterminate enqueue that took effect: %v", p)
	}
	for name, c := range map[string]struct {
		obs  CountsObservation
		want string
	}{
		"replicas differ": {CountsObservation{Replicas: replicas(map[string]uint64{"CLAIMED": 1}), Counted: good.Counted, Listed: good.Listed}, "replicas count differently"},
		"counters drift":  {CountsObservation{Replicas: good.Replicas, Counted: map[string]uint64{"COMPLETED": 1, "CLAIMED": 1}, Listed: good.Listed}, "CountTasks"},
		"acked missing":   {CountsObservation{Replicas: good.Replicas, Counted: map[string]uint64{"COMPLETED": 1}, Listed: map[string]uint64{"COMPLETED": 1}}, "2 enqueues acknowledged"},
		"never enqueued":  {CountsObservation{Replicas: good.Replicas, Counted: map[string]uint64{"COMPLETED": 1, "READY": 3}, Listed: map[string]uint64{"COMPLETED": 1, "READY": 3}}, "only 3 enqueues attempted"},
		"end not counted": {CountsObservation{Replicas: good.Replicas, Counted: map[string]uint64{"READY": 2}, Listed: map[string]uint64{"READY": 2}}, "counted as ended"},
	} {
		p := CountsProblems(ops, c.obs)
		if len(p) != 1 || !strings.Contains(p[0], c.want) {
			t.Errorf("%s: problems %q, want one with %q", name, p, c.want)
		}
	}
}

// TestLinearizableCatchesSupersededComplete: a complete acked under a
// claim that a later claim superseded breaks the fence (DESIGN 7.3a);
// refused, the history is legal. A retry of the complete that took effect
// may be acked again; another claim's complete of the finished task may
// not.
func TestLinearizableCatchesSupersededComplete(t *testing.T) {
	ops := []*Op{
		{Process: 0, F: "claim", Task: 7, Claim: 10, Type: "ok", Call: 1 * sec, Return: 2 * sec}, // short: may expire
		{Process: 1, F: "claim", Task: 7, Claim: 12, Long: true, Type: "ok", Call: 6 * sec, Return: 7 * sec},
		{Process: 0, F: "complete", Task: 7, Claim: 10, W: 1, Type: "ok", Call: 8 * sec, Return: 9 * sec},
	}
	if v := Linearizable(ops, 3, 10*time.Second, ""); v.Valid {
		t.Fatal("a complete under a superseded claim passed")
	}
	ops[2].Type = "fail"
	if v := Linearizable(ops, 3, 10*time.Second, ""); !v.Valid {
		t.Fatalf("the refused complete failed: %+v", v)
	}
	ops = append(ops,
		&Op{Process: 1, F: "complete", Task: 7, Claim: 12, W: 2, Type: "info", Call: 10 * sec, Return: 11 * sec},
		&Op{Process: 2, F: "complete", Task: 7, Claim: 12, W: 2, Type: "ok", Call: 12 * sec, Return: 13 * sec})
	if v := Linearizable(ops, 3, 10*time.Second, ""); !v.Valid {
		t.Fatalf("a retried complete failed: %+v", v)
	}
	ops = append(ops, &Op{Process: 0, F: "complete", Task: 7, Claim: 10, W: 3, Type: "ok", Call: 14 * sec, Return: 15 * sec})
	if v := Linearizable(ops, 3, 10*time.Second, ""); v.Valid {
		t.Fatal("another claim's complete of a completed task passed")
	}
}

// TestTerminalCountsEveryAckedComplete: a claim after a complete acked
// with w=2 (of 3) fails terminal-stable: the group decides a complete.
func TestTerminalCountsEveryAckedComplete(t *testing.T) {
	ops := []*Op{
		{F: "claim", Task: 7, Claim: 4, Type: "ok", Call: 0, Return: 1 * sec},
		{F: "complete", Task: 7, Claim: 4, W: 2, Type: "ok", Call: 1 * sec, Return: 2 * sec},
		{F: "claim", Task: 7, Claim: 9, Type: "ok", Call: 3 * sec, Return: 4 * sec},
	}
	if v := Terminal(ops, 3); v.Valid {
		t.Fatal("a claim after a w=2 complete passed")
	}
	// A cancel below w = N may not have reached the leader.
	ops[1] = &Op{F: "cancel", Task: 7, W: 2, Type: "ok", Call: 1 * sec, Return: 2 * sec}
	if v := Terminal(ops, 3); !v.Valid {
		t.Fatalf("a claim after a w=2 cancel failed: %+v", v)
	}
}
