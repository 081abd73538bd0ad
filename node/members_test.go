package node

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"

	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/claims"
)

// member is one node of an in-process cluster: a real data dir, real
// Raft and gossip over TCP on 127.0.0.1, its API served over h2c.
type member struct {
	t    testing.TB
	cfg  Config
	node *Node
	srv  *http.Server
	ln   net.Listener
	api  nornv1connect.TaskServiceClient
	peer nornv1connect.PeerServiceClient
	// olderVersion makes the member answer as a node of a version
	// without PeerService.ReadyHeads does (404, connect's Unimplemented).
	olderVersion atomic.Bool
}

// testCluster starts k nodes that form one cluster (P=8, N=min(3,k)) and
// waits until every partition has a leader.
func testCluster(t *testing.T, k int) []*member {
	t.Helper()
	return testClusterWith(t, k, nil)
}

// testClusterWith is testCluster with tune (if not nil) changing node i's
// config before it starts.
func testClusterWith(t *testing.T, k int, tune func(i int, cfg *Config)) []*member {
	t.Helper()
	var ms []*member
	for i := range k {
		cfg := Config{
			DataDir: t.TempDir(), NodeID: fmt.Sprintf("n%d", i+1), MachineID: uint16(i + 1),
			Partitions: 8, BootstrapExpect: k, Replication: 3,
			SkewBuffer: testSkew, LeaseGrace: 5 * time.Second,
			RaftTimeout: 300 * time.Millisecond, WriteTimeout: 3 * time.Second,
			// Anti-entropy only where a test asks for it: otherwise a round
			// could repair what the test expects another mechanism (read
			// repair, replication) to repair.
			AntiEntropyInterval: time.Hour,
			Logger:              slog.New(slog.NewTextHandler(io.Discard, nil)),
			RaftLogger:          hclog.NewNullLogger(),
		}
		if i > 0 {
			cfg.Join = []string{ms[0].node.GossipAddr()}
		}
		if tune != nil {
			tune(i, &cfg)
		}
		ms = append(ms, startMember(t, cfg))
	}
	waitFor(t, 30*time.Second, "every node ready", func() bool {
		for _, m := range ms {
			if !m.node.Ready() {
				return false
			}
		}
		return true
	})
	return ms
}

func startMember(t *testing.T, cfg Config) *member {
	t.Helper()
	// A restarted member listens where it did before.
	addr := cmp.Or(cfg.APIAddr, "127.0.0.1:0")
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.APIAddr == "" || strings.HasSuffix(cfg.APIAddr, ":0") {
		cfg.APIAddr = ln.Addr().String()
	}
	n, err := New(cfg)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	hc := h2cClient()
	m := &member{t: t, cfg: cfg, node: n, ln: ln,
		api:  nornv1connect.NewTaskServiceClient(hc, "http://"+cfg.APIAddr, connect.WithGRPC()),
		peer: nornv1connect.NewPeerServiceClient(hc, "http://"+cfg.APIAddr, connect.WithGRPC()),
	}
	h := n.Handler()
	m.srv = &http.Server{Protocols: serverProtocols(), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == nornv1connect.PeerServiceReadyHeadsProcedure && m.olderVersion.Load() {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})}
	go m.srv.Serve(ln)
	t.Cleanup(m.stop)
	return m
}

// stop closes the member's server and node (idempotent).
func (m *member) stop() {
	if m.node == nil {
		return
	}
	m.srv.Close()
	if err := m.node.Close(); err != nil {
		m.t.Logf("close %s: %v", m.cfg.NodeID, err)
	}
	m.node = nil
}

// partitionRoles waits until one of ms leads partition p and returns it
// and the others.
func partitionRoles(t *testing.T, ms []*member, p uint16) (leader *member, others []*member) {
	t.Helper()
	leader = groupLeader(t, ms, p)
	for _, m := range ms {
		if m != leader {
			others = append(others, m)
		}
	}
	return leader, others
}

// groupLeader waits for a member that leads partition p's group and has
// applied every entry its predecessors committed (a Raft barrier): a new
// leader, after a restart or a failover, leads before its claim FSM is
// current, and what a test reads there could be stale.
func groupLeader(t *testing.T, ms []*member, p uint16) *member {
	t.Helper()
	var l *member
	waitFor(t, 10*time.Second, fmt.Sprintf("a leader of partition %d with its log applied", p), func() bool {
		for _, m := range ms {
			if m.node == nil {
				continue
			}
			if g := m.node.group(p); g != nil && g.IsLeader() && g.Barrier(time.Second) == nil {
				l = m
				return true
			}
		}
		return false
	})
	return l
}

// nodeIDAt returns the id of the member serving the API at addr, "" if
// none does.
func nodeIDAt(ms []*member, addr string) string {
	for _, m := range ms {
		if m.cfg.APIAddr == addr {
			return m.cfg.NodeID
		}
	}
	return ""
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Accessors the integration tests use to look inside a node's parts.

func (n *Node) partition(id uint64) uint16   { return n.host.Partition(id) }
func (n *Node) group(p uint16) *claims.Group { return n.host.Group(p) }
func (n *Node) groupList() []*claims.Group   { return n.host.Groups() }
