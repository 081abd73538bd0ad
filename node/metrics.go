package node

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/norn-dev/norn/dispatch"
)

// raftGauges are the numeric fields of hashicorp/raft's Stats() exported
// per group. The library's own metrics (go-metrics) are process-global and
// carry no group label, so 64 groups would overwrite each other; Stats()
// is per group.
var raftGauges = []struct{ stat, name, help string }{
	{"term", "norn_raft_term", "Current Raft term of the group on this node."},
	{"last_log_index", "norn_raft_last_log_index", "Index of the last entry in this replica's log."},
	{"commit_index", "norn_raft_commit_index", "Highest index this replica knows committed."},
	{"applied_index", "norn_raft_applied_index", "Highest index applied to this replica's FSM."},
	{"fsm_pending", "norn_raft_fsm_pending", "Committed entries waiting for the FSM."},
	{"num_peers", "norn_raft_peers", "Other voters of the group."},
}

// raftStates maps Stats()'s state to a number for norn_raft_state.
var raftStates = map[string]int{"Follower": 0, "Candidate": 1, "Leader": 2, "Shutdown": 3}

// serveMetrics writes the node's metrics in the Prometheus text format.
func (n *Node) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	bw := bufio.NewWriter(w)
	n.writeMetrics(bw)
	bw.Flush()
}

func (n *Node) writeMetrics(w io.Writer) {
	type series struct {
		labels string
		stats  map[string]string
	}
	var groups []series
	if n.host.Meta() != nil {
		groups = append(groups, series{`group="meta"`, n.host.Meta().Stats()})
	}
	for p, g := range n.host.Groups() {
		if g != nil {
			groups = append(groups, series{fmt.Sprintf(`group="partition",partition="%d"`, p), g.Stats()})
		}
	}
	for _, gauge := range raftGauges {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n", gauge.name, gauge.help, gauge.name)
		for _, s := range groups {
			if v, err := strconv.ParseUint(s.stats[gauge.stat], 10, 64); err == nil {
				fmt.Fprintf(w, "%s{%s} %d\n", gauge.name, s.labels, v)
			}
		}
	}
	fmt.Fprintf(w, "# HELP norn_raft_state Raft role of the group on this node: 0 follower, 1 candidate, 2 leader, 3 shutdown.\n# TYPE norn_raft_state gauge\n")
	for _, s := range groups {
		if v, ok := raftStates[s.stats["state"]]; ok {
			fmt.Fprintf(w, "norn_raft_state{%s} %d\n", s.labels, v)
		}
	}
	fmt.Fprintf(w, "# HELP norn_raft_last_contact_seconds Time since this follower last heard from its leader (0 on the leader).\n# TYPE norn_raft_last_contact_seconds gauge\n")
	for _, s := range groups {
		if d, ok := lastContact(s.stats["last_contact"]); ok {
			fmt.Fprintf(w, "norn_raft_last_contact_seconds{%s} %g\n", s.labels, d.Seconds())
		}
	}

	counter := func(name, help string, v uint64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	counter("norn_spec_conflicts_total", "Merges that met two different specs for one task id (resolved by lowest digest).", n.coord.Stats().SpecConflicts)
	counter("norn_read_repairs_total", "Replicas sent a task's merged state because a read found them behind.", n.coord.Stats().ReadRepairs)
	gauge := func(name, help string, v int) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, help, name, name, v)
	}
	if n.dispatch != nil {
		ds := n.dispatch.DepStats()
		gauge("norn_dependencies_watched", "Dependencies of blocked tasks this node reads from their replicas in the background.", ds.Watched)
		gauge("norn_dependencies_cached", fmt.Sprintf("Dependencies this node knows terminal (cached for good, up to %d).", dispatch.DepCacheSize), ds.Cached)
	}
	n.writeAntiEntropyMetrics(w, counter, gauge)
	cs := n.clockGuard.Stats()
	cg, outs, transfers := cs.Check, cs.OutOfBound, cs.Transfers
	inBound := 0
	if cg.InBound {
		inBound = 1
	}
	gauge("norn_clock_in_bound", "1 while this node's clock is within max_clock_offset of the cluster median (or cannot be judged: fewer than three clocks measured), 0 while it is out of bound and leads nothing.", inBound)
	if cg.Known {
		fmt.Fprintf(w, "# HELP norn_clock_offset_seconds This node's clock minus the median of the alive nodes' clocks.\n# TYPE norn_clock_offset_seconds gauge\nnorn_clock_offset_seconds %g\n", cg.Offset.Seconds())
	}
	counter("norn_clock_out_of_bound_total", "Times this node's clock went beyond max_clock_offset from the cluster median.", outs)
	counter("norn_clock_leadership_handovers_total", "Leadership transfers this node started because its clock was out of bound.", transfers)
	n.writeLeaderMetrics(w, counter)
	epoch := uint64(0)
	if r := n.host.Ring(); r != nil {
		epoch = r.Epoch
	}
	fmt.Fprintf(w, "# HELP norn_ring_epoch Epoch of the ring this node works with (0: no cluster yet).\n# TYPE norn_ring_epoch gauge\nnorn_ring_epoch %d\n", epoch)
	if n.host.Members() != nil {
		byState := map[string]int{}
		for _, m := range n.host.Members().Members() {
			byState[m.State.String()]++
		}
		states := make([]string, 0, len(byState))
		for s := range byState {
			states = append(states, s)
		}
		sort.Strings(states)
		fmt.Fprintf(w, "# HELP norn_members Cluster members as gossip sees them, by state.\n# TYPE norn_members gauge\n")
		for _, s := range states {
			fmt.Fprintf(w, "norn_members{state=%q} %d\n", s, byState[s])
		}
	}
}

