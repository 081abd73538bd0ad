package jepsen

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/client"
	"github.com/norn-dev/norn/jepsen/check"
)

// Replication is the cluster's replication factor N (-replication): the
// write quorum that reaches every replica, whatever the number of nodes.
const Replication = 3

// Ports every node uses on its own address 127.0.0.(10+i).
const (
	apiPort    = 7400
	raftPort   = 7401
	gossipPort = 7402
	probePort  = 7409 // the harness's probe listener on each node's address
	uidBase    = 64010
)

// ClusterConfig describes the cluster under test.
type ClusterConfig struct {
	Nodes int // node slots: 3 or 5
	// Initial is how many nodes (n1..nInitial) form the cluster; 0 means
	// all. The others are spares: prepared (uid, data dir, iptables, probe
	// listener) but started only by StartSpare, without -bootstrap-expect,
	// gossiping with the cluster until they are joined.
	Initial     int
	Partitions  int      // power of two, for example 8
	Bin         string   // the nornd binary
	Dir         string   // data dirs and logs go under it
	Hooks       bool     // start nornd with -test-hooks
	Bugs        []string // seeded bugs (-test-bug), only with Hooks
	ExtraArgs   []string // more nornd flags (they win over the defaults)
	RaftTimeout time.Duration
	SkewBuffer  time.Duration
	// MaxClockOffset is nornd's -max-clock-offset; default 9/20 of the
	// skew buffer (900 ms for 2 s), below the most the buffer covers
	// ((buffer - 100 ms) / 2: two nodes in bound can be twice it apart).
	MaxClockOffset time.Duration
	// Insecure runs the nodes in cleartext, without the access file;
	// by default they run secure (secure.go).
	Insecure bool
}

// Node is one nornd process of the cluster.
type Node struct {
	Index   int // 1-based
	ID      string
	IP      string
	API     string
	DataDir string
	LogPath string
	UID     int

	cfg    *ClusterConfig
	join   []string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	paused bool

	Tasks nornv1connect.TaskServiceClient
	// Connect is the node's TaskService over connect alone (HTTP, not
	// framed), as the workload's client.
	Connect nornv1connect.TaskServiceClient
	// Forwarding is the node's TaskService as another node calls it (in
	// the secure cluster with that node's certificate): a node takes the
	// forwarding headers (Norn-Hops) from nodes only.
	Forwarding nornv1connect.TaskServiceClient
	Admin      nornv1connect.AdminServiceClient
	Queues     nornv1connect.QueueServiceClient
	hc         *http.Client
	sec        *security // nil: cleartext
	// clockMoved is the cluster's (Cluster.ClockMoved).
	clockMoved *atomic.Bool
}

// url is the address of path on n's API.
func (n *Node) url(path string) string {
	if n.sec != nil {
		return "https://" + n.API + path
	}
	return "http://" + n.API + path
}

// Cluster is the set of nodes under test.
type Cluster struct {
	Cfg   ClusterConfig
	sec   *security // nil with Cfg.Insecure
	Nodes []*Node   // every slot, spares included
	// DataRoot holds the nodes' data dirs (linked from Cfg.Dir/data).
	DataRoot string

	mu     sync.Mutex
	active []*Node // see Active
	// clockMoved is set once a node's clock was set off the machine's
	// (SetClock): checkers that compare the nodes' clocks with the
	// history's then allow the skew buffer.
	clockMoved atomic.Bool
}

// ClockMoved reports whether some node's clock was set off the
// machine's during the run.
func (c *Cluster) ClockMoved() bool { return c.clockMoved.Load() }

// NodeIP is node i's loopback address.
func NodeIP(i int) string { return fmt.Sprintf("127.0.0.%d", 10+i) }

