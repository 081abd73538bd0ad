package node

// The tests of package node are Norn's integration tests: they start real
// nodes (a real Pebble store in a temporary data dir, real Raft groups,
// gossip and PeerService over TCP on 127.0.0.1) through node.New, the
// same code nornd runs, and drive them through the API. The unit tests of
// each part live with the part (coord/, dispatch/, antientropy/, ...).
//
//	harness_test.go          one node with a hand-moved clock (newHarness)
//	members_test.go          in-process clusters of k nodes (testCluster)
//	rebalance_helpers_test.go  joiners, restarts, load while moving
//	node_test.go, api_test.go  the task API on one node
//	cluster_test.go, *_test.go the cluster's behaviours, one topic a file

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// fakeClock is the node's wall clock in tests, moved by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// harness is one node on a real data dir, served over real HTTP/2 on
// 127.0.0.1, with a connect client.
type harness struct {
	t     testing.TB
	dir   string
	clock *fakeClock
	node  *Node
	srv   *httptest.Server
	api   nornv1connect.TaskServiceClient
	admin nornv1connect.AdminServiceClient
	hc    *http.Client // HTTP/2 (h2c) client of srv
}

const testSkew = 2 * time.Second

func newHarness(t testing.TB, dir string, clock *fakeClock) *harness {
	t.Helper()
	return newHarnessWith(t, dir, clock, nil)
}

// newHarnessWith is newHarness with tune (if not nil) changing the node's
// config before it starts.
func newHarnessWith(t testing.TB, dir string, clock *fakeClock, tune func(*Config)) *harness {
	t.Helper()
	if clock == nil {
		clock = &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	}
	partitions := 8
	if _, bench := t.(*testing.B); bench {
		partitions = 64 // the production default
	}
	cfg := Config{
		DataDir: dir, Partitions: partitions, Clock: clock,
		SkewBuffer: testSkew, LeaseGrace: 5 * time.Second,
		MonitorInterval: time.Hour, // tests run monitor passes themselves
		SchedulePass:    time.Hour, // and schedule passes
		RaftTimeout:     50 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		RaftLogger:      hclog.NewNullLogger(),
	}
	if tune != nil {
		tune(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.WaitReady(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(n.Handler())
	srv.Config.Protocols = serverProtocols()
	srv.Start()
	h := &harness{t: t, dir: dir, clock: clock, node: n, srv: srv}
	hc := h2cClient()
	h.hc = hc
	h.api = nornv1connect.NewTaskServiceClient(hc, srv.URL, connect.WithGRPC())
	h.admin = nornv1connect.NewAdminServiceClient(hc, srv.URL)
	n.dispatch.MonitorOnce() // the leaderships' first pass: extend live claims
	t.Cleanup(h.close)
	return h
}

// serverProtocols are what nornd serves: HTTP/1.1 and h2c.
func serverProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// h2cClient speaks HTTP/2 with prior knowledge (h2c), as the client
// library does.
func h2cClient() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}}
}

func (h *harness) close() {
	if h.node == nil {
		return
	}
	h.srv.Close()
	if err := h.node.Close(); err != nil {
		h.t.Error(err)
	}
	h.node = nil
}

func (h *harness) enqueue(spec *nornv1.TaskSpec) uint64 {
	h.t.Helper()
	r, err := h.api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{Task: spec}))
	if err != nil {
		h.t.Fatal(err)
	}
	return r.Msg.Id
}

func (h *harness) claim(queue string, max uint32, lease time.Duration) []*nornv1.ClaimedTask {
	h.t.Helper()
	r, err := h.api.Claim(context.Background(), connect.NewRequest(&nornv1.ClaimRequest{
		Queue: queue, Worker: "w1", Max: max, Lease: durationpb.New(lease)}))
	if err != nil {
		h.t.Fatal(err)
	}
	return r.Msg.Tasks
}

func (h *harness) get(id uint64) *nornv1.Task {
	h.t.Helper()
	r, err := h.api.GetTask(context.Background(), connect.NewRequest(&nornv1.GetTaskRequest{Id: id}))
	if err != nil {
		h.t.Fatal(err)
	}
	return r.Msg.Task
}

func wantCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("err = %v, want code %v", err, code)
	}
}
