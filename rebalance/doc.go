// Package rebalance changes where partitions live: it plans placement
// changes, moves partition replicas from node to node, and keeps the meta
// group's voters in line with the ring.
//
// A Driver sits on the node's replicas (replicas.Host: the ring, the meta
// group, the partition groups, gossip) and its connections to the other
// nodes (transport.Peers). Every node has one; it drives moves only while
// the node leads the meta group, since only that leader proposes rings:
//
//	d := rebalance.New(rebalance.Config{NodeID: id, Peers: peers, Fills: fills, ...})
//	h, err := replicas.Start(replicas.Config{..., OnMetaRing: d.Kick})
//	d.Start(h)       // the driver's loop
//	defer d.Close()
//	plan, err := d.Plan("n4", cluster.RoleLeaving, true) // decommission n4
//
// The placement calls (plan.go, forward.go). AdminService's Join,
// Rebalance, Drain, Decommission and Remove are accepted by any node;
// ToMetaLeader runs them on the meta leader (one hop). There Join adds a
// gossip member to the ring, Plan gives a node its role (draining,
// leaving, dead, or none for a plain rebalance), plans the placement
// over the members (cluster.Ring.PlanMoves) and, when applied, queues
// the moves in the ring; Cancel gives up the moves not promoted yet.
// Every ring change goes through editRing: one proposal at a time, on a
// copy of the meta group's ring with the next epoch.
//
// The driver (driver.go, move.go, meta.go, auto.go). On the meta group's
// leader, a pass every 500 ms (sooner when kicked: a new ring, a plan)
// starts queued moves within the throttle (MaxMovesPerNode), runs a
// goroutine for each move under way that drives it through the epoch
// handoff, one idempotent step at a time, and removes decommissioned and
// dead nodes once they hold nothing (then fits the meta group to the
// ring). Every step's outcome is recorded in the ring through the meta
// group, so a new meta leader (or a restarted one) resumes where the last
// one stopped: the steps check the partition group's actual configuration
// before they change it. With AutoRebalance the driver also plans by
// itself when a member has been dead for AutoDeadAfter or a live member
// holds nothing.
//
// A move of partition p from A to B (DESIGN section 4; the states are
// cluster.MoveState, and cluster.Ring records them):
//
//	filling      the ring names B a replica of p (writes go to the cohort
//	             and B, and need a quorum of both the old and the new
//	             cohort). Once every live replica runs with that ring (a
//	             replica refuses writes from older rings), B must complete
//	             an anti-entropy exchange of p with every live member of
//	             the cohort (A included unless dead) that started after
//	             that point.
//	catching-up  p's leader has added B as a non-voter; B applies the log
//	             up to the leader's last index.
//	promoted     B votes; if A leads p it hands the leadership over; then
//	             A is removed from p's group.
//	done         the ring has B in A's place. A, a zombie since its
//	             removal (it can neither lead nor commit anything), drops
//	             its replica when it sees this ring.
//
// Until promoted a move can roll back (its target down for
// MoveTargetTimeout, or Cancel): B leaves p's group and the move is
// recorded failed, the cohort unchanged.
//
// The peer side (peer.go). The driver's steps call two PeerService calls
// that the Driver of the other node answers: ChangeGroup on p's leader
// (a Raft configuration change, answered with the configuration) and
// ReplicaProgress on each replica (its ring epoch, applied index, and on
// B whether its fill from the sources is done, which B's anti-entropy
// runs through Config.Fills).
package rebalance