// NewCluster prepares (does not start) the nodes.
func NewCluster(cfg ClusterConfig) (*Cluster, error) {
	if cfg.Partitions == 0 {
		cfg.Partitions = 8
	}
	if cfg.RaftTimeout == 0 {
		cfg.RaftTimeout = 500 * time.Millisecond
	}
	if cfg.SkewBuffer == 0 {
		cfg.SkewBuffer = 2 * time.Second
	}
	if cfg.MaxClockOffset == 0 {
		cfg.MaxClockOffset = cfg.SkewBuffer * 9 / 20
	}
	if cfg.Initial <= 0 || cfg.Initial > cfg.Nodes {
		cfg.Initial = cfg.Nodes
	}
	c := &Cluster{Cfg: cfg}
	// The nodes run as their own uids, which must reach their data dirs:
	// those live under a world-traversable temporary directory, not under
	// the results directory (its parents may be private, as mktemp -d
	// makes them); results/data links to it.
	dataRoot, err := os.MkdirTemp("", "norn-jepsen-data-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dataRoot, 0o755); err != nil {
		return nil, err
	}
	c.DataRoot = dataRoot
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 5 * time.Second}}
	var adminHC *http.Client
	if !cfg.Insecure {
		if c.sec, err = newSecurity(filepath.Join(dataRoot, "certs"), cfg.Nodes); err != nil {
			return nil, fmt.Errorf("jepsen: certificates: %w", err)
		}
		hc, adminHC = c.sec.httpClient(), c.sec.adminHTTPClient()
	}
	for i := 1; i <= cfg.Nodes; i++ {
		n := &Node{Index: i, ID: fmt.Sprintf("n%d", i), IP: NodeIP(i), UID: uidBase + i, cfg: &c.Cfg, hc: hc, sec: c.sec, clockMoved: &c.clockMoved}
		n.API = fmt.Sprintf("%s:%d", n.IP, apiPort)
		n.DataDir = filepath.Join(dataRoot, n.ID)
		n.LogPath = filepath.Join(cfg.Dir, "logs", n.ID+".log")
		if c.sec != nil {
			n.Tasks, n.Admin = c.sec.clients(hc, adminHC, n.API)
			n.Connect = nornv1connect.NewTaskServiceClient(hc, "https://"+n.API)
			peerHC, err := c.sec.nodeHTTPClient(fmt.Sprintf("n%d", i%cfg.Nodes+1))
			if err != nil {
				return nil, fmt.Errorf("jepsen: certificates: %w", err)
			}
			n.Forwarding = nornv1connect.NewTaskServiceClient(peerHC, "https://"+n.API)
			n.Queues = nornv1connect.NewQueueServiceClient(adminHC, "https://"+n.API, client.BearerToken(c.sec.token))
		} else {
			n.Queues = nornv1connect.NewQueueServiceClient(hc, "http://"+n.API)
			n.Connect = nornv1connect.NewTaskServiceClient(hc, "http://"+n.API)
			n.Forwarding = n.Connect
			// The hot calls travel framed, as the Go client sends them.
			n.Tasks = client.NewFramedTaskService(nornv1connect.NewTaskServiceClient(hc, "http://"+n.API), n.API)
			n.Admin = nornv1connect.NewAdminServiceClient(hc, "http://"+n.API)
		}
		c.Nodes = append(c.Nodes, n)
	}
	c.active = append([]*Node(nil), c.Nodes[:cfg.Initial]...)
	// Every node joins through the initial nodes' gossip addresses (a
	// spare learns of the other spares from them).
	for _, n := range c.Nodes {
		for _, o := range c.Nodes[:cfg.Initial] {
			if o != n {
				n.join = append(n.join, fmt.Sprintf("%s:%d", o.IP, gossipPort))
			}
		}
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.Symlink(dataRoot, filepath.Join(cfg.Dir, "data")); err != nil {
		return nil, err
	}
	for _, n := range c.Nodes {
		if err := os.MkdirAll(n.DataDir, 0o700); err != nil {
			return nil, err
		}
		if err := os.Chown(n.DataDir, n.UID, n.UID); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Active returns the nodes that currently take part in the run, in slot
// order: the initial nodes, the spares the scenario started, less the
// nodes it retired (decommissioned and stopped). Clients, the drain, the
// final read, readiness, convergence, leader lookups, the nemeses' picks
// and the heal use these. Without spares it is every node. The slice is
// fresh.
func (c *Cluster) Active() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Node(nil), c.active...)
}

// IsActive reports whether n is among Active.
func (c *Cluster) IsActive(n *Node) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.active, n)
}

// Activate adds n to Active (a spare once started).
func (c *Cluster) Activate(n *Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.active, n) {
		c.active = append(c.active, n)
		slices.SortFunc(c.active, func(a, b *Node) int { return a.Index - b.Index })
	}
}

// Retire removes n from Active (a node that left the ring, before it is
// stopped): nothing picks it any more and the heal does not restart it.
func (c *Cluster) Retire(n *Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active = slices.DeleteFunc(c.active, func(x *Node) bool { return x == n })
}

// Spares returns the node slots beyond the initial ones.
func (c *Cluster) Spares() []*Node { return c.Nodes[c.Cfg.Initial:] }

// Start starts the initial nodes and waits until each is healthy and
// every partition has a leader.
func (c *Cluster) Start(timeout time.Duration) error {
	for _, n := range c.Active() {
		if err := n.Start(); err != nil {
			return err
		}
	}
	return c.WaitReady(timeout)
}

