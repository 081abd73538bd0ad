package claims

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/norn-dev/norn/testhooks"
)

// memFSM applies commands to records in a map, as the Raft FSM does with
// storage, round-tripping every command and record through its encoding.
type memFSM struct {
	recs  map[uint64][]byte
	index uint64
	bugs  Bugs
}

func newMemFSM() *memFSM { return &memFSM{recs: map[uint64][]byte{}} }

func (m *memFSM) get(id uint64) (*Record, error) {
	b, ok := m.recs[id]
	if !ok {
		return nil, nil
	}
	return DecodeRecord(b)
}

func (m *memFSM) apply(t testing.TB, cmd Command) []Outcome {
	t.Helper()
	outs, _ := m.applyAll(t, cmd)
	return outs
}

func (m *memFSM) rec(t testing.TB, id uint64) *Record {
	t.Helper()
	r, err := m.get(id)
	if err != nil || r == nil {
		t.Fatalf("record %d: %v, %v", id, r, err)
	}
	return r
}

// endCmd is an OpEnd of one task.
func endCmd(now int64, id uint64, why EndReason) Command {
	return Command{Op: OpEnd, NowMs: now, Ends: []End{{ID: id, Reason: why}}}
}

func claimCmd(now int64, lease int64, ids ...uint64) Command {
	c := Command{Op: OpClaim, NowMs: now, Worker: "w", LeaseMs: lease}
	for _, id := range ids {
		c.Candidates = append(c.Candidates, Candidate{ID: id})
	}
	return c
}

func TestClaimLifecycle(t *testing.T) {
	m := newMemFSM()
	outs := m.apply(t, claimCmd(1000, 100, 1, 2, 1))
	if outs[0].Err != nil || outs[1].Err != nil || !errors.Is(outs[2].Err, ErrAlreadyClaimed) {
		t.Fatalf("claim outcomes %+v", outs)
	}
	tok := outs[0].Claim.Token
	if tok != 1 || outs[0].Claim.Seq != 1 || outs[0].Claim.ExpiryMs != 1100 {
		t.Fatalf("claim %+v: token must be the Raft index, expiry now+lease", outs[0].Claim)
	}
	// Renew extends, never shortens.
	if o := m.apply(t, Command{Op: OpRenew, NowMs: 1050, ID: 1, Token: tok, LeaseMs: 100}); o[0].Err != nil || o[0].Claim.ExpiryMs != 1150 {
		t.Fatalf("renew %+v", o)
	}
	if o := m.apply(t, Command{Op: OpRenew, NowMs: 1050, ID: 1, Token: tok, LeaseMs: 10}); o[0].Claim.ExpiryMs != 1150 {
		t.Fatalf("short renew shortened the lease: %+v", o)
	}
	if o := m.apply(t, Command{Op: OpRenew, NowMs: 1050, ID: 1, Token: tok + 99, LeaseMs: 100}); !errors.Is(o[0].Err, ErrClaimSuperseded) {
		t.Fatalf("renew with a wrong token: %+v", o)
	}
	// Expiry only after expiry + skew.
	if o := m.apply(t, Command{Op: OpExpire, NowMs: 1200, ID: 1, Token: tok, SkewMs: 50}); !errors.Is(o[0].Err, ErrNotExpired) {
		t.Fatalf("early expiry: %+v", o)
	}
	if o := m.apply(t, Command{Op: OpExpire, NowMs: 1201, ID: 1, Token: tok, SkewMs: 50}); o[0].Err != nil || o[0].Claim.End != EndExpired {
		t.Fatalf("expiry: %+v", o)
	}
	// The old token is dead; a new claim gets a new, larger token and seq 2.
	if o := m.apply(t, Command{Op: OpRenew, NowMs: 1202, ID: 1, Token: tok, LeaseMs: 100}); !errors.Is(o[0].Err, ErrClaimSuperseded) {
		t.Fatalf("renew after expiry: %+v", o)
	}
	o := m.apply(t, claimCmd(1300, 100, 1))
	if o[0].Err != nil || o[0].Claim.Token <= tok || o[0].Claim.Seq != 2 {
		t.Fatalf("reclaim %+v", o)
	}
	tok2 := o[0].Claim.Token
	// Yield ends it and the task is claimable again.
	if o := m.apply(t, Command{Op: OpYield, NowMs: 1310, ID: 1, Token: tok2}); o[0].Claim.End != EndYielded {
		t.Fatalf("yield %+v", o)
	}
	// Cancel: ends the live claim, and every later claim or renew fails.
	o = m.apply(t, claimCmd(1400, 100, 1))
	tok3 := o[0].Claim.Token
	if o := m.apply(t, endCmd(1410, 1, EndCancelled)); o[0].Claim.End != EndCancelled || o[0].Claim.Token != tok3 {
		t.Fatalf("cancel %+v", o)
	}
	if o := m.apply(t, Command{Op: OpRenew, NowMs: 1420, ID: 1, Token: tok3, LeaseMs: 100}); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("renew after cancel: %+v", o)
	}
	if o := m.apply(t, claimCmd(1500, 100, 1)); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("claim after cancel: %+v", o)
	}
	r := m.rec(t, 1)
	var ends []EndReason
	for _, c := range r.History {
		ends = append(ends, c.End)
	}
	if want := []EndReason{EndExpired, EndYielded, EndCancelled}; !reflect.DeepEqual(ends, want) {
		t.Fatalf("history ends %v, want %v", ends, want)
	}
}

