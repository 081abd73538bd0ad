package node

import (
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/norn-dev/norn/dispatch"
	"github.com/norn-dev/norn/metrics"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// nodeMetrics is the node's registry (its own: tests run several nodes
// in one process) and the metrics its parts report to as they work. The
// parts' own counters are read at scrape time by nodeCollector.
type nodeMetrics struct {
	reg     *prometheus.Registry
	rpc     *metrics.RPC   // every call served and made
	tasks   *metrics.Tasks // task events by queue
	raft    *metrics.Raft  // the partition groups' apply latency
	handler http.Handler   // GET /metrics

	// scrapeMu orders scrapes before the store's Close: Close sets closed
	// under it, and a scrape reads the store only while closed is false.
	scrapeMu sync.RWMutex
	closed   bool

	descs sync.Map // nodeCollector's *prometheus.Desc by name and label names
}

func newNodeMetrics(cfg Config) *nodeMetrics {
	reg := metrics.NewRegistry()
	return &nodeMetrics{reg: reg, rpc: metrics.NewRPC(reg), tasks: metrics.NewTasks(reg),
		raft: metrics.NewRaft(reg, cfg.Partitions), handler: metrics.Handler(reg)}
}

// registerMetrics adds the collectors that read the node's parts, once they
// exist.
func (n *Node) registerMetrics() {
	n.metrics.reg.MustRegister(nodeCollector{n})
	fs := n.cfg.StorageFS
	if fs == nil {
		fs = vfs.Default
	}
	dbDir := filepath.Join(n.cfg.DataDir, "db")
	n.metrics.reg.MustRegister(metrics.NewPebble(n.store.Metrics, func() (vfs.DiskUsage, error) { return fs.GetDiskUsage(dbDir) }))
}

// closeMetrics makes later scrapes leave the store alone (it is about to
// close), after the scrapes under way.
func (n *Node) closeMetrics() {
	n.metrics.scrapeMu.Lock()
	n.metrics.closed = true
	n.metrics.scrapeMu.Unlock()
}

// nodeCollector exports the parts' counters and states, read at each
// scrape. It is an unchecked collector (Describe sends nothing): the
// meta group's Raft series carry no partition label where the partition
// groups' do, which a checked collector may not.
type nodeCollector struct{ n *Node }

func (nodeCollector) Describe(chan<- *prometheus.Desc) {}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	s := &sink{ch: ch, descs: &c.n.metrics.descs}
	n := c.n
	n.collectRaft(s)
	cs := n.coord.Stats()
	s.counter("norn_spec_conflicts_total", "Merges that met two different specs for one task id (resolved by lowest digest).", float64(cs.SpecConflicts))
	s.counter("norn_read_repairs_total", "Replicas sent a task's merged state because a read found them behind.", float64(cs.ReadRepairs))
	if n.dispatch != nil {
		ds := n.dispatch.DepStats()
		s.gauge("norn_dependencies_watched", "Dependencies of blocked tasks this node reads from their replicas in the background.", float64(ds.Watched))
		s.gauge("norn_dependencies_cached", fmt.Sprintf("Dependencies this node knows terminal (cached for good, up to %d).", dispatch.DepCacheSize), float64(ds.Cached))
		cl := n.dispatch.ClaimStats()
		s.counter("norn_claim_heads_reports_total", "Calls this node made to other leaders for the best ready tasks of a queue (strict priority across nodes).", float64(cl.Reports))
		s.counter("norn_claim_heads_report_failures_total", "Of those calls, the ones that failed.", float64(cl.ReportFailures))
		s.counter("norn_claims_forwarded_total", "Claims this node forwarded to other leaders for their tasks that made a claim's cut.", float64(cl.Forwarded))
		s.counter("norn_claims_forwarded_short_total", "Of those, the ones that got fewer tasks than the leader reported, or failed (taken meanwhile, or a leader change).", float64(cl.ForwardedShort))
	}
	n.collectAntiEntropy(s)
	n.collectBudgets(s)
	n.collectClock(s)
	n.collectLeaders(s)
	epoch := uint64(0)
	if r := n.host.Ring(); r != nil {
		epoch = r.Epoch
	}
	s.gauge("norn_ring_epoch", "Epoch of the ring this node works with (0: no cluster yet).", float64(epoch))
	if l, formed := n.leaderless(); formed {
		const help = "Partitions this node replicates that have no leader it knows of, by replica: cohort (the node is in the partition's cohort; " +
			"a group not open yet counts too), move_target (a replica a move is filling here: no leader reaches it before it joins the group, " +
			"so it counts for its whole fill). GET /healthz answers 503 while either is above 0. Absent before the cluster forms."
		s.gauge("norn_partitions_without_leader", help, float64(l.cohort), "replica", "cohort")
		s.gauge("norn_partitions_without_leader", help, float64(l.moveTarget), "replica", "move_target")
	}
	if n.host.Members() != nil {
		byState := map[string]int{}
		for _, m := range n.host.Members().Members() {
			byState[m.State.String()]++
		}
		for _, st := range slices.Sorted(maps.Keys(byState)) {
			s.gauge("norn_members", "Cluster members as gossip sees them, by state.", float64(byState[st]), "state", st)
		}
	}
	n.metrics.scrapeMu.RLock()
	defer n.metrics.scrapeMu.RUnlock()
	if !n.metrics.closed {
		n.collectQueues(s)
	}
}

