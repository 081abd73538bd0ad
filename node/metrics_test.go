package node

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/transport"
)

// scrape GETs url and parses the Prometheus text exposition.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("GET %s: Content-Type %q", url, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the exposition does not parse: %v", err)
	}
	return fams
}

// sample returns the value of the series of family name whose labels
// include want (a counter's or gauge's value, a histogram's count), and
// whether there is one.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// TestMetricsScrape scrapes a real node before and after tasks go through
// enqueue, claim and complete, over connect and over the framed calls:
// the exposition parses, and the RPC histograms, the task counters, the
// queue depth, a Pebble series and the Go runtime move.
func TestMetricsScrape(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	url := h.srv.URL + "/metrics"
	before := scrape(t, url)
	for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_cpu_seconds_total",
		"norn_pebble_read_amplification", "norn_pebble_wal_fsync_duration_seconds", "norn_disk_available_bytes",
		"norn_ring_epoch", "norn_raft_term", "norn_raft_apply_lag_entries"} {
		if before[name] == nil {
			t.Errorf("no %s before any call", name)
		}
	}
	if v, ok := sample(before, "norn_queue_tasks", map[string]string{"queue": "other", "status": "ready"}); !ok || v != 0 {
		t.Errorf("norn_queue_tasks{queue=other,status=ready} = %v, %v before any task", v, ok)
	}

	// Two tasks over connect, one over the framed calls.
	h.enqueue(&nornv1.TaskSpec{Queue: "mail"})
	h.enqueue(&nornv1.TaskSpec{Queue: "mail"})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rest, framedLn := transport.SplitListener(ln)
	defer rest.Close()
	framedSrv := h.node.ServeClientRPC(framedLn, nil)
	t.Cleanup(framedSrv.Close)
	framed := transport.NewClientRPCClient(ln.Addr().String())
	t.Cleanup(framed.Close)
	body, err := proto.Marshal(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "mail"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := framed.Call(ctx, transport.MethodEnqueue, transport.ClientCallMeta(ctx), body); err != nil {
		t.Fatalf("framed enqueue: %v", err)
	}
	mid := scrape(t, url)
	if v, _ := sample(mid, "norn_queue_tasks", map[string]string{"queue": "mail", "status": "ready"}); v != 3 {
		t.Errorf("norn_queue_tasks{queue=mail,status=ready} = %v after 3 enqueues, want 3", v)
	}

	h.clock.advance(1500 * time.Millisecond) // the tasks' age at claim
	got := h.claim("mail", 2, time.Minute)
	if len(got) != 2 {
		t.Fatalf("claimed %d tasks, want 2", len(got))
	}
	for _, ct := range got {
		if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: ct.GetTask().GetId(), ClaimId: ct.GetClaimId()})); err != nil {
			t.Fatal(err)
		}
	}
	// A call refused by validation counts with its code.
	_, err = h.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "mail", Worker: "", Lease: durationpb.New(time.Minute)}))
	wantCode(t, err, connect.CodeInvalidArgument)
	after := scrape(t, url)

	task := func(m, via, code string) map[string]string {
		l := map[string]string{"service": "norn.v1.TaskService", "method": m, "transport": via}
		if code != "" {
			l["code"] = code
		}
		return l
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"norn_rpc_server_calls_total", task("Enqueue", "connect", "ok"), 2},
		{"norn_rpc_server_calls_total", task("Enqueue", "framed", "ok"), 1},
		{"norn_rpc_server_calls_total", task("Claim", "connect", "ok"), 1},
		{"norn_rpc_server_calls_total", task("Claim", "connect", "invalid_argument"), 1},
		{"norn_rpc_server_calls_total", task("Complete", "connect", "ok"), 2},
		{"norn_rpc_server_duration_seconds", task("Enqueue", "connect", ""), 2},
		{"norn_rpc_server_duration_seconds", task("Enqueue", "framed", ""), 1},
		{"norn_rpc_server_duration_seconds", task("Claim", "connect", ""), 2},
		{"norn_rpc_server_duration_seconds", task("Complete", "connect", ""), 2},
		{"norn_tasks_enqueued_total", map[string]string{"queue": "mail"}, 3},
		{"norn_tasks_claimed_total", map[string]string{"queue": "mail"}, 2},
		{"norn_tasks_completed_total", map[string]string{"queue": "mail"}, 2},
		{"norn_tasks_aborted_total", map[string]string{"queue": "mail"}, 0},
		{"norn_task_age_at_claim_seconds", map[string]string{"queue": "mail"}, 2},
		{"norn_claim_wait_seconds", map[string]string{"result": "tasks"}, 1},
		{"norn_queue_tasks", map[string]string{"queue": "mail", "status": "ready"}, 1},
		{"norn_queue_tasks", map[string]string{"queue": "mail", "status": "completed"}, 2},
		{"norn_queue_tasks", map[string]string{"queue": "mail", "status": "claimed"}, 0},
	} {
		if v, ok := sample(after, c.name, c.labels); !ok || v != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	// Every claim went through Raft: its apply latency is observed.
	applied := 0
	for _, m := range after["norn_raft_apply_duration_seconds"].GetMetric() {
		applied += int(m.GetHistogram().GetSampleCount())
	}
	if applied < 1 || len(after["norn_raft_apply_duration_seconds"].GetMetric()) != 8 {
		t.Errorf("norn_raft_apply_duration_seconds: %d series counting %d proposals after a claim, want 8 (one per partition) and some",
			len(after["norn_raft_apply_duration_seconds"].GetMetric()), applied)
	}
	// The ages: 1.5 s on the node's clock.
	if f := after["norn_task_age_at_claim_seconds"]; f != nil {
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h.GetSampleCount() == 2 && (h.GetSampleSum() < 2.9 || h.GetSampleSum() > 3.1) {
				t.Errorf("ages at claim sum to %v s, want 3", h.GetSampleSum())
			}
		}
	}
	// Pebble and the Go runtime move with the writes.
	for _, name := range []string{"norn_pebble_wal_written_bytes_total", "norn_pebble_wal_fsync_duration_seconds", "go_memstats_alloc_bytes_total"} {
		b, _ := sample(before, name, nil)
		a, ok := sample(after, name, nil)
		if !ok || a <= b {
			t.Errorf("%s: %v before, %v after the tasks", name, b, a)
		}
	}
}