func TestNotBeforeAndMaxClaims(t *testing.T) {
	m := newMemFSM()
	c := claimCmd(1000, 10)
	c.Candidates = []Candidate{{ID: 1, NotBeforeMs: 1001, MaxClaims: 2}}
	if o := m.apply(t, c); !errors.Is(o[0].Err, ErrNotYet) {
		t.Fatalf("claim before not-before: %+v", o)
	}
	c.NowMs = 1001
	for i := range 2 {
		o := m.apply(t, c)
		if o[0].Err != nil {
			t.Fatalf("claim %d: %+v", i, o)
		}
		e := m.apply(t, Command{Op: OpExpire, NowMs: c.NowMs + 100, ID: 1, Token: o[0].Claim.Token})
		if e[0].Dead != (i == 1) {
			t.Fatalf("expiry %d: dead=%v", i, e[0].Dead)
		}
		c.NowMs += 200
	}
	if o := m.apply(t, c); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("claim of a dead task: %+v", o)
	}
	// Yields do not count towards max_claims.
	c.Candidates = []Candidate{{ID: 2, MaxClaims: 1}}
	for range 3 {
		o := m.apply(t, c)
		if o[0].Err != nil {
			t.Fatalf("claim after yields: %+v", o)
		}
		m.apply(t, Command{Op: OpYield, NowMs: c.NowMs, ID: 2, Token: o[0].Claim.Token})
	}
}

func TestExtendOnLeaderChange(t *testing.T) {
	m := newMemFSM()
	o := m.apply(t, claimCmd(1000, 10, 1, 2))
	m.apply(t, Command{Op: OpYield, NowMs: 1001, ID: 2, Token: o[1].Claim.Token})
	outs := m.apply(t, Command{Op: OpExtend, NowMs: 5000, MinExpiryMs: 6000, IDs: []uint64{1, 2}})
	if outs[0].Err != nil || outs[0].Claim.ExpiryMs != 6000 || !errors.Is(outs[1].Err, ErrClaimSuperseded) {
		t.Fatalf("extend %+v", outs)
	}
	if c, _ := m.rec(t, 1).Live(); c.ExpiryMs != 6000 {
		t.Fatalf("live claim after extend: %+v", c)
	}
}

