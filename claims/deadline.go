package claims

import (
	"errors"

	"github.com/norn-dev/norn/testhooks"
)

// Errors of deadlines.
var (
	// ErrPastDeadline: a claim, renew or act of a task whose deadline is
	// at or before the command's time (the leader's clock): its claim
	// is over, and the leader's monitor cancels the task (OpDeadline).
	ErrPastDeadline = errors.New("task past its deadline")
	// ErrNotDue: an OpDeadline proposed before the task's deadline.
	ErrNotDue = errors.New("task's deadline not reached")
)

// Deadline is one task in an OpDeadline: its deadline (the spec's), the
// life the cancel ends, and the cancel's CRDT state (its CANCELLED event
// with the error code "deadline"), merged on every replica when the
// deadline takes effect.
type Deadline struct {
	ID         uint64
	Life       uint32
	DeadlineMs int64
	State      []byte
}

// deadline applies one Deadline (OpDeadline): a task not terminal in
// life whose deadline is at or before the command's time (the leader's
// clock) is cancelled: its live claim ends, and the cancel and the
// claim's end are one decision, as a worker's complete is (OpAct). A
// complete decided before stands (the record is done: ErrTaskTerminal),
// and one proposed after is refused the same way.
func (a *applier) deadline(dl Deadline) error {
	r, err := a.record(dl.ID)
	if err != nil {
		return err
	}
	switch {
	case r.Done() || r.Life != dl.Life:
		a.fail(dl.ID, ErrTaskTerminal)
		return nil
	case a.cmd.NowMs < dl.DeadlineMs:
		a.fail(dl.ID, ErrNotDue)
		return nil
	}
	r.Terminal = EndCancelled
	a.merge(dl.ID, stampLife(dl.State, r.Life))
	if c, live := r.Live(); live {
		a.endClaim(dl.ID, c, EndCancelled)
	} else {
		a.outcomes = append(a.outcomes, Outcome{ID: dl.ID})
	}
	return nil
}

// pastDeadline reports whether deadlineMs (0: none) is at or before the
// command's time.
func (a *applier) pastDeadline(deadlineMs int64) bool {
	if testhooks.Built && a.bugs.DeadlineUnfenced {
		return false
	}
	return deadlineMs != 0 && a.cmd.NowMs >= deadlineMs
}
