// Package antientropy repairs the replicas of a partition: two nodes that
// hold the same partition compare Merkle trees of their task states and
// transfer exactly the tasks whose states differ, merged by the CRDT join.
// The cost of an exchange grows with the difference, not with the data.
// A node's Scheduler runs those exchanges with its peers, and the fills of
// the partitions moving to it.
//
// # Trees
//
// A Tree is a fixed-size XOR segment tree (Tictac style), one per
// partition replica. storage assigns every task a segment, the top 16 bits
// of its id's hash (storage.Segment), and keeps in memory a segment index
// of (segment, id) -> state digest for every tracked partition. The tree has 2^LeafBits leaves, each
// covering 2^(16-LeafBits) consecutive segments; a leaf is the XOR of
// Hash(id, digest) over the tasks in its segments, and every branch, with
// 16 children (the top level may have fewer), is the XOR of its children.
// A change of one task's digest XORs one delta into one node per level:
// nothing is rescanned, the order of changes does not matter, and two
// replicas holding the same states have the same tree.
//
// A Tree implements storage.DigestSink. Replica.Add builds partition p's
// tree from the partition's task keys (storage.Store.TrackDigests, with
// writes held meanwhile) and from then on the store reports every committed write
// and delete of p under the id's lock. The memory is fixed by LeafBits,
// 8 bytes a node: DefaultLeafBits (14: 16,384 leaves) takes 137 KiB per
// partition replica whatever the task count; MaxLeafBits (16) 546 KiB.
// (The store's segment index beside it grows with the tasks: a map entry
// per task.)
// Every node of a cluster must use the same LeafBits.
//
// # Exchange
//
// Replica.Exchange runs one round with a Peer (the other replica, reached
// over PeerService) for a set of partitions both replicate:
//
//  1. TreeRoots: one call for all the partitions. It carries the caller's
//     retention horizon and LeafBits (trees of different sizes are
//     ErrTreeSize); the peer deletes its expired tasks (see below) and
//     answers its roots and the agreed horizon, and the caller deletes
//     its own expired tasks before comparing. Equal roots end the round
//     for a partition.
//  2. TreeNodes: for a partition whose roots differ, one call per level,
//     for the children of the nodes that differed at the level above,
//     down to the differing leaves.
//  3. SegmentEntries: the peer's (id, digest) pairs under those leaves,
//     compared with this replica's. With Options.Settle, the comparison
//     is repeated after Settle and only ids that differ both times count,
//     so writes still in flight to both replicas are not transferred.
//  4. Transfer: ReadStates pulls the peer's states of the differing ids
//     and merges them here (ReplicaConfig.Merge); then Push sends this
//     replica's joined states of those ids, except where the joined state
//     equals the one the peer sent.
//
// An id only this replica has is pushed, one only the peer has is pulled,
// and one both have in different states is pulled and, unless the peer's
// state already held this one's, pushed. Stats reports what a round did,
// with the protobuf bytes each way. Options.Pace is asked before every
// call (a rate limit); its error, or the end of ctx, stops the round.
//
// A Replica also answers a peer's rounds: ServeTreeRoots, ServeTreeNodes
// and ServeSegmentEntries validate every request (unknown partitions are
// ErrNotReplicated; empty, repeated or out-of-range items are errors) and
// never panic on one. Reads and pushes are the node's ordinary PeerService
// Read and Replicate.
//
// # Retention horizon
//
// Each node deletes terminal tasks whose deciding terminal event is older
// than its horizon, now minus the retention (ReplicaConfig.Horizon); its
// store then refuses to store such a state again for a task it does not
// hold (storage.Store.RaiseDeleteHorizon), so a stale copy never brings a
// deleted task back. Two replicas may disagree on the horizon (clocks,
// retention settings, a retention pass that has not run yet), and a task
// one has deleted and the other still holds would differ forever. So
// every round agrees on one: the later of the two sides' horizons. Both
// delete the terminal tasks older than it (ReplicaConfig.Expire) before
// the roots are compared, and neither stores a pulled or pushed state that
// is past it.
//
// A queue may have a retention of its own (QueueSettings.retention): its
// horizon is then its own (ReplicaConfig.QueueHorizons), and a round
// agrees on each queue's, the later of the two sides', the same way. A
// pair that would apply different settings (one side names a queue's
// retention the other does not know yet) would keep different tasks, so
// when either side has a queue horizon both must hold the same version
// of the queue settings table; otherwise the receiver refuses the round
// (ErrQueuesVersion) and the scheduler tries again soon, once gossip has
// brought the newer table (seconds).
//
// # Scheduler
//
// A Scheduler is one node's anti-entropy: it owns the node's Replica and
// decides when to exchange what with whom. Data flows through it so:
//
//   - the node's replicas (replicas.Host) open and drop partition
//     replicas and tell the Scheduler (Add, Remove: it satisfies
//     replicas.Trees), which builds and forgets their trees; a change of
//     the ring or of the replicas here calls Kick;
//   - the round loop reads the ring (a cluster.Ring, through Host, once
//     per pass) and, for every other node sharing partitions with this
//     one (SharedPeers), runs a round of the partitions they share
//     (SharedPartitions; not a partition whose move fills either side)
//     every Config.Interval, a fifth of it after a round that found
//     differences, jittered ±20%, at once after Kick; a peer gossip sees
//     down is skipped;
//   - a round is Replica.Exchange with the peer over PeerService (TreeRoots,
//     TreeNodes, SegmentEntries, then Read and Replicate), every byte
//     paced by one token bucket for all rounds (Config.Rate) and bounded
//     by Config.Timeout; pulled states enter the store through
//     ReplicaConfig.Merge, which the node points at its coordinator's
//     merge, so a terminal state pulled here ends the task's claim;
//   - a move's target fills its new replica with Fill (started by the
//     ReplicaProgress call of the rebalance driver): one exchange of the
//     partition with each source in turn, retried until it completes,
//     paced by Config.FillRate and bounded by 30 minutes; FilledFrom
//     tells the driver when every source was exchanged with in a round
//     numbered above the one the ring named (Rounds);
//   - the peers' rounds arrive at the node's PeerService handlers, which
//     check the caller and call ServeTreeRoots, ServeTreeNodes and
//     ServeSegmentEntries (the Replica's answers, errors as connect codes:
//     a partition not replicated here or trees of another size are
//     FAILED_PRECONDITION, other refusals INVALID_ARGUMENT);
//   - Counters and Converged are what the rounds did, for /metrics.
//
// # Use
//
//	s, err := antientropy.New(antientropy.Config{
//		NodeID:  id,
//		Replica: antientropy.ReplicaConfig{Store: store, Horizon: horizon, Merge: merge},
//		Interval: 10 * time.Second, Timeout: 30 * time.Second, Settle: 500 * time.Millisecond,
//		Rate: 16 << 20, FillRate: 16 << 20, Peers: peers, Logger: logger,
//	})
//	// replicas.Config{Trees: s, OnPlacement: s.Kick, ...}
//	s.Start(host) // the rounds, until s.Close()
//
// A Replica alone (tests, benchmarks) is used so:
//
//	r, err := antientropy.NewReplica(antientropy.ReplicaConfig{
//		Store:   store,
//		Horizon: func() int64 { return time.Now().Add(-retention).UnixMilli() },
//	})
//	err = r.Add(p)        // for every partition replicated here; r.Remove(p) before dropping it
//	...
//	st, err := r.Exchange(ctx, peer, sharedPartitions, antientropy.Options{Settle: time.Second})
//
// and the PeerService handlers call r.ServeTreeRoots, r.ServeTreeNodes and
// r.ServeSegmentEntries. Exchange and the Serve methods are safe to call
// concurrently with each other and with writes.
package antientropy