func TestEndOfSeveralTasks(t *testing.T) {
	m := newMemFSM()
	o := m.apply(t, claimCmd(1000, 100, 1, 2))
	outs := m.apply(t, Command{Op: OpEnd, NowMs: 1010, Ends: []End{
		{ID: 1, Token: o[0].Claim.Token, Reason: EndCompleted},
		{ID: 2, Reason: EndAborted},
		{ID: 3, Reason: EndCancelled}, // never claimed
		{ID: 1, Reason: EndCancelled}, // already ended above
	}})
	if len(outs) != 4 || outs[0].Claim.End != EndCompleted || outs[1].Claim.End != EndAborted ||
		outs[2].Err != nil || !errors.Is(outs[3].Err, ErrTaskTerminal) {
		t.Fatalf("end-many outcomes %+v", outs)
	}
	for id, want := range map[uint64]EndReason{1: EndCompleted, 2: EndAborted, 3: EndCancelled} {
		if r := m.rec(t, id); r.Terminal != want {
			t.Fatalf("task %d terminal %v, want %v", id, r.Terminal, want)
		}
	}
	if o := m.apply(t, claimCmd(2000, 100, 3)); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("claim after end-many: %+v", o)
	}
}

func TestForget(t *testing.T) {
	m := newMemFSM()
	m.apply(t, claimCmd(1000, 100, 1, 2))
	m.apply(t, endCmd(1001, 1, EndCompleted))
	a := applierFor(t, m, Command{Op: OpForget, NowMs: 2000, IDs: []uint64{1, 2, 3, 2}})
	for _, c := range a {
		if c.ID == 2 && !c.Released {
			t.Fatalf("forgetting a task with a live claim does not release it: %+v", c)
		}
	}
	m.apply(t, Command{Op: OpForget, NowMs: 2000, IDs: []uint64{1, 2, 3, 2}})
	for _, id := range []uint64{1, 2, 3} {
		if r, _ := m.get(id); r != nil {
			t.Fatalf("record %d after forget: %+v", id, r)
		}
	}
}

// applierFor returns the changes cmd would make to m, without applying.
func applierFor(t *testing.T, m *memFSM, cmd Command) []Change {
	t.Helper()
	_, changes, err := Apply(m.index+1, &cmd, m.get)
	if err != nil {
		t.Fatal(err)
	}
	return changes
}

func TestBadCommands(t *testing.T) {
	for _, cmd := range []Command{
		{Op: 0},
		{Op: 99},
		{Op: OpClaim, LeaseMs: 0, Candidates: []Candidate{{ID: 1}}},
		{Op: OpClaim, LeaseMs: 10},
		{Op: OpRenew, ID: 1, LeaseMs: -1},
		endCmd(0, 1, EndYielded),
		{Op: OpEnd},
		{Op: OpExpire, ID: 1, SkewMs: -1},
	} {
		outs, changes, err := Apply(1, &cmd, func(uint64) (*Record, error) { return nil, nil })
		if err != nil || len(changes) != 0 || len(outs) != 1 || !errors.Is(outs[0].Err, ErrBadCommand) {
			t.Errorf("%+v: outs=%+v changes=%v err=%v", cmd, outs, changes, err)
		}
	}
}

