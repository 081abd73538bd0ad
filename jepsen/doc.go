// Package jepsen is Norn's fault-injection harness (issue 6, first
// increment): it starts real nornd processes on their own loopback
// addresses, drives a workload of concurrent clients against them while
// nemeses inject faults (kill -9 and restart, SIGSTOP/SIGCONT, iptables
// partitions and flaky links, and, with nornd's test hooks, clock bumps
// and power loss), records the history, and checks it (package
// jepsen/check): linearizability per task with porcupine, the total queue
// (lost, unexpected, duplicates), exclusion in time of short leases,
// terminal stability, convergence of the replicas after heal, and
// liveness.
//
// Node i (1-based) listens on 127.0.0.(10+i): API on port 7400, Raft on
// 7401, gossip on 7402. Outgoing connections on loopback all leave from
// 127.0.0.1 whatever the node's address, so links are cut by process owner
// instead: node i runs as uid and gid 64010+i, and a cut between nodes a
// and b is a pair of iptables rules in the chain NORN-JEPSEN (jumped to
// from OUTPUT, where the owner match works) dropping every packet of a's
// uid to b's address and of b's uid to a's address, TCP and UDP alike.
// Every cut is proven by a probe run as a's uid: a TCP connect to a
// listener on b's address and a UDP datagram to it must both fail to get
// through (and both get through once healed). The chain is flushed and
// deleted at the end of a run, on failure and on SIGINT/SIGTERM.
//
// This package is the harness's runner and everything that acts on the
// cluster: scenarios and Run (run.go), the nodes (cluster.go), iptables
// cuts and probes (net.go), the nemeses (nemesis.go; aimed.go, those that
// strike right after an op; churn.go and admin.go, membership-churn), the
// workload (workload.go), the fault timeline (timeline.go), and the
// checkers that must poll the live cluster after the heal, convergence
// and placement (observe.go). The history it records and the checkers
// over it are in the sub-package jepsen/check, which is pure (no
// processes, no network): Run passes the recorded ops to it and collects
// its verdicts.
//
// The harness needs root (iptables, running nodes as other users) and
// Linux. See docs/JEPSEN.md for the scenarios, the checkers and how to
// read a run's results directory; cmd/norn-jepsen is the runner.
package jepsen
