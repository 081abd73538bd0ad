package claims

import (
	"errors"
	"testing"

	"github.com/norn-dev/norn/crdt"
)

// OpRevive begins the next life of a done task (dead, aborted or
// cancelled), once; the task is claimable again with a fresh budget; an
// end of the earlier life is refused; an act's terminal events are
// stamped with the record's life.
func TestRevive(t *testing.T) {
	p := &crdt.RetryPolicy{MaxAttempts: 1, MaxMs: 0, MultiplierMilli: 1000}
	m := newMemFSM()
	revive := func(now int64, id uint64, life uint32) []Outcome {
		t.Helper()
		outs, _ := m.applyAll(t, Command{Op: OpRevive, NowMs: now, ID: id, Life: life})
		return outs
	}
	if outs := revive(1, 1, 1); !errors.Is(outs[0].Err, ErrNotTerminal) {
		t.Fatalf("revive of a task never claimed: %+v", outs)
	}
	outs, _ := m.applyAll(t, retryClaim(0, 1, p))
	tok := outs[0].Claim.Token
	if outs := revive(1, 1, 1); !errors.Is(outs[0].Err, ErrNotTerminal) {
		t.Fatalf("revive of a claimed task: %+v", outs)
	}
	m.applyAll(t, failAct(5, 1, tok, nil)) // the only attempt: dead
	if outs := revive(6, 1, 2); !errors.Is(outs[0].Err, ErrBadCommand) {
		t.Fatalf("revive skipping a life: %+v", outs)
	}
	outs, changes := m.applyAll(t, Command{Op: OpRevive, NowMs: 7, ID: 1, Life: 1})
	if outs[0].Err != nil || len(changes) != 1 || len(changes[0].Merges) != 1 {
		t.Fatalf("revive of the dead task: %+v %+v", outs, changes)
	}
	if got, err := crdt.Decode(changes[0].Merges[0]); err != nil || got.Life() != 1 || got.Revivals[0].At.WallMs != 7 {
		t.Fatalf("the revival merged: %+v, %v", got, err)
	}
	r := m.rec(t, 1)
	if r.Life != 1 || r.Done() || r.Failed != 0 || r.Expired != 0 || len(r.History) != 1 {
		t.Fatalf("record after the revival: %+v", r)
	}
	if outs := revive(8, 1, 1); !outs[0].Repeated || outs[0].Err != nil {
		t.Fatalf("the same revival again: %+v", outs)
	}
	// A cancel of life 0 arriving late ends nothing in life 1.
	outs, _ = m.applyAll(t, Command{Op: OpEnd, NowMs: 9, Ends: []End{{ID: 1, Reason: EndCancelled}}})
	if !errors.Is(outs[0].Err, ErrTaskTerminal) || m.rec(t, 1).Done() {
		t.Fatalf("an end of the earlier life: %+v", outs)
	}
	// Claimed again; the completion is stamped with life 1.
	outs, _ = m.applyAll(t, retryClaim(10, 1, p))
	if outs[0].Err != nil {
		t.Fatalf("claim in life 1: %+v", outs)
	}
	tok = outs[0].Claim.Token
	done := (&crdt.Task{ID: 1, Terminals: []crdt.Terminal{{At: crdt.Timestamp{WallMs: 11}, Kind: crdt.Completed, Claim: tok}}}).Encode()
	outs, changes = m.applyAll(t, Command{Op: OpAct, NowMs: 11, Acts: []Act{{ID: 1, Token: tok, End: EndCompleted, State: done}}})
	if outs[0].Err != nil {
		t.Fatalf("complete in life 1: %+v", outs)
	}
	if got, err := crdt.Decode(changes[0].Merges[0]); err != nil || got.Terminals[0].Life != 1 {
		t.Fatalf("the completion merged: %+v, %v", got, err)
	}
	if outs := revive(12, 1, 2); !errors.Is(outs[0].Err, ErrCompleted) {
		t.Fatalf("revive of a completed task: %+v", outs)
	}
	// A record with a life keeps it through its encoding.
	if got, err := DecodeRecord(m.rec(t, 1).Encode()); err != nil || got.Life != 1 {
		t.Fatalf("record round trip: %+v, %v", got, err)
	}
}