// TestRandomHistoriesKeepInvariants applies random command sequences and
// checks after every step: at most one live claim per task, tokens strictly
// increasing, no claim granted on a done task, and that replaying the same
// log on a second FSM gives byte-identical records (determinism).
func TestRandomHistoriesKeepInvariants(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 9))
	defer func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	}()
	for range 50 {
		a, b := newMemFSM(), newMemFSM()
		now := int64(1000)
		lastToken := map[uint64]uint64{}
		for range 300 {
			now += r.Int64N(40)
			id := r.Uint64N(5) + 1
			tok := uint64(0)
			if rec, _ := a.get(id); rec != nil && len(rec.History) > 0 && r.IntN(4) != 0 {
				tok = rec.History[len(rec.History)-1].Token
			}
			var cmd Command
			switch r.IntN(7) {
			case 0, 1:
				cmd = claimCmd(now, 1+r.Int64N(100), id, r.Uint64N(5)+1)
				cmd.Candidates[0].MaxClaims = r.Uint32N(3)
			case 2:
				cmd = Command{Op: OpRenew, NowMs: now, ID: id, Token: tok, LeaseMs: 1 + r.Int64N(100)}
			case 3:
				cmd = Command{Op: OpYield, NowMs: now, ID: id, Token: tok}
			case 4:
				cmd = Command{Op: OpExpire, NowMs: now, ID: id, Token: tok, SkewMs: r.Int64N(20)}
			case 5:
				cmd = endCmd(now, id, []EndReason{EndCompleted, EndAborted, EndCancelled}[r.IntN(3)])
				if r.IntN(3) != 0 { // terminal events are rarer
					cmd = Command{Op: OpYield, NowMs: now, ID: id, Token: tok}
				}
			case 6:
				end := []EndReason{EndNone, EndYielded, EndCompleted, EndAborted}[r.IntN(4)]
				cmd = actCmd(now, id, max(tok, 1), end, "s")
			}
			var before *Record
			if cmd.Op == OpClaim {
				before, _ = a.get(id)
			}
			outs := a.apply(t, cmd)
			b.apply(t, cmd)
			for _, o := range outs {
				if o.Err != nil || cmd.Op != OpClaim {
					continue
				}
				if o.ID == id && before != nil && before.Done() {
					t.Fatalf("claim granted on a done task %d", id)
				}
				if o.Claim.Token <= lastToken[o.ID] {
					t.Fatalf("token %d not above %d for task %d", o.Claim.Token, lastToken[o.ID], o.ID)
				}
				lastToken[o.ID] = o.Claim.Token
			}
			for tid, enc := range a.recs {
				rec, _ := DecodeRecord(enc)
				live := 0
				for _, c := range rec.History {
					if c.End == EndNone {
						live++
					}
				}
				if live > 1 || (live == 1 && rec.History[len(rec.History)-1].End != EndNone) {
					t.Fatalf("task %d has %d live claims: %+v", tid, live, rec.History)
				}
				if !bytes.Equal(enc, b.recs[tid]) {
					t.Fatalf("replicas diverged on task %d", tid)
				}
			}
		}
	}
}

func FuzzDecodeCommand(f *testing.F) {
	for _, c := range []Command{
		claimCmd(1000, 10, 1, 2),
		{Op: OpRenew, NowMs: 5, ID: 1, Token: 2, LeaseMs: 3},
		{Op: OpYield, ID: 1, Token: 2},
		endCmd(0, 1, EndCancelled),
		{Op: OpExpire, ID: 1, Token: 2, SkewMs: 100},
		{Op: OpExtend, MinExpiryMs: 9, IDs: []uint64{1, 2, 3}},
		{Op: OpForget, IDs: []uint64{4, 5}},
		{Op: OpEnd, Ends: []End{{ID: 1, Token: 2, Reason: EndCompleted}, {ID: 3, Reason: EndCancelled}}},
		{Op: OpAct, Acts: []Act{{ID: 1, Token: 2, End: EndCompleted, State: []byte{1, 2}}, {ID: 3, Token: 4}}},
	} {
		f.Add(c.Encode())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cmd, err := DecodeCommand(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again, err := DecodeCommand(cmd.Encode())
		if err != nil || !reflect.DeepEqual(cmd, again) {
			t.Fatalf("re-decode: %+v vs %+v, %v", cmd, again, err)
		}
		// Applying any decodable command never panics.
		_, _, _ = Apply(7, cmd, func(uint64) (*Record, error) { return &Record{History: []Claim{{Token: 7}}}, nil })
	})
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add((&Record{Seq: 2, Expired: 1, MaxClaims: 3, History: []Claim{{Token: 4, Seq: 1, Worker: "w", StartMs: 1, ExpiryMs: 2, End: EndExpired, EndedMs: 3}, {Token: 9, Seq: 2}}}).Encode())
	f.Add((&Record{Terminal: EndCancelled, Dead: true}).Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRecord(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again, err := DecodeRecord(r.Encode())
		if err != nil || !reflect.DeepEqual(r, again) {
			t.Fatalf("re-decode: %+v vs %+v, %v", r, again, err)
		}
	})
}

