// Package cluster holds what makes nodes one cluster: membership, liveness
// and clock offsets over memberlist (Membership), the guard that keeps a
// node whose clock is off the cluster's from leading (ClockGuard), the
// ring (Ring, its formation rule DecideFormation, SaveRing/LoadRing), the
// meta Raft group that holds it (Meta), and the incarnation rule that
// keeps a node whose data dir was lost from taking its old seat in the
// Raft groups (CheckIncarnation; incarnation.go).
//
// Membership gossips each node's metadata (NodeMeta: node id, cluster id,
// API and Raft addresses, ring epoch, version, data dir incarnation, and
// the count of partitions it leads for the leader balancer) and liveness. It never
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
// acks (MembershipConfig.Clock) — the input of the clock guard.
//
// A node starts with no cluster id and sets one with UpdateMeta once the
// cluster is formed. Two nodes whose cluster ids are both set and differ
// refuse each other: Join fails with ErrOtherCluster, and gossip about
// the other cluster's nodes is ignored.
//
// In order: StartMembership, Join one or more seeds (retry until it
// succeeds), read Members on each Changed signal, UpdateMeta as the
// node's ring epoch or cluster id change, Leave (or Shutdown) at the end.
//
// The clock guard (ClockGuard) judges this node's clock against the
// cluster's. Its Check, which the node runs every monitor interval, reads
// the members' offsets (ClockGuardConfig.Members: Members above) and
// takes this node's offset from the median of the alive nodes' clocks,
// itself included, with two or more peers measured; from its one
// measured peer's clock with one; with none while other members are
// known the node is unjudged, out of bound (JudgeClock has the rule and
// why two nodes in bound are at most MinSkewBuffer apart; only estimates
// within MaxOffsetError count). Beyond ClockGuardConfig.MaxOffset the
// node is out of bound:
// Check starts a leadership transfer for every partition group it leads
// (ClockGuardConfig.Groups; one under way per partition at a time, and
// again at the next Check while the node still leads it), and MayLead,
// which the claim groups ask before every proposal, refuses. MayLead also
// corrects the last check by how far this node's own wall clock has
// stepped against the monotonic clock since, so a step shows at once;
// after a step beyond MaxOffset, Check keeps the node out of bound
// (Stepped) until two peers (its one peer) have been sampled since the
// step, or 30 s have passed, since the older estimates may predate the peers' own
// steps. Stats is the last check and the counts of the node's metrics.
package cluster