// TestMetricsQueueLabelsBounded: queues beyond the bound count under
// "other", and the exposition keeps the existing series' names.
func TestMetricsQueueLabelsBounded(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	const extra = 3
	var queues []string
	for i := range 32 + extra {
		queues = append(queues, "q"+string(rune('a'+i/26))+string(rune('a'+i%26)))
	}
	for _, q := range queues {
		h.enqueue(&nornv1.TaskSpec{Queue: q})
	}
	fams := scrape(t, h.srv.URL+"/metrics")
	if v, _ := sample(fams, "norn_tasks_enqueued_total", map[string]string{"queue": "other"}); v != extra {
		t.Errorf("norn_tasks_enqueued_total{queue=other} = %v, want %d", v, extra)
	}
	if v, _ := sample(fams, "norn_queue_tasks", map[string]string{"queue": "other", "status": "ready"}); v != extra {
		t.Errorf("norn_queue_tasks{queue=other,status=ready} = %v, want %d", v, extra)
	}
	labels := map[string]bool{}
	for _, m := range fams["norn_tasks_enqueued_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			labels[l.GetValue()] = true
		}
	}
	if len(labels) != 32+1 {
		t.Errorf("%d queue label values, want 33", len(labels))
	}
	// The series of the hand-written exposition, under their names (one
	// renamed: docs/OPERATIONS.md, Metrics changelog).
	for _, name := range []string{"norn_raft_term", "norn_raft_last_log_index", "norn_raft_commit_index",
		"norn_raft_applied_index", "norn_raft_fsm_pending", "norn_raft_peers", "norn_raft_state",
		"norn_raft_last_contact_seconds", "norn_spec_conflicts_total", "norn_read_repairs_total",
		"norn_dependencies_watched", "norn_dependencies_cached", "norn_antientropy_exchanges_total",
		"norn_antientropy_failures_total", "norn_antientropy_partitions_differing_total",
		"norn_antientropy_segments_differing_total", "norn_antientropy_tasks_pushed_total",
		"norn_antientropy_tasks_pulled_total", "norn_antientropy_bytes_sent_total",
		"norn_antientropy_bytes_received_total", "norn_antientropy_trees", "norn_antientropy_tree_bytes",
		"norn_clock_in_bound", "norn_clock_out_of_bound_total", "norn_clock_leadership_handovers_total",
		"norn_partition_leaders", "norn_partition_leader_share", "norn_leader_balance_transfers_total",
		"norn_leader_balance_failures_total", "norn_ring_epoch", "norn_members",
		"norn_claim_heads_reports_total", "norn_claim_heads_report_failures_total",
		"norn_claims_forwarded_total", "norn_claims_forwarded_short_total"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
}