// TestSeededBugClaimNoCheck: a second claim of a claimed task fails with
// ErrAlreadyClaimed, unless the seeded bug ClaimNoCheck is on: then it is
// granted while the first claim is live.
func TestSeededBugClaimNoCheck(t *testing.T) {
	for _, bug := range testhooks.BugCases() {
		m := newMemFSM()
		m.bugs.ClaimNoCheck = bug
		if outs := m.apply(t, claimCmd(1000, 100, 1)); outs[0].Err != nil {
			t.Fatal(outs[0].Err)
		}
		outs := m.apply(t, claimCmd(1050, 100, 1))
		switch {
		case !bug && !errors.Is(outs[0].Err, ErrAlreadyClaimed):
			t.Fatalf("second claim without the bug: %v, want ErrAlreadyClaimed", outs[0].Err)
		case bug && outs[0].Err != nil:
			t.Fatalf("second claim with claim-no-check: %v, want granted", outs[0].Err)
		case bug && (outs[0].Claim.Seq != 2 || len(m.rec(t, 1).History) != 2):
			t.Fatalf("second claim with claim-no-check: %+v, history %+v", outs[0].Claim, m.rec(t, 1).History)
		}
	}
}

// actCmd is an OpAct of one task under claim tok.
func actCmd(now int64, id, tok uint64, end EndReason, state string) Command {
	act := Act{ID: id, Token: tok, End: end}
	if state != "" {
		act.State = []byte(state)
	}
	return Command{Op: OpAct, NowMs: now, Acts: []Act{act}}
}

// TestActIsFenced: what a worker does under a claim (update, complete,
// abort, yield) takes effect only under the task's live claim: a worker
// whose claim expired and was granted to another cannot complete the
// task, update it or yield it, and its act changes nothing. The live
// claim's act ends the claim and makes the task terminal in the same
// entry, and hands every replica the state to merge. A retried act is
// answered as done (Repeated) without merging again.
func TestActIsFenced(t *testing.T) {
	m := newMemFSM()
	a := m.apply(t, claimCmd(1000, 100, 1))[0].Claim.Token
	if o := m.apply(t, Command{Op: OpExpire, NowMs: 1200, ID: 1, Token: a, SkewMs: 50}); o[0].Err != nil {
		t.Fatal(o[0].Err)
	}
	b := m.apply(t, claimCmd(1210, 100, 1))[0].Claim.Token
	before := m.recs[1]
	for _, end := range []EndReason{EndCompleted, EndAborted, EndYielded, EndNone} {
		cmd := actCmd(1220, 1, a, end, "stale")
		outs, changes, err := Apply(99, &cmd, m.get)
		if err != nil || !errors.Is(outs[0].Err, ErrClaimSuperseded) || len(changes) != 0 {
			t.Fatalf("act %v under the superseded claim: %+v, changes %+v, %v", end, outs, changes, err)
		}
	}
	if !bytes.Equal(m.recs[1], before) {
		t.Fatal("a superseded act changed the record")
	}
	// An update under the live claim merges its state and keeps the claim.
	cmd := actCmd(1230, 1, b, EndNone, "progress")
	outs, changes, err := Apply(100, &cmd, m.get)
	if err != nil || outs[0].Err != nil || outs[0].Claim.Token != b || outs[0].Claim.End != EndNone ||
		len(changes) != 1 || len(changes[0].Merges) != 1 || string(changes[0].Merges[0]) != "progress" || changes[0].Released {
		t.Fatalf("update under the live claim: %+v, %+v, %v", outs, changes, err)
	}
	// The completion ends the claim and the task in one entry.
	cmd = actCmd(1240, 1, b, EndCompleted, "result")
	outs, changes, err = Apply(101, &cmd, m.get)
	if err != nil || outs[0].Err != nil || outs[0].Claim.End != EndCompleted || len(changes) != 1 ||
		!changes[0].Released || changes[0].Record.Terminal != EndCompleted || string(changes[0].Merges[0]) != "result" {
		t.Fatalf("completion under the live claim: %+v, %+v, %v", outs, changes, err)
	}
	m.apply(t, cmd)
	// A retry is done already; another act is refused; nothing is claimed.
	if o := m.apply(t, actCmd(1250, 1, b, EndCompleted, "result")); o[0].Err != nil || !o[0].Repeated {
		t.Fatalf("retried completion: %+v", o)
	}
	if o := m.apply(t, actCmd(1250, 1, b, EndAborted, "")); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("abort after the completion: %+v", o)
	}
	if o := m.apply(t, actCmd(1250, 1, a, EndCompleted, "")); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("stale completion after the completion: %+v", o)
	}
	if o := m.apply(t, claimCmd(5000, 100, 1)); !errors.Is(o[0].Err, ErrTaskTerminal) {
		t.Fatalf("claim after the completion: %+v", o)
	}
	// A yield ends the claim; its retry is done already.
	c := m.apply(t, claimCmd(2000, 100, 2))[0].Claim.Token
	if o := m.apply(t, actCmd(2010, 2, c, EndYielded, "")); o[0].Err != nil || o[0].Claim.End != EndYielded {
		t.Fatalf("yield: %+v", o)
	}
	if o := m.apply(t, actCmd(2020, 2, c, EndYielded, "")); o[0].Err != nil || !o[0].Repeated {
		t.Fatalf("retried yield: %+v", o)
	}
	if o := m.apply(t, actCmd(2020, 2, c, EndNone, "late")); !errors.Is(o[0].Err, ErrClaimSuperseded) {
		t.Fatalf("update after the yield: %+v", o)
	}
}

