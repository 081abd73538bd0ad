// Package crdt holds the AP half of a Norn task: a state-based CRDT whose
// join is commutative, associative and idempotent, and the hybrid logical
// clock (HLC) that stamps its events.
//
// The package is pure: it starts no goroutines, does no I/O and never reads
// the wall clock itself. Time comes in through a Clock.
//
// # The task state
//
// A Task has three parts:
//
//   - Spec: written once at enqueue (queue, priority, payload, not-before,
//     dependencies, max claims, creation HLC). Two replicas holding
//     different specs for one id is corruption; Join resolves it
//     deterministically (the spec with the lowest digest wins) and reports it
//     so the caller can count it. A replica may hold a state without a spec
//     (a cancel that arrived before the enqueue); the spec fills in on join.
//   - Updates: a grow-only set keyed by (claim id, seq). A worker's progress
//     reports.
//   - Terminals: a grow-only set of terminal events (complete, abort,
//     cancel). The visible terminal state is the earliest event by HLC, then
//     kind, then claim id: the first terminal event wins, so a cancel that
//     happened before a worker's completion keeps the task cancelled.
//
// # Use
//
//	clk := crdt.NewHLC(crdt.SystemClock{}, nodeID)
//	t := &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: "emails", CreatedAt: clk.Now()}}
//	if err := t.Spec.Validate(crdt.DefaultLimits); err != nil { ... }
//	buf := t.Encode()                 // canonical bytes, stored and sent
//	d := crdt.Digest(buf)             // equal for equal states
//	other, err := crdt.Decode(remote) // strict: rejects non-canonical input
//	j, conflict, err := crdt.Join(t, other)
//
// Encode is canonical: equal states encode to equal bytes, and Decode accepts
// only canonical bytes, so Encode(Decode(b)) == b for every b that decodes.
// The digest (xxhash of the encoding) is therefore equal for equal states
// whatever order the joins happened in; anti-entropy relies on that.
//
// On receiving any timestamp from another node (a replicated task, an RPC),
// call HLC.Update so local events are ordered after what was seen.
package crdt