// TestMetricsAcrossNodes: on a 3-node cluster, the peer calls count on
// both sides (framed replication, connect claims proxied to the other
// leaders), and a claimed task counts once in the cluster, on the node
// its worker called.
func TestMetricsAcrossNodes(t *testing.T) {
	ms := testCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const tasks = 24
	for range tasks {
		if _, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q"}})); err != nil {
			t.Fatal(err)
		}
	}
	claimed := 0
	for claimed < tasks && ctx.Err() == nil {
		r, err := ms[0].api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "q", Worker: "w", Max: tasks,
			Lease: durationpb.New(time.Minute), Wait: durationpb.New(time.Second)}))
		if err != nil {
			t.Fatal(err)
		}
		claimed += len(r.Msg.GetTasks())
	}
	var fams []map[string]*dto.MetricFamily
	for _, m := range ms {
		fams = append(fams, scrape(t, "http://"+m.cfg.APIAddr+"/metrics"))
	}
	sum := func(name string, labels map[string]string, nodes ...int) float64 {
		total := 0.0
		for _, i := range nodes {
			for _, m := range fams[i][name].GetMetric() {
				ok := true
				for _, l := range m.GetLabel() {
					if v, want := labels[l.GetName()]; want && v != l.GetValue() {
						ok = false
					}
				}
				if ok {
					total += m.GetCounter().GetValue()
				}
			}
		}
		return total
	}
	replicate := map[string]string{"service": "norn.v1.PeerService", "method": "Replicate", "transport": "framed", "code": "ok"}
	if v := sum("norn_rpc_client_calls_total", replicate, 0); v < 1 {
		t.Errorf("node 1 made %v framed Replicate calls after %d enqueues", v, tasks)
	}
	if v := sum("norn_rpc_server_calls_total", replicate, 1, 2); v < 1 {
		t.Errorf("nodes 2 and 3 answered %v framed Replicate calls", v)
	}
	proxied := map[string]string{"service": "norn.v1.TaskService", "method": "Claim", "transport": "connect", "code": "ok"}
	if c, s := sum("norn_rpc_client_calls_total", proxied, 0), sum("norn_rpc_server_calls_total", proxied, 1, 2); c < 1 || s < c {
		t.Errorf("claims proxied by node 1: %v made, %v answered by nodes 2 and 3", c, s)
	}
	// Node 1 asked the other leaders for their heads and forwarded the
	// claims of those that made the cut; it counts both.
	gauge := func(name string) float64 { return fams[0][name].GetMetric()[0].GetCounter().GetValue() }
	if r, f := gauge("norn_claim_heads_reports_total"), gauge("norn_claims_forwarded_total"); r < 1 || f < 1 {
		t.Errorf("node 1 counted %v reports of other leaders' heads and %v forwarded claims", r, f)
	}
	if v := sum("norn_tasks_claimed_total", map[string]string{"queue": "q"}, 0, 1, 2); v != float64(claimed) {
		t.Errorf("norn_tasks_claimed_total over the cluster = %v, %d claimed", v, claimed)
	}
	if v := sum("norn_tasks_enqueued_total", map[string]string{"queue": "q"}, 0, 1, 2); v != tasks {
		t.Errorf("norn_tasks_enqueued_total over the cluster = %v, want %d", v, tasks)
	}
}