// collectBudgets exports the request budgets (admit.go).
func (n *Node) collectBudgets(s *sink) {
	for _, b := range []struct {
		kind string
		b    *transport.Budget
	}{{"client", n.clientBudget}, {"peer", n.peerBudget}} {
		s.gauge("norn_request_inflight_bytes", "Bytes of requests this node holds (read, not yet answered), by kind: client (TaskService, AdminService, framed client calls) or peer (PeerService, framed peer calls).",
			float64(b.b.InUse()), "kind", b.kind)
		s.gauge("norn_request_inflight_limit_bytes", "The most norn_request_inflight_bytes may be (-max-inflight-client-bytes, -max-inflight-peer-bytes).",
			float64(b.b.Size()), "kind", b.kind)
		s.counter("norn_requests_over_budget_total", "Requests refused RESOURCE_EXHAUSTED because their bytes found no room in the node's budget within a second.",
			float64(b.b.Refused()), "kind", b.kind)
	}
}

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

const raftLagHelp = "Entries this replica knows committed and has not applied yet (commit index minus applied index), " +
	"per partition group with at most 16 partitions, else their sum under partition=\"all\"."

// collectRaft exports each group's Stats() with group and partition
// labels, and the commit-to-apply lag (per partition only when P is at
// most metrics.MaxPartitionLabels).
func (n *Node) collectRaft(s *sink) {
	type group struct {
		labels []string
		stats  map[string]string
	}
	var groups []group
	if n.host.Meta() != nil {
		groups = append(groups, group{[]string{"group", "meta"}, n.host.Meta().Stats()})
	}
	lags := map[string]float64{} // partition label -> lag
	for p, g := range n.host.Groups() {
		if g == nil {
			continue
		}
		st := g.Stats()
		groups = append(groups, group{[]string{"group", "partition", "partition", strconv.Itoa(p)}, st})
		lags[n.metrics.raft.PartitionLabel(p)] += raftLag(st)
	}
	for _, gauge := range raftGauges {
		for _, g := range groups {
			if v, err := strconv.ParseUint(g.stats[gauge.stat], 10, 64); err == nil {
				s.gauge(gauge.name, gauge.help, float64(v), g.labels...)
			}
		}
	}
	for _, g := range groups {
		if v, ok := raftStates[g.stats["state"]]; ok {
			s.gauge("norn_raft_state", "Raft role of the group on this node: 0 follower, 1 candidate, 2 leader, 3 shutdown.", float64(v), g.labels...)
		}
	}
	for _, g := range groups {
		if d, ok := lastContact(g.stats["last_contact"]); ok {
			s.gauge("norn_raft_last_contact_seconds", "Time since this follower last heard from its leader (0 on the leader).", d.Seconds(), g.labels...)
		}
	}
	if len(groups) > 0 && groups[0].labels[1] == "meta" {
		s.gauge("norn_raft_apply_lag_entries", raftLagHelp, raftLag(groups[0].stats), "group", "meta")
	}
	for _, p := range slices.Sorted(maps.Keys(lags)) {
		s.gauge("norn_raft_apply_lag_entries", raftLagHelp, lags[p], "group", "partition", "partition", p)
	}
}

