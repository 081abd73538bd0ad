// Package replicas is this node's place in the cluster: the partition
// replicas it holds and everything that decides which those are.
//
// A Host owns the Raft listener (one transport.RaftMux for every group on
// the node), this node's replica of the meta group (cluster.Meta, which
// holds the ring), gossip (cluster.Membership), the ring the node works
// with, and one claims.Group per partition the ring places here. Every
// other part of a node reads the ring and the groups through it:
//
//	h, err := replicas.Start(cfg) // listener, meta group, gossip; forms or joins
//	r := h.Ring()                 // nil until the cluster is formed
//	g := h.Group(h.Partition(id)) // nil when this node does not replicate it
//	if g != nil && g.IsLeader() { ... propose a claim ... }
//	defer h.Close()
//
// The reconcile loop (reconcile.go) keeps the Host in line with the
// cluster: it joins the seeds, forms the cluster once BootstrapExpect
// nodes are up, adopts every newer ring the meta group applies or a peer
// shows (PullRing), opens the groups of partitions placed here and drops
// those moved away (groups.go), and rejoins ring nodes gossip shows down.
// Every ring is checked against this node's data dir incarnation before
// it is adopted (cluster.CheckIncarnation): a ring that lists the node's
// id with another data dir is refused for good (Start fails, or OnFatal
// gets the error), and until a checked ring or the cluster's formation
// the meta replica answers no Raft request (transport.HeldTransport), so
// a node whose data dir was wiped votes in no group before it is refused.
// The Host tells the rest of the node what changed through the callbacks
// of its Config (Trees, OnLeaderChange, OnMetaRing, OnPlacement), so it
// imports none of them.
//
// The Host also spreads the partition leaderships over the cluster: the
// node calls BalanceLeaders every leader-balance interval (one goroutine),
// which gossips this node's leader count and, while some node leads too
// far from its fair share, hands leaderships over one at a time
// (LeaderBalancer; the rule is the pure DecideLeaderTransfer, leaders.go).
// LeaderLoads is its last view, for Status and /metrics. Before the node
// stops, HandOver (handover.go) tells the others it may not lead and
// hands every leadership it holds over, to targets that keep them
// balanced (the pure PlanLeaderHandOver).
package replicas