// TestMetricsClaimEvents: renewals, cancels, the monitor's expiries and
// its aborts (max_claims) count by queue.
func TestMetricsClaimEvents(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	h.enqueue(&nornv1.TaskSpec{Queue: "jobs", MaxClaims: 1})
	h.enqueue(&nornv1.TaskSpec{Queue: "jobs", Priority: -1})
	got := h.claim("jobs", 2, time.Second)
	if len(got) != 2 {
		t.Fatalf("claimed %d tasks, want 2", len(got))
	}
	second := got[1]
	if got[0].GetTask().GetSpec().GetMaxClaims() != 1 {
		second = got[0]
	}
	if _, err := h.api.Renew(ctx, connect.NewRequest(&nornv1.RenewRequest{Id: second.GetTask().GetId(), ClaimId: second.GetClaimId(), Lease: durationpb.New(time.Hour)})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: second.GetTask().GetId()})); err != nil {
		t.Fatal(err)
	}
	h.clock.advance(time.Second + testSkew + time.Second)
	h.node.dispatch.MonitorOnce()
	fams := scrape(t, h.srv.URL+"/metrics")
	for name, want := range map[string]float64{"norn_claims_renewed_total": 1, "norn_tasks_cancelled_total": 1,
		"norn_claims_expired_total": 1, "norn_tasks_aborted_total": 1, "norn_tasks_claimed_total": 2} {
		if v, _ := sample(fams, name, map[string]string{"queue": "jobs"}); v != want {
			t.Errorf("%s{queue=jobs} = %v, want %v", name, v, want)
		}
	}
	if v, _ := sample(fams, "norn_queue_tasks", map[string]string{"queue": "jobs", "status": "aborted"}); v != 1 {
		t.Errorf("norn_queue_tasks{queue=jobs,status=aborted} = %v, want 1", v)
	}
}

// TestMetricsPartitionsWithoutLeader: norn_partitions_without_leader is 0
// on a formed cluster, and counts the node's partitions once they lose
// their leaders (two of three nodes stopped), while /healthz answers 503.
func TestMetricsPartitionsWithoutLeader(t *testing.T) {
	ms := testCluster(t, 3)
	url := "http://" + ms[0].cfg.APIAddr
	cohort := map[string]string{"replica": "cohort"}
	target := map[string]string{"replica": "move_target"}
	fams := scrape(t, url+"/metrics")
	for _, l := range []map[string]string{cohort, target} {
		if v, ok := sample(fams, "norn_partitions_without_leader", l); !ok || v != 0 {
			t.Fatalf("norn_partitions_without_leader%v = %v (present %v) on a ready cluster, want 0", l, v, ok)
		}
	}
	ms[1].stop()
	ms[2].stop()
	// Every partition has a replica on each of the 3 nodes (N=3).
	waitFor(t, 30*time.Second, "node 1's 8 partitions without a leader", func() bool {
		v, _ := sample(scrape(t, url+"/metrics"), "norn_partitions_without_leader", cohort)
		return v == 8
	})
	resp, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/healthz with every partition leaderless: %d, want 503", resp.StatusCode)
	}
}

// TestMetricsPartitionsFilling: while a move fills its replica on a
// joined node, that replica has no leader it knows of (it is no voter
// yet) and counts as move_target, which keeps the node unready, and not
// as cohort, which the alert on partitions without a leader reads.
func TestMetricsPartitionsFilling(t *testing.T) {
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		rebalanceTune(i, cfg)
		cfg.MaxMovesPerNode = 1
	})
	enqueueN(t, ms, 500)
	n4 := startJoiner(t, ms, 4)
	admin := adminClient(ms[0])
	joinAndRebalance(t, admin, "n4")
	waitFor(t, time.Minute, "a replica filling on n4 counted as move_target", func() bool {
		l, _ := n4.node.leaderless()
		return l.moveTarget > 0
	})
	waitMovesDone(t, metaLeader(t, []*member{ms[0], ms[1], ms[2], n4}), 2*time.Minute)
	waitFor(t, 10*time.Second, "no replica of n4 without a leader after the moves", func() bool {
		l, _ := n4.node.leaderless()
		return l == leaderlessCounts{} && n4.node.Ready()
	})
}
