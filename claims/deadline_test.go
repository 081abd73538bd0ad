package claims

import (
	"errors"
	"reflect"
	"testing"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/testhooks"
)

func deadlineCmd(now int64, id uint64, life uint32, deadlineMs int64) Command {
	state := (&crdt.Task{ID: id, Terminals: []crdt.Terminal{{At: crdt.Timestamp{WallMs: now}, Kind: crdt.Cancelled,
		Errors: []crdt.TaskError{{Code: "deadline"}}}}}).Encode()
	return Command{Op: OpDeadline, NowMs: now, Deadlines: []Deadline{{ID: id, Life: life, DeadlineMs: deadlineMs, State: state}}}
}

// A deadline takes effect at its time, on the leader's clock, for a task
// claimed or not: the claim ends with the cancel in one decision, and
// nothing is granted, renewed or acted on after.
func TestDeadline(t *testing.T) {
	m := newMemFSM()
	o := m.apply(t, Command{Op: OpClaim, NowMs: 1000, Worker: "w", LeaseMs: 500, Candidates: []Candidate{{ID: 1, DeadlineMs: 1200}}})
	if o[0].Err != nil {
		t.Fatalf("claim before the deadline: %+v", o)
	}
	tok := o[0].Claim.Token
	if o := m.apply(t, deadlineCmd(1199, 1, 0, 1200)); !errors.Is(o[0].Err, ErrNotDue) {
		t.Fatalf("deadline proposed early: %+v", o)
	}
	if r := m.rec(t, 1); r.DeadlineMs != 1200 {
		t.Fatalf("the record took deadline %d, want 1200", r.DeadlineMs)
	}
	// Before its deadline the claim renews and acts; at it, before the
	// monitor's cancel, no more.
	if o := m.apply(t, Command{Op: OpRenew, NowMs: 1199, ID: 1, Token: tok, LeaseMs: 100}); o[0].Err != nil {
		t.Fatalf("renew before the deadline: %+v", o)
	}
	if o := m.apply(t, Command{Op: OpAct, NowMs: 1199, Acts: []Act{{ID: 1, Token: tok, End: EndNone}}}); o[0].Err != nil {
		t.Fatalf("update before the deadline: %+v", o)
	}
	if o := m.apply(t, Command{Op: OpRenew, NowMs: 1200, ID: 1, Token: tok, LeaseMs: 100}); !errors.Is(o[0].Err, ErrPastDeadline) {
		t.Fatalf("renew at the deadline: %+v", o)
	}
	if o := m.apply(t, Command{Op: OpAct, NowMs: 1200, Acts: []Act{{ID: 1, Token: tok, End: EndCompleted}}}); !errors.Is(o[0].Err, ErrPastDeadline) {
		t.Fatalf("complete at the deadline: %+v", o)
	}
	outs, changes := m.applyAll(t, deadlineCmd(1200, 1, 0, 1200))
	if outs[0].Err != nil || outs[0].Claim.End != EndCancelled || outs[0].Claim.Token != tok {
		t.Fatalf("deadline of a claimed task: %+v", outs)
	}
	if len(changes) != 1 || !changes[0].Released || len(changes[0].Merges) != 1 {
		t.Fatalf("the deadline's change: %+v (want the claim released and the cancel merged)", changes)
	}
	if r := m.rec(t, 1); r.Terminal != EndCancelled {
		t.Fatalf("record after the deadline: %+v", r)
	}
	if o := m.apply(t, Command{Op: OpRenew, NowMs: 1201, ID: 1, Token: tok, LeaseMs: 100}); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("renew after the deadline: %+v", o)
	}
	if o := m.apply(t, Command{Op: OpAct, NowMs: 1201, Acts: []Act{{ID: 1, Token: tok, End: EndCompleted}}}); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("complete after the deadline: %+v", o)
	}
	if o := m.apply(t, deadlineCmd(1300, 1, 0, 1200)); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("the deadline again: %+v", o)
	}

	// Not claimed: cancelled all the same, and never claimed after.
	if o := m.apply(t, deadlineCmd(2000, 2, 0, 1500)); o[0].Err != nil {
		t.Fatalf("deadline of a task never claimed: %+v", o)
	}
	if o := m.apply(t, claimCmd(2001, 100, 2)); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("claim after the deadline's cancel: %+v", o)
	}

	// A claim at or past the deadline is refused.
	c := Command{Op: OpClaim, NowMs: 3000, Worker: "w", LeaseMs: 100, Candidates: []Candidate{{ID: 3, DeadlineMs: 3000}}}
	if o := m.apply(t, c); !errors.Is(o[0].Err, ErrPastDeadline) {
		t.Fatalf("claim at the deadline: %+v", o)
	}

	// A complete decided first stands: the deadline finds it done.
	o = m.apply(t, Command{Op: OpClaim, NowMs: 4000, Worker: "w", LeaseMs: 100, Candidates: []Candidate{{ID: 4, DeadlineMs: 4050}}})
	if o := m.apply(t, Command{Op: OpAct, NowMs: 4040, Acts: []Act{{ID: 4, Token: o[0].Claim.Token, End: EndCompleted}}}); o[0].Err != nil {
		t.Fatalf("complete before the deadline: %+v", o)
	}
	if o := m.apply(t, deadlineCmd(4060, 4, 0, 4050)); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("deadline after a complete: %+v", o)
	}
	if r := m.rec(t, 4); r.Terminal != EndCompleted {
		t.Fatalf("record of the completed task: %+v", r)
	}

	// The deadline of another life (read before a revival) ends nothing.
	if o := m.apply(t, deadlineCmd(5000, 5, 1, 4000)); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("deadline of life 1 of a task in life 0: %+v", o)
	}
}

