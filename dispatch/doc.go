// Package dispatch hands tasks to workers on one node: the CP side of the
// task API, on top of the claim FSM and the Raft groups of claims/.
//
// A Dispatcher works with the partitions this node leads (their groups
// come from replicas.Host) and reads task states through coord:
//
//	d := dispatch.New(dispatch.Config{Store: st, Host: h, Coord: c, Waiters: w, ...})
//	d.Start()                                 // monitor, ender, dependency checker
//	got, err := d.Claim(ctx, dispatch.ClaimRequest{Msg: m, Lease: 30 * time.Second, Max: 16, Wait: 10 * time.Second})
//	o, err := d.Propose(id, &claims.Command{Op: claims.OpRenew, ...})
//	defer d.Close()
//
// A claim (claim.go) merges the ready-index heads of the partitions this
// node leads (heads.go: priority, then age), checks each candidate
// (not terminal, no live claim, its time has come, its dependencies are
// completed), and proposes one OpClaim entry per partition, concurrently.
// On a cluster of several nodes it weighs its heads against the best
// claimable heads the other leaders report (remote.go, ReadyHeads,
// cached per queue for HeadsTTL), so that priority is strict across the
// cluster, and asks each leader for those of its heads that made the cut
// (a proxied claim with a priority floor, which looks at that leader's
// own groups only; forward.go), concurrently with its own proposals.
// With fairness keys (fair.go), heads of one priority go by their keys'
// start in this node's virtual time, the first head of each key in
// every partition's and leader's entries weighed, and the heads picked
// of another leader are named to it. When nothing is ready it
// waits on the queue's Waiters, which the store's ready index and the
// host's leader changes wake, and looks across the cluster again every
// ClaimRecheck.
//
// The monitor (monitor.go) runs every MonitorInterval: on a new
// leadership it extends every live claim to at least now + LeaseGrace;
// then it expires claims past their lease plus SkewBuffer (OpExpire, or
// OpEnd for a task already terminal; a task that reaches max_claims is
// aborted), promotes delayed tasks whose time has come, and deletes
// terminal tasks past Retention (ExpireBefore, which anti-entropy uses
// too).
//
// What a worker does under its claim (act.go: complete, abort, yield,
// update) is decided by the partition's group: Acts proposes one OpAct
// entry per partition, each act fenced by its claim's token at apply,
// and the claim's end, the task's terminal state and the worker's result
// are one decision, merged into the task on every replica. Only the
// partition's leader proposes; a node that cannot reach it refuses.
//
// The ender (ender.go) coalesces the claim ends of tasks that became
// terminal without a worker's act (cancels learned through Ended, which
// coord calls for tasks a merge made terminal; EndIfTerminal, for a task
// found terminal whose claim record does not say so yet) into one OpEnd
// entry per partition a few milliseconds later. A cancel the leader
// answers itself ends the claim before it is acknowledged (EndNow).
//
// Dependencies (deps.go): a task whose dependencies are not all completed
// is DELAYED; a dependency is looked up in a cache of terminal outcomes,
// then in this node's replica, and otherwise read from a majority of its
// replicas in the background by the dependency checker, which wakes the
// waiting claims when it finds one terminal.
//
// LoadClaimed is how a renew reads a task: a refusal rests on the
// partition leader's applied claim state, never on a replica that is
// behind.
package dispatch
