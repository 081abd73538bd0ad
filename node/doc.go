// Package node composes a nornd: the store, one claims.Group per partition,
// the task API (norn.v1.TaskService and AdminService over connect) and the
// leader's monitor. cmd/nornd is a thin main around it; tests and the
// jepsen harness start nodes from the same code.
//
//	n, err := node.New(node.Config{DataDir: dir})
//	defer n.Close()
//	srv := &http.Server{Addr: addr, Handler: n.Handler()} // h2c + HTTP/1.1
//
// Today a node is a single-node cluster: every partition's Raft group has
// this node as its only voter, and writes are acked after one synced write
// (N = 1). The request paths are the ones the cluster will use: enqueues and
// other task writes are CRDT merges; claims, renewals, yields, ends and
// expiries go through the partition's Raft group.
//
// Claim picks the best heads (priority, then id) from the ready indexes of
// the partitions the node leads and proposes one entry per partition;
// long-polling claims sleep on a per-queue channel that enqueues, yields,
// expiries and promotions close. The monitor (every MonitorInterval) first
// extends live claims when the node gains a partition's leadership, then
// expires claims whose lease plus skew buffer has passed, and promotes due
// delayed tasks. A claim takes a task with dependencies once they are
// COMPLETED, as the node's cache or replica says; dependencies neither
// decides are read from the cluster in the background (deps.go).
package node
