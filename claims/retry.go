package claims

import (
	"strconv"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/testhooks"
)

// failAttempt ends the live claim c of task id as a failed attempt (why:
// EndExpired or EndFailed) under the record's retry policy, all in the
// entry that ends the claim: it counts the attempt, then either makes
// the task dead (its last allowed attempt: the FSM merges the task's
// DEAD event on every replica) or delays it until its backoff ends (no
// claim is granted before RetryAtMs; the task waits in the delayed
// index). An expiry also records its failure in the task (the worker
// that failed said nothing). Without a policy (a retryable abort on a
// node whose record has none and got none) the task is claimable again
// at once and never dies of it.
func (a *applier) failAttempt(id uint64, r *Record, c *Claim, why EndReason) {
	if why == EndExpired {
		r.Expired++
		a.merge(id, ExpiryFailure(id, c.Token, a.cmd.NowMs).Encode())
	} else {
		r.Failed++
	}
	a.endClaim(id, c, why)
	o := &a.outcomes[len(a.outcomes)-1]
	p := r.Retry
	if p == nil {
		return
	}
	n := r.FailedAttempts()
	if p.MaxAttempts > 0 && n >= p.MaxAttempts {
		r.Dead = true
		o.Dead = true
		o.Died = DeadEvent(id, c.Token, r.Life, a.cmd.NowMs, p.MaxAttempts)
		a.merge(id, o.Died.Encode())
		return
	}
	wait := p.BackoffMs(id, n)
	if testhooks.Built && a.bugs.RetryNoBackoff {
		wait = 0 // the seeded bug: claimable again at once
	}
	if wait > 0 {
		r.RetryAtMs = a.cmd.NowMs + wait
		a.moves[id].DelayUntilMs = r.RetryAtMs
	}
}

// Codes of the errors the FSM writes into tasks.
const (
	// CodeLeaseExpired is the error of an attempt whose lease ran out.
	CodeLeaseExpired = "lease_expired"
	// CodeMaxAttempts is the error of a task dead after its last
	// allowed attempt.
	CodeMaxAttempts = "max_attempts_exceeded"
)

// ExpiryFailure is the CRDT state recording that claim token of task id
// expired at nowMs (leader's clock) under a retry policy. It is a pure
// function of the entry, so every replica merges the same state.
func ExpiryFailure(id, token uint64, nowMs int64) *crdt.Task {
	return &crdt.Task{ID: id, Failures: []crdt.Failure{{Claim: token, At: crdt.Timestamp{WallMs: nowMs}, Expired: true}}}
}

// DeadEvent is the DEAD terminal event of life of task id, whose attempt
// under claim token was the last of limit, decided at nowMs (leader's
// clock): a pure function of the entry, like ExpiryFailure.
func DeadEvent(id, token uint64, life uint32, nowMs int64, limit uint32) *crdt.Task {
	return &crdt.Task{ID: id, Terminals: []crdt.Terminal{{At: crdt.Timestamp{WallMs: nowMs}, Kind: crdt.Dead, Claim: token, Life: life,
		Errors: []crdt.TaskError{{Code: CodeMaxAttempts, Description: "the task failed its last allowed attempt",
			Args: []string{strconv.FormatUint(uint64(limit), 10)}}}}}}
}
