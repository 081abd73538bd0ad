// Package ring decides where tasks live: which partition owns a task id, and
// which nodes (the partition's cohort) hold that partition's replicas.
//
// It is pure and deterministic: no goroutines, no I/O, no clocks. The meta
// Raft group (cluster/) stores the placement it computes; everything else
// only reads it.
//
// # Partitions
//
// A task id maps to one of P partitions (P a power of two in
// [1, MaxPartitions], fixed at cluster creation):
//
//	part := ring.Partition(id, P) // low bits of ring.HashID(id)
//
// HashID is the one hash of task ids in Norn: xxhash64 of the id's 8-byte
// big-endian form. Partition takes its low bits; storage's anti-entropy
// segments take its top 16 bits, so the two never interfere. Neither may
// ever change: they decide where every stored task is.
//
// # Placement
//
// A Placement gives each partition a cohort of N distinct nodes. Plan
// computes one from the current placement (empty for a new cluster), the
// live nodes and P and N; Diff lists the replica moves between two
// placements. Plan's rules, in order of precedence:
//
//  1. every cohort has exactly N distinct nodes;
//  2. zones: a cohort holds at most c nodes of one zone, c the smallest
//     bound at which cohorts can still be filled (a node without a zone is
//     a zone of its own); with at least N zones c is 1, so a cohort's
//     nodes all differ in zone;
//  3. balance: each node holds the floor or the ceiling of its ideal load,
//     its weight's share of P*N replicas, capped at P (one per partition)
//     and by what its zone may hold under rule 2 (a lone node in one of N
//     zones holds every partition), the excess shared by the others;
//  4. movement: replicas stay where they are unless rules 1-3 require a
//     move. Adding a node to a balanced cluster moves about P*N/(n+1)
//     replicas, all to the new node; removing one moves that node's
//     replicas and, when rules 1-3 allow it, nothing else; planning again
//     with the same nodes moves nothing.
//
// # Use
//
// A sketch of a topology change (join, drain, decommission, rebalance), as
// the meta group leader runs it:
//
//	if err := ring.ValidatePartitions(cfg.Partitions); err != nil { ... } // at startup
//
//	next, err := ring.Plan(cur, liveNodes, cfg.Partitions, cfg.Replication)
//	if err != nil { ... } // bad input: errors.Is(err, ring.ErrTooFewNodes), ...
//	moves := ring.Diff(cur, next)
//	// propose next with epoch+1 to the meta group, then hand each move
//	// over (DESIGN §4, epoch handoff)
//
//	owners := next.Owners(taskID) // the cohort of taskID's partition
//
// What the caller must do, in order:
//
//  1. Validate P once, at startup (ValidatePartitions): Partition panics
//     on an invalid P, and Plan refuses one.
//  2. Pass every node that should hold replicas, each with a stable,
//     unique ID; order does not matter. A node missing from the list is
//     treated as gone: its replicas are reassigned.
//  3. Pass the placement currently in force, never one derived from a
//     stale epoch, or movement is computed against the wrong baseline.
//     Its P must equal the P asked for (ErrPartitionMismatch); its N may
//     differ, which is how the replication factor changes.
//  4. Treat the result as a proposal: commit it through the meta group and
//     carry out Diff's moves by the epoch handoff; never act on a plan that
//     did not commit.
//
// Plan costs a few milliseconds for P=1024 and 64 nodes, and about 0.2 s
// for P=65536; call it on topology changes, not per request.
package ring