// raftLag is a group's commit index minus its applied index.
func raftLag(stats map[string]string) float64 {
	c, err1 := strconv.ParseUint(stats["commit_index"], 10, 64)
	a, err2 := strconv.ParseUint(stats["applied_index"], 10, 64)
	if err1 != nil || err2 != nil || a >= c {
		return 0
	}
	return float64(c - a)
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

// collectAntiEntropy exports the anti-entropy counters, the trees'
// memory and, per partition, when its replicas were last seen equal.
func (n *Node) collectAntiEntropy(s *sink) {
	c := n.ae.Counters()
	s.counter("norn_antientropy_exchanges_total", "Anti-entropy rounds with a peer (one per peer, covering every shared partition).", float64(c.Exchanges))
	s.counter("norn_antientropy_failures_total", "Anti-entropy rounds that ended with an error.", float64(c.Failures))
	s.counter("norn_antientropy_partitions_differing_total", "Partitions whose tree roots differed at the start of a round.", float64(c.Differing))
	s.counter("norn_antientropy_segments_differing_total", "Tree leaves (groups of segments) found differing.", float64(c.Leaves))
	s.counter("norn_antientropy_tasks_pushed_total", "Task states sent to peers that lacked them or held older ones.", float64(c.Pushed))
	s.counter("norn_antientropy_tasks_pulled_total", "Task states received from peers and merged here.", float64(c.Pulled))
	s.counter("norn_antientropy_bytes_sent_total", "Bytes of anti-entropy requests (protobuf sizes, task states included).", float64(c.BytesSent))
	s.counter("norn_antientropy_bytes_received_total", "Bytes of anti-entropy responses.", float64(c.BytesRecv))
	trees, bytes := n.ae.Partitions()
	s.gauge("norn_antientropy_trees", "Partition replicas with a Merkle tree on this node.", float64(trees))
	s.gauge("norn_antientropy_tree_bytes", "Memory of this node's Merkle trees.", float64(bytes))
	converged := n.ae.Converged()
	for _, p := range slices.Sorted(maps.Keys(converged)) {
		s.gauge("norn_antientropy_last_converged_timestamp_seconds",
			"Unix time of the last round that found (or left) this partition's replica equal to a peer's.",
			float64(converged[p].Unix()), "partition", strconv.Itoa(int(p)))
	}
}

// collectClock exports the clock guard's judgement and counters.
func (n *Node) collectClock(s *sink) {
	cs := n.clockGuard.Stats()
	inBound := 0.0
	if cs.Check.InBound {
		inBound = 1
	}
	s.gauge("norn_clock_in_bound", "1 while this node's clock is within max_clock_offset of the cluster median (of its one measured peer's clock when it measures only one; always 1 alone in a cluster of one), 0 while it is out of bound or has measured no peer's clock, and leads nothing.", inBound)
	if cs.Check.Known {
		s.gauge("norn_clock_offset_seconds", "This node's clock minus the median of the alive nodes' clocks (minus its one measured peer's clock when it measures only one).", cs.Check.Offset.Seconds())
	}
	s.counter("norn_clock_out_of_bound_total", "Times this node's clock went beyond max_clock_offset from the cluster median.", float64(cs.OutOfBound))
	s.counter("norn_clock_leadership_handovers_total", "Leadership transfers this node started because its clock was out of bound.", float64(cs.Transfers))
}

// collectLeaders exports every node's partition leaderships and fair
// share as the leader balancer last saw them, and its counters.
func (n *Node) collectLeaders(s *sink) {
	loads := n.host.LeaderLoads()
	for _, id := range slices.Sorted(maps.Keys(loads)) {
		s.gauge("norn_partition_leaders", "Partition groups each node leads, as this node's leader balancer last saw them (its own exactly).", float64(loads[id].Leads), "node", id)
		s.gauge("norn_partition_leader_share", "Each node's fair share of the partition leaderships (0 for a node that may not lead).", loads[id].Share, "node", id)
	}
	st := n.host.LeaderBalanceStats()
	s.counter("norn_leader_balance_transfers_total", "Leadership transfers this node started to balance leaderships.", float64(st.Transfers))
	s.counter("norn_leader_balance_failures_total", "Leadership transfers this node started to balance leaderships that failed.", float64(st.Failures))
}

// queueStatuses are the status label values of norn_queue_tasks, by
// storage class (ClassOther counts as ready, as CountTasks does).
var queueStatuses = map[storage.Class]string{
	storage.ClassReady: "ready", storage.ClassWaiting: "waiting", storage.ClassDelayed: "delayed",
	storage.ClassClaimed: "claimed", storage.ClassCompleted: "completed", storage.ClassAborted: "aborted",
	storage.ClassCancelled: "cancelled", storage.ClassOther: "ready", storage.ClassDead: "dead",
}

// queueStatusOrder lists the status label values once each.
var queueStatusOrder = []string{"ready", "waiting", "delayed", "claimed", "completed", "aborted", "cancelled"}

// collectQueues exports the tasks of the partitions this node leads by
// queue and status, from the store's counters (storage.Store.Counts: one
// short span of keys per partition, no task is read). Every partition
// has one leader, so the sum over the nodes is the cluster's (for a
// moment around a leadership change a partition may count on two nodes,
// or none). Tasks waiting for dependencies count as waiting (CountTasks
// tells READY from DELAYED by their dependencies, one read each).
func (n *Node) collectQueues(s *sink) {
	depth := map[string]map[string]float64{} // queue label -> status -> tasks
	for p, g := range n.host.Groups() {
		if g == nil || !g.IsLeader() {
			continue
		}
		entries, err := n.store.Counts(uint16(p), "")
		if err != nil {
			continue // the store is failing; its own errors say so
		}
		for _, e := range entries {
			label := n.metrics.tasks.QueueLabel(e.Queue)
			if depth[label] == nil {
				depth[label] = map[string]float64{}
			}
			depth[label][queueStatuses[e.Class]] += float64(e.N)
		}
	}
	for _, q := range n.metrics.tasks.QueueLabels() {
		for _, st := range queueStatusOrder {
			s.gauge("norn_queue_tasks", "Tasks of the partitions this node leads, by queue and status (waiting: ready but with dependencies).", depth[q][st], "queue", q, "status", st)
		}
	}
}

// sink sends const metrics, with one Desc per name and label names made
// once per node (nodeMetrics.descs).
type sink struct {
	ch    chan<- prometheus.Metric
	descs *sync.Map
}

func (s *sink) send(t prometheus.ValueType, name, help string, v float64, kv []string) {
	names := make([]string, 0, len(kv)/2)
	values := make([]string, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		names = append(names, kv[i])
		values = append(values, kv[i+1])
	}
	key := name + "\xff" + strings.Join(names, "\xff")
	d, ok := s.descs.Load(key)
	if !ok {
		d, _ = s.descs.LoadOrStore(key, prometheus.NewDesc(name, help, names, nil))
	}
	s.ch <- prometheus.MustNewConstMetric(d.(*prometheus.Desc), t, v, values...)
}

// gauge sends a gauge; kv alternates label names and values.
func (s *sink) gauge(name, help string, v float64, kv ...string) {
	s.send(prometheus.GaugeValue, name, help, v, kv)
}

// counter sends a counter; kv alternates label names and values.
func (s *sink) counter(name, help string, v float64, kv ...string) {
	s.send(prometheus.CounterValue, name, help, v, kv)
}
