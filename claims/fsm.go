package claims

import (
	"errors"
	"fmt"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/testhooks"
)

// Op is the kind of a claim FSM command.
type Op uint8

// Commands. Every one is validated by the FSM from the command and the
// FSM's own records alone, so every replica applies it the same way.
const (
	// OpClaim grants claims on Candidates to Worker for LeaseMs, as of NowMs.
	OpClaim Op = 1
	// OpRenew extends the live claim Token of ID to NowMs+LeaseMs.
	OpRenew Op = 2
	// OpYield ends the live claim Token of ID: the task is claimable again.
	OpYield Op = 3
	// OpEnd records that each of Ends became terminal (cancelled, or
	// aborted by the node: no worker decided it) and ends its live claim.
	// An End with a Token ends only that claim: when another claim is live
	// the End is refused (ErrClaimSuperseded) and changes nothing.
	OpEnd Op = 4
	// OpExpire ends the live claim Token of ID if NowMs > expiry + SkewMs.
	OpExpire Op = 5
	// OpExtend raises the expiry of the live claims of IDs to at least
	// MinExpiryMs (a new leader does this before it expires anything).
	OpExtend Op = 6
	// OpForget deletes the records of IDs (tasks past retention), ending
	// any live claim.
	OpForget Op = 7
	// OpAct applies what workers did under their claims (complete, abort,
	// yield, update), each fenced by its claim's token: an Act takes
	// effect only when its Token is the task's live claim when the entry
	// is applied. Then a completion or abort ends the claim and makes the
	// task terminal, a yield ends the claim, an update leaves it live, and
	// every replica merges the Act's State into the task (Change.Merge):
	// the claim's end and the task's terminal state are one decision.
	OpAct Op = 8
	// OpRevive begins life Life of the terminal task ID (a Retry of it;
	// revive.go).
	OpRevive Op = 9
	// OpDeadline cancels each of Deadlines whose deadline has passed at
	// NowMs and that is not terminal in its life, ending its live claim,
	// and every replica merges the cancel (deadline.go).
	OpDeadline Op = 10
	// OpUnique decides who holds unique keys (Uniques; unique.go). It
	// touches no task record: ApplyUnique applies it.
	OpUnique Op = 11
)

