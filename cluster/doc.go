// Package cluster holds what makes nodes one cluster: membership and
// liveness over memberlist (Membership), and, still to come, the meta Raft
// group holding the ring and the clock-sync detector.
//
// Membership gossips each node's metadata (NodeMeta: node id, API and Raft
// addresses, ring epoch, version) and liveness. It never decides placement:
// gossip failure alone moves nothing. memberlist calls its delegates from
// its own goroutines, which must never block, so Membership only records
// the change and signals a buffered channel of capacity one (Changed); a
// reconcile loop reads the whole member list (Members) on each signal.
// Signals coalesce, so none is lost and a slow loop never stalls gossip.
package cluster
