package claims

import (
	"errors"
	"fmt"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/testhooks"
)

// Errors of OpRevive.
var (
	// ErrNotTerminal: the task is not terminal in its current life (it
	// is ready, delayed or claimed): there is nothing to revive.
	ErrNotTerminal = errors.New("task is not terminal")
	// ErrCompleted: the task was completed; its result was accepted, so
	// it is not revived (enqueue it again).
	ErrCompleted = errors.New("task was completed")
)

// revive begins life of task id (OpRevive): the task must be done in
// life-1 (dead, aborted or cancelled, not completed). Its attempts start
// afresh, its claim history stays, and every replica merges the revival
// (RevivalEvent), which puts the task back in the ready index. A revival
// to a life the task has reached already is a repeat (a retried Retry):
// nothing changes.
func (a *applier) revive(id uint64, life uint32) error {
	r, err := a.record(id)
	if err != nil {
		return err
	}
	switch {
	case r.Life >= life:
		a.outcomes = append(a.outcomes, Outcome{ID: id, Repeated: true})
		return nil
	case r.Life+1 != life:
		a.fail(id, fmt.Errorf("%w: revive of task %d to life %d from life %d", ErrBadCommand, id, life, r.Life))
		return nil
	case r.Terminal == EndCompleted && !(testhooks.Built && a.bugs.ReviveCompleted):
		a.fail(id, ErrCompleted)
		return nil
	case !r.Done():
		a.fail(id, ErrNotTerminal)
		return nil
	}
	r.Life, r.Terminal, r.Dead = life, EndNone, false
	r.Expired, r.Failed, r.RetryAtMs = 0, 0, 0
	a.merge(id, RevivalEvent(id, life, a.cmd.NowMs).Encode())
	a.outcomes = append(a.outcomes, Outcome{ID: id})
	return nil
}

// RevivalEvent is the CRDT state of task id's revival to life at nowMs
// (leader's clock): a pure function of the entry, as DeadEvent.
func RevivalEvent(id uint64, life uint32, nowMs int64) *crdt.Task {
	return &crdt.Task{ID: id, Revivals: []crdt.Revival{{Life: life, At: crdt.Timestamp{WallMs: nowMs}}}}
}

// stampLife returns state (a task's CRDT delta an act carries) with its
// terminal events set to life: an act of a revived task ends the life its
// claim was granted in, whatever the worker's node stamped (a node that
// had not seen the revival yet). Life 0, or a state that does not decode
// (merged as it is, and refused by the store), is returned as it is.
func stampLife(state []byte, life uint32) []byte {
	if life == 0 {
		return state
	}
	t, err := crdt.Decode(state)
	if err != nil || len(t.Terminals) == 0 {
		return state
	}
	for i := range t.Terminals {
		t.Terminals[i].Life = life
	}
	t.Normalize()
	return t.Encode()
}