// TestEndChecksItsToken: an OpEnd whose terminal event was made under a
// claim that is not the live one refuses to end the live claim.
func TestEndChecksItsToken(t *testing.T) {
	m := newMemFSM()
	a := m.apply(t, claimCmd(1000, 100, 1))[0].Claim.Token
	m.apply(t, Command{Op: OpExpire, NowMs: 1200, ID: 1, Token: a, SkewMs: 50})
	b := m.apply(t, claimCmd(1210, 100, 1))[0].Claim.Token
	if o := m.apply(t, Command{Op: OpEnd, NowMs: 1220, Ends: []End{{ID: 1, Token: a, Reason: EndCompleted}}}); !errors.Is(o[0].Err, ErrClaimSuperseded) {
		t.Fatalf("end under the superseded claim: %+v", o)
	}
	if c, live := m.rec(t, 1).Live(); !live || c.Token != b {
		t.Fatalf("the live claim %d did not survive: %+v", b, m.rec(t, 1))
	}
	// A cancel (no claim) ends whichever claim is live.
	if o := m.apply(t, endCmd(1230, 1, EndCancelled)); o[0].Err != nil || o[0].Claim.Token != b {
		t.Fatalf("cancel: %+v", o)
	}
}

// TestSeededBugActNoFence: with the seeded bug ActNoFence a superseded
// claim's completion is taken and ends the live claim of another worker.
func TestSeededBugActNoFence(t *testing.T) {
	for _, bug := range testhooks.BugCases() {
		m := newMemFSM()
		m.bugs.ActNoFence = bug
		a := m.apply(t, claimCmd(1000, 100, 1))[0].Claim.Token
		m.apply(t, Command{Op: OpExpire, NowMs: 1200, ID: 1, Token: a, SkewMs: 50})
		m.apply(t, claimCmd(1210, 100, 1))
		o := m.apply(t, actCmd(1220, 1, a, EndCompleted, "stale"))
		switch {
		case !bug && !errors.Is(o[0].Err, ErrClaimSuperseded):
			t.Fatalf("stale completion without the bug: %+v", o)
		case bug && (o[0].Err != nil || m.rec(t, 1).Terminal != EndCompleted):
			t.Fatalf("stale completion with act-no-fence: %+v, record %+v", o, m.rec(t, 1))
		}
	}
}
