// Package claims is the CP half of Norn: who holds a task, until when. Each
// partition's claims go through that partition's Raft group; only its leader
// grants, renews, ends and expires claims, and only by proposing a Command.
//
// This package's core is the claim state machine, Apply: a pure function of
// the Raft index, a Command and the FSM's Records, with no clock, no I/O and
// no look at the replica's task states, so that every replica applies every
// entry identically.
//
//   - A claim's token is the Raft index of the entry that granted it: a
//     fencing token that strictly increases per partition. Seq numbers a
//     task's claims 1, 2, 3... for humans.
//   - OpClaim grants up to n tasks in one entry (the leader coalesces), each
//     checked against the FSM's record (no live claim, not terminal, not
//     dead) and the not-before time the leader copied into the entry,
//     compared with the leader's clock reading stamped in the entry.
//   - OpRenew and OpYield need the live claim's token; anything else fails
//     with ErrClaimSuperseded (or ErrTaskTerminal once the task ended), which
//     the API reports as FAILED_PRECONDITION: that is how a worker learns its
//     claim is gone or its task was cancelled.
//   - OpExpire succeeds only when the entry's time is past expiry plus the
//     skew buffer the entry carries. Expiries count towards max_claims; the
//     last one marks the task dead (the leader then writes the abort).
//   - OpEnd records terminal events the leader saw (complete, abort,
//     cancel) and ends whatever claim is live; no claim is granted after.
//   - OpExtend is what a new leader proposes first: every live claim gets at
//     least now + lease grace, so a leader change never shortens a lease.
//
// Use (the Raft FSM adapter does this for each entry):
//
//	cmd, err := claims.DecodeCommand(log.Data)
//	outcomes, changes, err := claims.Apply(log.Index, cmd, getRecord)
//	// write every change's Record and claimed-index move, with log.Index
//	// as the applied index, in one storage batch
package claims
