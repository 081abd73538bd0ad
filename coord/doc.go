// Package coord is the AP side of the task API on one node: it writes
// task states to their partition's cohort with a write quorum, reads them
// back from R replicas, routes calls to the node that should answer them,
// and lists and counts tasks across the cluster.
//
// A Coordinator sits on the node's store (storage.Store), the replicas it
// holds (replicas.Host: the ring and the partition groups) and its
// connections to the other nodes (transport.Peers):
//
//	c := coord.New(coord.Config{Store: st, Host: h, Peers: peers, ...})
//	acks, err := c.Write(ctx, []*crdt.Task{t}, w, []uint64{t.ID}) // quorum write
//	ts, err := c.Read(ctx, id, r)                                 // merged state + leader's claim record
//	v := c.View(ts)                                               // the API's nornv1.Task
//
// Writes (write.go). Write splits the tasks by destination replica (the
// partition's cohort, plus a moving partition's target, whose acks count
// toward a joint quorum of the old and the new cohort), merges this
// node's share into its store and hands the rest to one replicaSender per
// peer (sender.go), which batches every write queued while a Replicate
// call is in flight into the next call. Write returns once every task has
// w acks, or fails UNAVAILABLE with a WriteFailure detail. A replica that
// refuses for a stale ring makes the coordinator pull the newer ring and
// write again.
//
// Reads (read.go). Read asks the cohort, merges the answers by the CRDT
// join, takes the leader's claim record, and repairs replicas found
// behind (read repair). ReadStates is its batched form for the
// dependency checker; Lookup prefers this node's replica.
//
// The peer side (peer.go). Replicate and ReadReplica answer the
// PeerService calls of other nodes' coordinators: every state is decoded
// and validated like a client's request, and refused when its partition is
// not replicated here or moves since a ring newer than the caller's.
// MergeLocal is the one way task states enter this node's store from the
// API; it reports tasks that became terminal through Config.OnEnded, so
// the claim side ends their claims without coord importing it.
//
// Routing (route.go). Forward runs a TaskService call on the partition's
// leader (or, from a node that does not replicate the partition, on a
// replica), at most two hops, and falls back to here when the target is
// unreachable and this node replicates the partition.
//
// Lists and counts (lists.go, lists_count.go). List and Count read the
// partitions this node replicates from its own replicas and every other
// partition from one replica elsewhere (ListPartition, CountPartitions on
// the peer side), never leaving a partition out silently. A list of one
// queue reads that queue's index in each partition; a count reads the
// counters.
package coord
