package claims

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/testhooks"
)

// applyAll applies cmd as memFSM.apply does and returns the changes too.
func (m *memFSM) applyAll(t testing.TB, cmd Command) ([]Outcome, []Change) {
	t.Helper()
	m.index++
	dec, err := DecodeCommand(cmd.Encode())
	if err != nil {
		t.Fatalf("decode(encode(%+v)): %v", cmd, err)
	}
	outs, changes, err := ApplyWithBugs(m.index, dec, m.get, m.bugs)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range changes {
		if c.Record == nil {
			delete(m.recs, c.ID)
			continue
		}
		m.recs[c.ID] = c.Record.Encode()
	}
	return outs, changes
}

func retryClaim(now int64, id uint64, p *crdt.RetryPolicy) Command {
	return Command{Op: OpClaim, NowMs: now, Worker: "w", LeaseMs: 100, Candidates: []Candidate{{ID: id, Retry: p}}}
}

func failAct(now int64, id, token uint64, p *crdt.RetryPolicy) Command {
	state := (&crdt.Task{ID: id, Failures: []crdt.Failure{{Claim: token, Errors: []crdt.TaskError{{Code: "boom"}}}}}).Encode()
	return Command{Op: OpAct, NowMs: now, Acts: []Act{{ID: id, Token: token, End: EndFailed, State: state, Retry: p}}}
}

// A retryable abort ends the claim, counts the attempt and delays the
// task by its backoff, all in one entry; no claim is granted before the
// backoff ends; the attempt that reaches max_attempts makes the task dead
// with its DEAD event merged in the same entry; a retried act is repeated.
func TestRetryBackoffAndDeath(t *testing.T) {
	p := &crdt.RetryPolicy{MaxAttempts: 3, InitialMs: 1000, MaxMs: 10_000, MultiplierMilli: 2000}
	m := newMemFSM()
	outs, _ := m.applyAll(t, retryClaim(0, 1, p))
	tok := outs[0].Claim.Token
	outs, changes := m.applyAll(t, failAct(10, 1, tok, nil))
	if outs[0].Err != nil || outs[0].Claim.End != EndFailed || outs[0].Dead {
		t.Fatalf("first failure: %+v", outs[0])
	}
	if len(changes) != 1 || !changes[0].Released || changes[0].DelayUntilMs != 1010 || len(changes[0].Merges) != 1 {
		t.Fatalf("first failure's change: %+v", changes)
	}
	r := m.rec(t, 1)
	if r.Failed != 1 || r.RetryAtMs != 1010 || !reflect.DeepEqual(r.Retry, p) || r.Done() {
		t.Fatalf("record after the first failure: %+v", r)
	}
	// The same act again (a lost answer's retry) changes nothing.
	if outs, changes = m.applyAll(t, failAct(20, 1, tok, nil)); !outs[0].Repeated || len(changes) > 1 || (len(changes) == 1 && (changes[0].Merges != nil || changes[0].Released)) {
		t.Fatalf("repeated failure: %+v %+v", outs, changes)
	}
	if outs, _ = m.applyAll(t, retryClaim(1009, 1, p)); !errors.Is(outs[0].Err, ErrNotYet) {
		t.Fatalf("claim before the backoff ends: %+v", outs)
	}
	outs, _ = m.applyAll(t, retryClaim(1010, 1, p))
	if outs[0].Err != nil {
		t.Fatalf("claim at the backoff's end: %+v", outs)
	}
	// The second attempt expires: a failed attempt too, twice the wait.
	tok = outs[0].Claim.Token
	outs, changes = m.applyAll(t, Command{Op: OpExpire, NowMs: 2000, ID: 1, Token: tok})
	if outs[0].Err != nil || outs[0].Claim.End != EndExpired || changes[0].DelayUntilMs != 4000 {
		t.Fatalf("expiry: %+v %+v", outs, changes)
	}
	if f, err := crdt.Decode(changes[0].Merges[0]); err != nil || !reflect.DeepEqual(f, ExpiryFailure(1, tok, 2000)) {
		t.Fatalf("expiry's failure: %+v, %v", f, err)
	}
	if r := m.rec(t, 1); r.Expired != 1 || r.FailedAttempts() != 2 || r.RetryAtMs != 4000 {
		t.Fatalf("record after the expiry: %+v", r)
	}
	outs, _ = m.applyAll(t, retryClaim(4000, 1, p))
	tok = outs[0].Claim.Token
	// The third failure is the last allowed: dead, with its DEAD event.
	outs, changes = m.applyAll(t, failAct(4100, 1, tok, nil))
	if outs[0].Err != nil || !outs[0].Dead || outs[0].Died == nil || changes[0].DelayUntilMs != 0 || len(changes[0].Merges) != 2 {
		t.Fatalf("last failure: %+v %+v", outs, changes)
	}
	if !bytes.Equal(changes[0].Merges[1], DeadEvent(1, tok, 0, 4100, 3).Encode()) {
		t.Fatalf("DEAD event merged: %x", changes[0].Merges[1])
	}
	if r := m.rec(t, 1); !r.Dead || !r.Done() {
		t.Fatalf("record after the last failure: %+v", r)
	}
	if outs, _ = m.applyAll(t, retryClaim(99_999, 1, p)); !errors.Is(outs[0].Err, ErrTaskTerminal) {
		t.Fatalf("claim of a dead task: %+v", outs)
	}
}