// The seeded bug deadline-unfenced grants, renews and acts past the
// deadline.
func TestSeededBugDeadlineUnfenced(t *testing.T) {
	if !testhooks.Built {
		t.Skip("seeded bugs need -tags testhooks")
	}
	m := newMemFSM()
	m.bugs.DeadlineUnfenced = true
	o := m.apply(t, Command{Op: OpClaim, NowMs: 2000, Worker: "w", LeaseMs: 500, Candidates: []Candidate{{ID: 1, DeadlineMs: 1000}}})
	if o[0].Err != nil {
		t.Fatalf("with the bug, a claim past the deadline: %+v", o)
	}
	if o := m.apply(t, Command{Op: OpAct, NowMs: 2001, Acts: []Act{{ID: 1, Token: o[0].Claim.Token, End: EndCompleted}}}); o[0].Err != nil {
		t.Fatalf("with the bug, a complete past the deadline: %+v", o)
	}
}

func TestDeadlineCommandEncoding(t *testing.T) {
	r := Record{Seq: 1, DeadlineMs: 1234, History: []Claim{{Token: 5, Seq: 1, Worker: "w"}}}
	b := r.Encode()
	if b[0] != 3 {
		t.Fatalf("a record with a deadline is version %d", b[0])
	}
	if got, err := DecodeRecord(b); err != nil || !reflect.DeepEqual(got, &r) {
		t.Fatalf("record round trip: %+v, %v", got, err)
	}
	r.DeadlineMs = 0
	if b := r.Encode(); b[0] != 1 {
		t.Fatalf("a record without a deadline or retries is version %d", b[0])
	}
	if c := (&Command{Op: OpClaim, NowMs: 5, Worker: "w", LeaseMs: 9, Candidates: []Candidate{{ID: 1}}}).Encode(); c[0] != 1 {
		t.Fatalf("a claim without deadlines or retries is version %d", c[0])
	}
	p := &crdt.RetryPolicy{MaxAttempts: 3, MultiplierMilli: 1000}
	for _, cmd := range []*Command{
		{Op: OpClaim, NowMs: 5, Worker: "w", LeaseMs: 9, Candidates: []Candidate{{ID: 1}, {ID: 2, DeadlineMs: 77, Retry: p}}},
		{Op: OpDeadline, NowMs: 5, Deadlines: []Deadline{{ID: 1, Life: 2, DeadlineMs: 3, State: []byte{4}}, {ID: 9, DeadlineMs: 1}}},
	} {
		b := cmd.Encode()
		if b[0] != 3 {
			t.Fatalf("%v with deadlines is version %d", cmd.Op, b[0])
		}
		if got, err := DecodeCommand(b); err != nil || !reflect.DeepEqual(got, cmd) {
			t.Fatalf("%v round trip: %+v, %v", cmd.Op, got, err)
		}
		if _, err := DecodeCommand(b[:len(b)-1]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%v truncated: %v", cmd.Op, err)
		}
	}
	// OpDeadline exists only in version 3.
	b = (&Command{Op: OpDeadline, Deadlines: []Deadline{{ID: 1, DeadlineMs: 3}}}).Encode()
	b[0] = 2
	if _, err := DecodeCommand(b); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a version 2 deadline: %v", err)
	}
	if o, _, _ := Apply(1, &Command{Op: OpDeadline, Deadlines: []Deadline{{ID: 1}}}, func(uint64) (*Record, error) { return nil, nil }); !errors.Is(o[0].Err, ErrBadCommand) {
		t.Fatalf("a deadline of 0: %+v", o)
	}
}
