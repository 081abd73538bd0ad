// Package node is the composition root of a nornd: it opens the data dir
// and the store, builds the node's parts, wires them to each other, starts
// and stops them in order, and assembles the HTTP handler. It holds no
// logic of its own; cmd/nornd is a thin main around it, and the tests and
// the Jepsen harness start nodes from the same code.
//
//	n, err := node.New(node.Config{DataDir: dir, NodeID: "n1", APIAddr: addr, ...})
//	defer n.Close()
//	srv := &http.Server{Addr: addr, Handler: n.Handler()} // h2c + HTTP/1.1
//
// The parts, bottom up (docs/ARCHITECTURE.md has the map):
//
//	storage.Store          every replica's tasks, indexes and Raft logs (one Pebble)
//	replicas.Host          Raft listener, meta group, gossip, the ring, one claims.Group per partition here
//	coord.Coordinator      quorum writes, replica reads, routing, lists and counts (AP)
//	dispatch.Dispatcher    claims, long polls, the monitor, claim ends, dependencies (CP)
//	antientropy.Scheduler  Merkle trees and exchange rounds with peers, fills of moves
//	rebalance.Driver       placement calls and partition moves, on the meta leader
//	cluster.ClockGuard     judges this node's clock; hands leaderships over when out of bound
//	server.Server          the API edge: TaskService, AdminService, PeerService handlers
//
// and, beside them, the node's metrics: a Prometheus registry of its own
// (metrics.NewRegistry), made first so the parts' hooks (the connect
// interceptor, the framed-call wrappers, server.Config.Events, the
// dispatcher's and the groups' callbacks) report to it, and read at
// scrape time by node/metrics.go once every part exists.
//
// New builds them in the order their dependencies need (the store, the
// clock guard, anti-entropy and the rebalance driver before the host,
// whose callbacks reach them; coord, dispatch and server after it) and
// breaks the two cycles with closures: coord tells dispatch of tasks a
// merge made terminal (coord.Config.OnEnded), and anti-entropy asks
// dispatch for the retention horizon. Close stops them in the reverse
// order: waiting claims first, then the background loops, then the
// partition groups, then the store. A node about to stop calls HandOver
// first, while it still serves (nornd does on SIGTERM): its partition
// leaderships move to the others, so no partition waits for an election.
//
// Handler's API checks every call's caller before it reads its body and
// reads bodies through the node's two request budgets, the clients' and
// the peers' (admit.go); ServeClientRPC and the framed peer calls on the
// Raft port read frames through the same budgets.
//
// Config holds every setting of a node (cmd/nornd maps its flags onto
// it); each part takes the fields it needs in its own Config. TestBugs
// are the seeded bugs the Jepsen harness uses to show that its checkers
// can fail; they are all off in production.
package node
