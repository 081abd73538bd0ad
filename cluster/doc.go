// Package cluster holds what makes nodes one cluster: membership, liveness
// and clock offsets over memberlist (Membership), the ring (Ring, its
// formation rule DecideFormation, SaveRing/LoadRing) and the meta Raft
// group that holds it (Meta).
//
// Membership gossips each node's metadata (NodeMeta: node id, cluster id,
// API and Raft addresses, ring epoch, version) and liveness. It never
// decides placement: gossip failure alone moves nothing. memberlist calls
// its delegates from its own goroutines, which must never block, so
// Membership only records the change and signals a buffered channel of
// capacity one (Changed); a reconcile loop reads the whole member list
// (Members) on each signal. Signals coalesce, so none is lost and a slow
// loop never stalls gossip.
//
// Members reports each member's state: alive; suspect (this node's probes
// of it failed and memberlist suspects it; suspicion that only reaches
// this node by gossip is not seen, as memberlist does not expose it);
// dead; or left. It also reports each member's clock offset from this
// node, estimated from the wall-clock time every node puts in its probe
// acks (MembershipConfig.Clock) — the input the clock-sync detector will
// read.
//
// A node starts with no cluster id and sets one with UpdateMeta once the
// cluster is formed. Two nodes whose cluster ids are both set and differ
// refuse each other: Join fails with ErrOtherCluster, and gossip about
// the other cluster's nodes is ignored.
//
// In order: StartMembership, Join one or more seeds (retry until it
// succeeds), read Members on each Changed signal, UpdateMeta as the
// node's ring epoch or cluster id change, Leave (or Shutdown) at the end.
package cluster