// lastContact parses Stats()'s last_contact: "never", "0" on a leader, or
// a duration.
func lastContact(s string) (time.Duration, bool) {
	switch {
	case s == "" || s == "never":
		return 0, false
	case s == "0":
		return 0, true
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	return d, err == nil
}

// writeAntiEntropyMetrics writes the anti-entropy counters, the trees'
// memory and, per partition, when its replicas were last seen equal.
func (n *Node) writeAntiEntropyMetrics(w io.Writer, counter func(string, string, uint64), gauge func(string, string, int)) {
	s := n.ae.Counters()
	counter("norn_antientropy_exchanges_total", "Anti-entropy rounds with a peer (one per peer, covering every shared partition).", s.Exchanges)
	counter("norn_antientropy_failures_total", "Anti-entropy rounds that ended with an error.", s.Failures)
	counter("norn_antientropy_partitions_differing_total", "Partitions whose tree roots differed at the start of a round.", s.Differing)
	counter("norn_antientropy_segments_differing_total", "Tree leaves (groups of segments) found differing.", s.Leaves)
	counter("norn_antientropy_tasks_pushed_total", "Task states sent to peers that lacked them or held older ones.", s.Pushed)
	counter("norn_antientropy_tasks_pulled_total", "Task states received from peers and merged here.", s.Pulled)
	counter("norn_antientropy_bytes_sent_total", "Bytes of anti-entropy requests (protobuf sizes, task states included).", s.BytesSent)
	counter("norn_antientropy_bytes_received_total", "Bytes of anti-entropy responses.", s.BytesRecv)
	trees, bytes := n.ae.Partitions()
	gauge("norn_antientropy_trees", "Partition replicas with a Merkle tree on this node.", trees)
	gauge("norn_antientropy_tree_bytes", "Memory of this node's Merkle trees.", bytes)
	converged := n.ae.Converged()
	parts := make([]uint16, 0, len(converged))
	for p := range converged {
		parts = append(parts, p)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
	fmt.Fprintf(w, "# HELP norn_antientropy_last_converged_seconds Unix time of the last round that found (or left) this partition's replica equal to a peer's.\n# TYPE norn_antientropy_last_converged_seconds gauge\n")
	for _, p := range parts {
		fmt.Fprintf(w, "norn_antientropy_last_converged_seconds{partition=\"%d\"} %d\n", p, converged[p].Unix())
	}
}

// writeLeaderMetrics writes every node's partition leaderships and fair
// share as the leader balancer last saw them, and its counters.
func (n *Node) writeLeaderMetrics(w io.Writer, counter func(string, string, uint64)) {
	loads := n.host.LeaderLoads()
	ids := slices.Sorted(maps.Keys(loads))
	fmt.Fprintf(w, "# HELP norn_partition_leaders Partition groups each node leads, as this node's leader balancer last saw them (its own exactly).\n# TYPE norn_partition_leaders gauge\n")
	for _, id := range ids {
		fmt.Fprintf(w, "norn_partition_leaders{node=%q} %d\n", id, loads[id].Leads)
	}
	fmt.Fprintf(w, "# HELP norn_partition_leader_share Each node's fair share of the partition leaderships (0 for a node that may not lead).\n# TYPE norn_partition_leader_share gauge\n")
	for _, id := range ids {
		fmt.Fprintf(w, "norn_partition_leader_share{node=%q} %g\n", id, loads[id].Share)
	}
	s := n.host.LeaderBalanceStats()
	counter("norn_leader_balance_transfers_total", "Leadership transfers this node started to balance leaderships.", s.Transfers)
	counter("norn_leader_balance_failures_total", "Leadership transfers this node started to balance leaderships that failed.", s.Failures)
}