// StartSpare starts spare n (it gossips with the cluster, not a ring
// member yet), waits until it answers /healthz, and adds it to Active
// (even when it did not become healthy within timeout: the heal and the
// checkers then see it).
func (c *Cluster) StartSpare(n *Node, timeout time.Duration) error {
	if err := n.Start(); err != nil {
		return err
	}
	defer c.Activate(n)
	deadline := time.Now().Add(timeout)
	for !n.Healthy() {
		if !n.Running() {
			return fmt.Errorf("%s exited (see its log)", n.ID)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not healthy after %s", n.ID, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// WaitReady waits until every running active node is healthy and sees a
// leader for every partition it replicates, and every ring member holding
// replicas replicates some.
func (c *Cluster) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if last = c.ready(); last == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("cluster not ready after %s: %w", timeout, last)
}

func (c *Cluster) ready() error {
	for _, n := range c.Active() {
		if !n.Running() {
			continue
		}
		if !n.Healthy() {
			return fmt.Errorf("%s not healthy", n.ID)
		}
		st, err := n.Status(context.Background(), false)
		if err != nil {
			return fmt.Errorf("%s status: %w", n.ID, err)
		}
		if st.RingEpoch == 0 {
			return fmt.Errorf("%s has no ring yet", n.ID)
		}
		// A node outside the ring (a spare not joined yet), or a member
		// the ring gives no replica (drained), legitimately replicates
		// no partition.
		if holdsReplicas(st, n.ID) && len(st.Partitions) == 0 {
			return fmt.Errorf("%s replicates no partition yet", n.ID)
		}
		for _, p := range st.Partitions {
			if p.Leader == "" {
				return fmt.Errorf("%s sees no leader for partition %d", n.ID, p.Id)
			}
		}
	}
	return nil
}

// holdsReplicas reports whether st (node id's own Status) shows id as a
// ring member the placement gives replicas.
func holdsReplicas(st *nornv1.StatusResponse, id string) bool {
	if len(st.Nodes) == 0 {
		return true // a single node: it holds everything
	}
	for _, nd := range st.Nodes {
		if nd.Id == id {
			return check.InRing(nd.Role) && nd.Replicas > 0
		}
	}
	return false
}

// Leaders returns, as the first answering active node sees it, the node
// leading each partition it replicates.
func (c *Cluster) Leaders() (map[uint32]string, error) {
	var errs []error
	for _, n := range c.Active() {
		if !n.Running() || n.Paused() {
			continue
		}
		st, err := n.Status(context.Background(), false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out := map[uint32]string{}
		for _, p := range st.Partitions {
			out[p.Id] = p.Leader
		}
		return out, nil
	}
	return nil, fmt.Errorf("no node answered Status: %w", errors.Join(errs...))
}

// TopLeader returns the active node leading the most partitions (the
// first active node when Status does not answer).
func (c *Cluster) TopLeader() *Node {
	active := c.Active()
	ls, err := c.Leaders()
	if err != nil {
		return active[0]
	}
	count := map[string]int{}
	for _, l := range ls {
		count[l]++
	}
	best := active[0]
	for _, n := range active {
		if count[n.ID] > count[best.ID] {
			best = n
		}
	}
	return best
}

// Node returns the node with this id, or nil.
func (c *Cluster) Node(id string) *Node {
	for _, n := range c.Nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// NodeByAPI returns the node whose API address is addr, or nil.
func (c *Cluster) NodeByAPI(addr string) *Node {
	for _, n := range c.Nodes {
		if n.API == addr {
			return n
		}
	}
	return nil
}

// RemoveData removes the nodes' data dirs and the link to them (after
// Stop).
func (c *Cluster) RemoveData() error {
	os.Remove(filepath.Join(c.Cfg.Dir, "data"))
	return os.RemoveAll(c.DataRoot)
}

// Stop kills every node.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		n.Kill()
	}
}

// HasTestHooks reports whether the nornd binary knows -test-hooks.
func HasTestHooks(bin string) bool {
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	return strings.Contains(string(out), "test-hooks")
}

// BuildNornd builds ./cmd/nornd of the module at root into dir, with the
// test hooks (build tag testhooks): clock, power loss and seeded bugs.
func BuildNornd(root, dir string) (string, error) {
	bin := filepath.Join(dir, "nornd")
	cmd := exec.Command("go", "build", "-tags", "testhooks", "-o", bin, "./cmd/nornd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/nornd: %v\n%s", err, out)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		return "", err
	}
	return bin, nil
}

// MetaLeader returns the active node that leads the meta group, as the
// first node that answers Status knows it; nil when none knows one.
func (c *Cluster) MetaLeader() *Node {
	for _, n := range c.Active() {
		if !n.Running() || n.Paused() {
			continue
		}
		st, err := n.Status(context.Background(), false)
		if err != nil || st.GetMetaLeader() == "" {
			continue
		}
		return c.Node(st.GetMetaLeader())
	}
	return nil
}