// A task without a policy takes the act's (the server's default) at its
// first failure, and keeps it; without any, a failure makes it claimable
// at once and an expiry counts against max_claims as before retries.
func TestRetryPolicyFromAct(t *testing.T) {
	p := &crdt.RetryPolicy{MaxAttempts: 2, InitialMs: 50, MaxMs: 50, MultiplierMilli: 1000}
	m := newMemFSM()
	outs, _ := m.applyAll(t, retryClaim(0, 1, nil))
	outs, changes := m.applyAll(t, failAct(10, 1, outs[0].Claim.Token, p))
	if outs[0].Err != nil || changes[0].DelayUntilMs != 60 || !reflect.DeepEqual(m.rec(t, 1).Retry, p) {
		t.Fatalf("failure under the act's policy: %+v %+v %+v", outs, changes, m.rec(t, 1))
	}
	other := &crdt.RetryPolicy{MaxAttempts: 9, MaxMs: 0, MultiplierMilli: 1000}
	outs, _ = m.applyAll(t, retryClaim(60, 1, nil))
	if outs, _ = m.applyAll(t, failAct(70, 1, outs[0].Claim.Token, other)); !outs[0].Dead {
		t.Fatalf("the record's policy (2 attempts) governs, not a later act's: %+v", outs)
	}

	m = newMemFSM()
	outs, _ = m.applyAll(t, retryClaim(0, 2, nil))
	outs, changes = m.applyAll(t, failAct(10, 2, outs[0].Claim.Token, nil))
	if outs[0].Err != nil || outs[0].Dead || changes[0].DelayUntilMs != 0 || m.rec(t, 2).Retry != nil {
		t.Fatalf("failure without any policy: %+v %+v", outs, changes)
	}
	if outs, _ = m.applyAll(t, retryClaim(10, 2, nil)); outs[0].Err != nil {
		t.Fatalf("claim at once after a failure without a policy: %+v", outs)
	}
}

// The seeded bug RetryNoBackoff makes the task claimable at once.
func TestSeededBugRetryNoBackoff(t *testing.T) {
	if !testhooks.Built {
		t.Skip("needs -tags testhooks")
	}
	p := &crdt.RetryPolicy{MaxAttempts: 5, InitialMs: 1000, MaxMs: 1000, MultiplierMilli: 1000}
	m := newMemFSM()
	m.bugs.RetryNoBackoff = true
	outs, _ := m.applyAll(t, retryClaim(0, 1, p))
	m.applyAll(t, failAct(10, 1, outs[0].Claim.Token, nil))
	if outs, _ = m.applyAll(t, retryClaim(11, 1, p)); outs[0].Err != nil {
		t.Fatalf("the seeded bug still waits the backoff: %+v", outs)
	}
}

// Records and commands that use no retry keep their version 1 encoding
// (a node from before retries reads them); those that do round-trip in
// version 2.
func TestRetryEncodings(t *testing.T) {
	plain := &Record{Seq: 2, Expired: 1, MaxClaims: 3, History: []Claim{{Token: 5, Seq: 2, Worker: "w", StartMs: 1, ExpiryMs: 2}}}
	if b := plain.Encode(); b[0] != 1 {
		t.Fatalf("a record without retries is version %d", b[0])
	}
	p := &crdt.RetryPolicy{MaxAttempts: 4, InitialMs: 10, MaxMs: 99, MultiplierMilli: 1500, JitterMilli: 3}
	withRetry := *plain
	withRetry.Failed, withRetry.Retry, withRetry.RetryAtMs = 2, p, 12345
	b := withRetry.Encode()
	if b[0] != 2 {
		t.Fatalf("a record with retries is version %d", b[0])
	}
	if got, err := DecodeRecord(b); err != nil || !reflect.DeepEqual(got, &withRetry) {
		t.Fatalf("record round trip: %+v, %v", got, err)
	}
	if _, err := DecodeRecord(b[:len(b)-1]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated v2 record: %v", err)
	}
	if c := (&Command{Op: OpAct, Acts: []Act{{ID: 1, Token: 2, End: EndAborted}}}).Encode(); c[0] != 1 {
		t.Fatalf("an act without retries is version %d", c[0])
	}
	for _, cmd := range []*Command{
		{Op: OpAct, NowMs: 5, Acts: []Act{{ID: 1, Token: 2, End: EndFailed}, {ID: 3, Token: 4, End: EndFailed, Retry: p}}},
		{Op: OpClaim, NowMs: 5, Worker: "w", LeaseMs: 9, Candidates: []Candidate{{ID: 1}, {ID: 2, Retry: p, MaxClaims: 4}}},
	} {
		b := cmd.Encode()
		if b[0] != 2 {
			t.Fatalf("%v with retries is version %d", cmd.Op, b[0])
		}
		if got, err := DecodeCommand(b); err != nil || !reflect.DeepEqual(got, cmd) {
			t.Fatalf("%v round trip: %+v, %v", cmd.Op, got, err)
		}
	}
}