func (o Op) String() string {
	switch o {
	case OpClaim:
		return "claim"
	case OpRenew:
		return "renew"
	case OpYield:
		return "yield"
	case OpEnd:
		return "end"
	case OpExpire:
		return "expire"
	case OpExtend:
		return "extend"
	case OpForget:
		return "forget"
	case OpAct:
		return "act"
	case OpRevive:
		return "revive"
	case OpDeadline:
		return "deadline"
	case OpUnique:
		return "unique"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Candidate is a task the leader picked for a claim, with the spec fields
// the FSM checks.
type Candidate struct {
	ID          uint64
	NotBeforeMs int64
	MaxClaims   uint32
	// Retry is the spec's retry policy (nil: none), taken into the
	// record at the task's first claim.
	Retry *crdt.RetryPolicy
	// DeadlineMs is the spec's deadline (0: none): the task is not
	// claimed at or after it (ErrPastDeadline).
	DeadlineMs int64
}

// Command is one claim FSM command. Which fields matter depends on Op.
type Command struct {
	Op          Op
	NowMs       int64 // the proposing leader's clock, Unix ms
	Worker      string
	LeaseMs     int64
	Candidates  []Candidate // OpClaim
	ID          uint64      // OpRenew, OpYield, OpExpire
	Token       uint64      // OpRenew, OpYield, OpExpire
	SkewMs      int64       // OpExpire
	MinExpiryMs int64       // OpExtend
	IDs         []uint64    // OpExtend, OpForget
	Ends        []End       // OpEnd
	Acts        []Act       // OpAct
	Life        uint32      // OpRevive
	Deadlines   []Deadline  // OpDeadline
	Uniques     []UniqueOp  // OpUnique
}

// Act is one thing a worker did under its claim, in an OpAct.
type Act struct {
	ID    uint64
	Token uint64 // the claim it was done under
	// End is how the act ends the claim: EndCompleted or EndAborted (the
	// task is terminal), EndYielded (claimable again), EndFailed (a failed
	// attempt: the task waits its backoff, or is dead after its last
	// attempt), or EndNone (an update: the claim stays live).
	End EndReason
	// State is the task's CRDT delta the act writes (its terminal event,
	// its progress update), in crdt's encoding, merged into the task on
	// every replica when the act takes effect; nil for none. The FSM does
	// not read it.
	State []byte
	// Retry (EndFailed) is the policy the attempt fails under when the
	// task's record has none yet: the server's default, or the spec's.
	Retry *crdt.RetryPolicy
}

// End is one task's terminal event in an OpEnd.
type End struct {
	ID     uint64
	Token  uint64 // the claim that ended it; 0 if none
	Reason EndReason
	Life   uint32 // the life of the task the event ends (crdt.Terminal.Life)
}

// Errors of a command, in Outcome.Err. They are values the FSM returns, not
// failures of the FSM: the state is unchanged for that task.
var (
	// ErrClaimSuperseded: the claim token is not the task's live claim (it
	// ended, expired, or a newer claim exists).
	ErrClaimSuperseded = errors.New("claim superseded")
	// ErrTaskTerminal: the task is completed, aborted or cancelled.
	ErrTaskTerminal = errors.New("task is terminal")
	// ErrAlreadyClaimed: the task has a live claim.
	ErrAlreadyClaimed = errors.New("task already claimed")
	// ErrNotYet: the task's not-before time is after the command's time.
	ErrNotYet = errors.New("task not claimable before its not-before time")
	// ErrNotExpired: an expiry proposed before expiry + skew buffer.
	ErrNotExpired = errors.New("claim not expired yet")
	// ErrBadCommand: a command that fails validation on its own (bad op,
	// non-positive lease...). The leader never proposes one.
	ErrBadCommand = errors.New("bad claim command")
)

// Outcome is the result of a command for one task.
type Outcome struct {
	ID    uint64
	Err   error // nil when the command took effect
	Claim Claim // the claim granted, renewed or ended (zero when Err != nil)
	// Dead (OpExpire, OpAct): the task is now dead: it reached max_claims
	// (the leader writes its ABORTED event), or its last allowed attempt
	// failed under a retry policy (then Died is the DEAD event the FSM
	// merged: the leader writes it to the task's replicas too).
	Dead bool
	Died *crdt.Task
	// Repeated (OpAct): the same act took effect before, under the same
	// claim (a retry); nothing changed and nothing is merged again.
	Repeated bool
	// Record is the task's record after the command (nil when Err != nil,
	// or when the command forgot it). Read-only: it is the stored state.
	Record *Record
	// Unique (OpUnique) is the key's record after the op, nil when none.
	Unique *UniqueRecord
}

// Change is a record the command wrote (nil: deleted), and what it did to
// the claimed index: Claimed with the new ExpiryMs, Released, or neither;
// and the CRDT states of the task to merge (OpAct), in order.
type Change struct {
	ID       uint64
	Record   *Record
	Claimed  bool
	ExpiryMs int64
	Released bool
	// DelayUntilMs (Released) is when the retry's backoff the release
	// starts ends; 0 for none.
	DelayUntilMs int64
	Merges       [][]byte
}

// Getter returns the FSM's record of id, or nil when it has none.
type Getter func(id uint64) (*Record, error)

// Apply applies cmd, carried by the Raft entry at index, to the records it
// names. It is deterministic: the outcome depends only on index, cmd and the
// records get returns, never on the local clock or the local task states.
// It returns an outcome per task and the changed records; the records from
// get are not modified. An error is returned only when get fails.
func Apply(index uint64, cmd *Command, get Getter) ([]Outcome, []Change, error) {
	return ApplyWithBugs(index, cmd, get, Bugs{})
}

// Bugs are seeded bugs for the Jepsen harness (nornd -test-bug), to show
// that it finds them. Test-only: production leaves them all off.
type Bugs struct {
	// ClaimNoCheck grants a claim of a task that already has a live claim
	// (the "already claimed" check is skipped): two workers hold it.
	ClaimNoCheck bool
	// ActNoFence takes an OpAct under any claim of the task, live or not,
	// as today's code before the fence did: it ends whichever claim is
	// live, so a superseded worker completes a task another one holds.
	ActNoFence bool
	// RetryNoBackoff makes a failed attempt's task claimable again at
	// once, whatever its retry policy's backoff.
	RetryNoBackoff bool
	// ReviveCompleted revives a COMPLETED task (OpRevive), whose result
	// was accepted: it is handed out again.
	ReviveCompleted bool
	// DeadlineUnfenced ignores deadlines in claims, renews and acts, as
	// if the monitor's cancel alone enforced them (and the dispatcher
	// skips its own checks: seeded bug deadline-unfenced).
	DeadlineUnfenced bool
}

// ApplyWithBugs is Apply with the seeded bugs bugs.
func ApplyWithBugs(index uint64, cmd *Command, get Getter, bugs Bugs) ([]Outcome, []Change, error) {
	a := applier{index: index, cmd: cmd, get: get, bugs: bugs, recs: map[uint64]*Record{}}
	if cmd.Op == OpUnique {
		return []Outcome{{Err: fmt.Errorf("%w: unique ops are applied by ApplyUnique", ErrBadCommand)}}, nil, nil
	}
	if err := validate(cmd); err != nil {
		return []Outcome{{ID: cmd.ID, Err: err}}, nil, nil
	}
	var err error
	switch cmd.Op {
	case OpClaim:
		for _, c := range cmd.Candidates {
			if err = a.claim(c); err != nil {
				break
			}
		}
	case OpRenew:
		err = a.withLive(cmd.ID, cmd.Token, a.renew)
	case OpYield:
		err = a.withLive(cmd.ID, cmd.Token, a.yield)
	case OpExpire:
		err = a.withLive(cmd.ID, cmd.Token, a.expire)
	case OpEnd:
		for _, e := range cmd.Ends {
			if err = a.end(e); err != nil {
				break
			}
		}
	case OpExtend:
		for _, id := range cmd.IDs {
			if err = a.extend(id); err != nil {
				break
			}
		}
	case OpForget:
		for _, id := range cmd.IDs {
			if err = a.forget(id); err != nil {
				break
			}
		}
	case OpAct:
		for _, act := range cmd.Acts {
			if err = a.act(act); err != nil {
				break
			}
		}
	case OpRevive:
		err = a.revive(cmd.ID, cmd.Life)
	case OpDeadline:
		for _, dl := range cmd.Deadlines {
			if err = a.deadline(dl); err != nil {
				break
			}
		}
	}
	if err != nil {
		return nil, nil, err
	}
	for i := range a.outcomes {
		if a.outcomes[i].Err == nil {
			a.outcomes[i].Record = a.recs[a.outcomes[i].ID]
		}
	}
	return a.outcomes, a.changes(), nil
}

// applier accumulates one command's effects; a task named twice in one
// command sees its own earlier changes.
type applier struct {
	index    uint64
	cmd      *Command
	get      Getter
	bugs     Bugs
	recs     map[uint64]*Record // copies being modified
	order    []uint64
	moves    map[uint64]*Change
	merges   map[uint64][][]byte
	outcomes []Outcome
}

// record returns a private copy of id's record, creating an empty one.
func (a *applier) record(id uint64) (*Record, error) {
	if r, ok := a.recs[id]; ok {
		if r == nil { // forgotten earlier in this command
			r = &Record{}
			a.recs[id] = r
		}
		return r, nil
	}
	r, err := a.get(id)
	if err != nil {
		return nil, fmt.Errorf("claims: read record %d: %w", id, err)
	}
	c := &Record{}
	if r != nil {
		*c = *r
		c.History = append([]Claim(nil), r.History...)
	}
	a.recs[id] = c
	a.order = append(a.order, id)
	return c, nil
}

func (a *applier) fail(id uint64, err error) {
	a.outcomes = append(a.outcomes, Outcome{ID: id, Err: err})
}

// merge queues a CRDT state of task id to merge on every replica.
func (a *applier) merge(id uint64, state []byte) {
	if a.merges == nil {
		a.merges = map[uint64][][]byte{}
	}
	a.merges[id] = append(a.merges[id], state)
}

func (a *applier) move(id uint64, claimed bool, expiryMs int64) {
	if a.moves == nil {
		a.moves = map[uint64]*Change{}
	}
	a.moves[id] = &Change{ID: id, Claimed: claimed, ExpiryMs: expiryMs, Released: !claimed}
}

func (a *applier) changes() []Change {
	out := make([]Change, 0, len(a.order))
	for _, id := range a.order {
		c := Change{ID: id, Record: a.recs[id], Merges: a.merges[id]}
		if m, ok := a.moves[id]; ok {
			c.Claimed, c.ExpiryMs, c.Released, c.DelayUntilMs = m.Claimed, m.ExpiryMs, m.Released, m.DelayUntilMs
		} else if !a.changed(id) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// changed reports whether a record was modified (records read only for a
// failed validation are not written back).
func (a *applier) changed(id uint64) bool {
	for _, o := range a.outcomes {
		if o.ID == id && o.Err == nil {
			return true
		}
	}
	return false
}

func (a *applier) claim(c Candidate) error {
	r, err := a.record(c.ID)
	if err != nil {
		return err
	}
	switch _, live := r.Live(); {
	case r.Done():
		a.fail(c.ID, ErrTaskTerminal)
		return nil
	case live && !(testhooks.Built && a.bugs.ClaimNoCheck):
		a.fail(c.ID, ErrAlreadyClaimed)
		return nil
	case a.cmd.NowMs < c.NotBeforeMs:
		a.fail(c.ID, ErrNotYet)
		return nil
	case a.cmd.NowMs < r.RetryAtMs:
		a.fail(c.ID, ErrNotYet)
		return nil
	case a.pastDeadline(max(c.DeadlineMs, r.DeadlineMs)):
		a.fail(c.ID, ErrPastDeadline)
		return nil
	}
	if r.Seq == 0 {
		r.DeadlineMs = c.DeadlineMs
		r.MaxClaims = c.MaxClaims
		if c.Retry != nil {
			p := *c.Retry
			r.Retry = &p
		}
	}
	r.Seq++
	cl := Claim{Token: a.index, Seq: r.Seq, Worker: a.cmd.Worker, StartMs: a.cmd.NowMs, ExpiryMs: a.cmd.NowMs + a.cmd.LeaseMs}
	r.History = append(r.History, cl)
	if len(r.History) > HistoryLimit {
		r.History = append([]Claim(nil), r.History[len(r.History)-HistoryLimit:]...)
	}
	a.move(c.ID, true, cl.ExpiryMs)
	a.outcomes = append(a.outcomes, Outcome{ID: c.ID, Claim: cl})
	return nil
}

// withLive runs fn on the live claim of id if its token is token.
func (a *applier) withLive(id, token uint64, fn func(r *Record, c *Claim)) error {
	r, err := a.record(id)
	if err != nil {
		return err
	}
	c, live := r.Live()
	switch {
	case live && c.Token == token && a.cmd.Op == OpRenew && a.pastDeadline(r.DeadlineMs):
		a.fail(id, ErrPastDeadline)
	case live && c.Token == token:
		fn(r, c)
	case r.Done():
		a.fail(id, ErrTaskTerminal)
	default:
		a.fail(id, r.NotLive(token))
	}
	return nil
}

func (a *applier) renew(r *Record, c *Claim) {
	c.ExpiryMs = max(c.ExpiryMs, a.cmd.NowMs+a.cmd.LeaseMs)
	a.move(a.cmd.ID, true, c.ExpiryMs)
	a.outcomes = append(a.outcomes, Outcome{ID: a.cmd.ID, Claim: *c})
}

func (a *applier) yield(r *Record, c *Claim) {
	a.endClaim(a.cmd.ID, c, EndYielded)
}

func (a *applier) expire(r *Record, c *Claim) {
	if a.cmd.NowMs <= c.ExpiryMs+a.cmd.SkewMs {
		a.fail(a.cmd.ID, ErrNotExpired)
		return
	}
	if r.Retry != nil {
		a.failAttempt(a.cmd.ID, r, c, EndExpired)
		return
	}
	r.Expired++
	a.endClaim(a.cmd.ID, c, EndExpired)
	if r.MaxClaims > 0 && r.Expired >= r.MaxClaims {
		r.Dead = true
		a.outcomes[len(a.outcomes)-1].Dead = true
	}
}

func (a *applier) endClaim(id uint64, c *Claim, why EndReason) {
	c.End, c.EndedMs = why, a.cmd.NowMs
	a.move(id, false, 0)
	a.outcomes = append(a.outcomes, Outcome{ID: id, Claim: *c})
}

func (a *applier) end(e End) error {
	r, err := a.record(e.ID)
	if err != nil {
		return err
	}
	if r.Terminal != EndNone || e.Life != r.Life {
		// Already recorded (idempotent), or the end of another life: one
		// before a revival (a cancel of the life that was retried).
		a.fail(e.ID, ErrTaskTerminal)
		return nil
	}
	c, live := r.Live()
	if live && e.Token != 0 && c.Token != e.Token {
		// A terminal event made under a claim that is not the live one
		// (written by a node from before the fence): it must not end the
		// claim another worker holds now.
		a.fail(e.ID, ErrClaimSuperseded)
		return nil
	}
	r.Terminal = e.Reason
	if live {
		a.endClaim(e.ID, c, e.Reason)
	} else {
		a.outcomes = append(a.outcomes, Outcome{ID: e.ID})
	}
	return nil
}

// act applies one Act: fenced by its token (see OpAct).
func (a *applier) act(act Act) error {
	r, err := a.record(act.ID)
	if err != nil {
		return err
	}
	c, live := r.Live()
	fenced := live && c.Token == act.Token
	if testhooks.Built && a.bugs.ActNoFence && !r.Done() {
		// The seeded bug: an act under any claim is taken and ends
		// whichever claim is live, as the CRDT write before the fence did.
		fenced = true
	}
	switch {
	case fenced && a.pastDeadline(r.DeadlineMs):
		a.fail(act.ID, ErrPastDeadline)
		return nil
	case fenced:
	case a.repeated(r, act):
		a.outcomes = append(a.outcomes, Outcome{ID: act.ID, Repeated: true})
		return nil
	case r.Done():
		a.fail(act.ID, ErrTaskTerminal)
		return nil
	default:
		a.fail(act.ID, r.NotLive(act.Token))
		return nil
	}
	if act.State != nil {
		a.merge(act.ID, stampLife(act.State, r.Life))
	}
	if act.End == EndFailed && live {
		if r.Retry == nil && act.Retry != nil {
			p := *act.Retry
			r.Retry = &p
		}
		a.failAttempt(act.ID, r, c, EndFailed)
		return nil
	}
	if act.End.terminal() {
		r.Terminal = act.End
	}
	switch {
	case !live:
		a.outcomes = append(a.outcomes, Outcome{ID: act.ID}) // the seeded bug only
	case act.End == EndNone:
		a.outcomes = append(a.outcomes, Outcome{ID: act.ID, Claim: *c})
	default:
		a.endClaim(act.ID, c, act.End)
	}
	return nil
}

// repeated reports whether act already took effect: its claim ended the
// way act ends it (a retried complete, abort or yield whose first answer
// was lost).
func (a *applier) repeated(r *Record, act Act) bool {
	if act.End == EndNone {
		return false
	}
	for i := len(r.History) - 1; i >= 0; i-- {
		if c := r.History[i]; c.Token == act.Token {
			return c.End == act.End
		}
	}
	return false
}

func (a *applier) forget(id uint64) error {
	r, err := a.record(id)
	if err != nil {
		return err
	}
	if _, live := r.Live(); live {
		a.move(id, false, 0)
	}
	a.recs[id] = nil
	a.outcomes = append(a.outcomes, Outcome{ID: id})
	return nil
}

func (a *applier) extend(id uint64) error {
	r, err := a.record(id)
	if err != nil {
		return err
	}
	c, live := r.Live()
	if !live {
		a.fail(id, ErrClaimSuperseded)
		return nil
	}
	if c.ExpiryMs < a.cmd.MinExpiryMs {
		c.ExpiryMs = a.cmd.MinExpiryMs
		a.move(id, true, c.ExpiryMs)
	}
	a.outcomes = append(a.outcomes, Outcome{ID: id, Claim: *c})
	return nil
}
