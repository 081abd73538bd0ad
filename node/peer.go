package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// Headers of node-to-node calls.
const (
	headerNode    = "Norn-Node"    // the calling node's id
	headerCluster = "Norn-Cluster" // the calling node's cluster id
	// headerHops marks a TaskService call forwarded by another node (its
	// value counts the hops), so the receiver does not forward it again.
	headerHops = "Norn-Hops"
	// headerEpoch is the calling node's ring epoch: a replica refuses
	// writes of a moving partition from a caller whose ring does not know
	// the move yet, and either side pulls the newer ring.
	headerEpoch = "Norn-Epoch"
)

// peer is this node's connection to another node's API.
type peer struct {
	addr   string
	peer   nornv1connect.PeerServiceClient
	tasks  nornv1connect.TaskServiceClient
	admin  nornv1connect.AdminServiceClient
	sender *replicaSender
}

// peerSet holds one peer per API address, made on first use, sharing one
// HTTP/2 transport.
type peerSet struct {
	n     *Node
	once  sync.Once
	hc    *http.Client
	tr    *http.Transport
	mu    sync.Mutex
	peers map[string]*peer
}

func (s *peerSet) get(addr string) *peer {
	s.once.Do(func() {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		// Calls leave from this node's API IP when it is a specific one:
		// peers check the caller's address against its API address
		// (checkPeer), and on a host with several addresses (nodes on
		// loopback aliases 127.0.0.x) the kernel would pick another source.
		d := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 10 * time.Second}
		if host, _, err := net.SplitHostPort(s.n.cfg.APIAddr); err == nil {
			if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
				d.LocalAddr = &net.TCPAddr{IP: ip}
			}
		}
		s.tr = &http.Transport{
			Protocols:   &p,
			DialContext: d.DialContext,
			HTTP2: &http.HTTP2Config{
				// A peer that stops answering (paused, cut off) is noticed
				// within seconds even on an idle connection.
				SendPingTimeout: 5 * time.Second,
				PingTimeout:     3 * time.Second,
			},
		}
		s.hc = &http.Client{Transport: s.tr}
		s.peers = map[string]*peer{}
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.peers[addr]; ok {
		return p
	}
	opts := []connect.ClientOption{connect.WithGRPC(), connect.WithSendMaxBytes(64 << 20), connect.WithReadMaxBytes(64 << 20)}
	base := "http://" + addr
	p := &peer{
		addr:  addr,
		peer:  nornv1connect.NewPeerServiceClient(s.hc, base, opts...),
		tasks: nornv1connect.NewTaskServiceClient(s.hc, base, opts...),
		admin: nornv1connect.NewAdminServiceClient(s.hc, base, opts...),
	}
	p.sender = newReplicaSender(s.n, p)
	s.peers[addr] = p
	return p
}

func (s *peerSet) close() {
	if s.tr != nil {
		s.tr.CloseIdleConnections()
	}
}

// peerRequest wraps a node-to-node request with this node's identity.
func peerRequest[T any](n *Node, msg *T) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set(headerNode, n.cfg.NodeID)
	if r := n.ring.Load(); r != nil {
		req.Header().Set(headerCluster, r.ClusterID)
		req.Header().Set(headerEpoch, strconv.FormatUint(r.Epoch, 10))
	}
	return req
}

// checkEpoch refuses a write of partition p from a caller whose ring
// (epoch) predates p's move under way (moving, the ring's moves under
// way): the caller would not write to the move's target, and the handoff
// could lose the write. The caller takes this node's ring and writes
// again.
func (n *Node) checkEpoch(epoch uint64, moving map[int]*cluster.Move, p uint16) error {
	if m := moving[int(p)]; m != nil && epoch < m.Epoch {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"partition %d is moving since ring epoch %d and %s (epoch %d); retry once it has the new ring",
			p, m.Epoch, staleRingRefusal, epoch))
	}
	return nil
}

// hostIs reports whether hostport's host is the address ip.
func hostIs(hostport string, ip net.IP) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	other := net.ParseIP(host)
	return other != nil && other.Equal(ip)
}

// peerService implements norn.v1.PeerService.
type peerService struct{ n *Node }

var _ nornv1connect.PeerServiceHandler = peerService{}

// checkPeer refuses a call that does not come from a node of this
// node's cluster: unknown node id, an address that is not that node's, or
// another cluster id. Before the cluster is formed, gossip members are
// accepted (GetRing).
func (n *Node) checkPeer(peerAddr string, h http.Header) error {
	id := h.Get(headerNode)
	deny := func(format string, args ...any) error {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("peer call refused: "+format, args...))
	}
	host, _, err := net.SplitHostPort(peerAddr)
	ip := net.ParseIP(host)
	if err != nil || ip == nil {
		return deny("unknown caller address %q", peerAddr)
	}
	sameHost := func(hostport string) bool { return hostIs(hostport, ip) }
	r := n.ring.Load()
	if r != nil {
		if c := h.Get(headerCluster); c != "" && c != r.ClusterID {
			return deny("the caller is in cluster %s, this node in %s", c, r.ClusterID)
		}
		if nd, ok := r.Node(id); ok && sameHost(nd.APIAddr) {
			return nil
		}
	}
	for _, m := range n.members.Members() {
		if m.ID == id && sameHost(m.APIAddr) && (r == nil || m.ClusterID == "" || m.ClusterID == r.ClusterID) {
			return nil
		}
	}
	return deny("%q at %s is not a member of this cluster", id, peerAddr)
}

// maxReplicate bounds the tasks of one Replicate call.
const maxReplicate = 10_000

func (s peerService) Replicate(_ context.Context, req *connect.Request[nornv1.ReplicateRequest]) (*connect.Response[nornv1.ReplicateResponse], error) {
	n := s.n
	if err := n.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	r := n.ring.Load()
	if r == nil {
		return nil, errNotFormed
	}
	states := req.Msg.GetTasks()
	if len(states) == 0 || len(states) > maxReplicate {
		return nil, invalid("tasks", "must hold 1 to %d tasks, got %d", maxReplicate, len(states))
	}
	// The caller's ring epoch: a newer one makes this node pull it.
	epoch, _ := strconv.ParseUint(req.Header().Get(headerEpoch), 10, 64)
	if epoch > r.Epoch {
		n.kickReconcile()
	}
	moving := r.MovesUnderway()
	tasks := make([]*crdt.Task, len(states))
	for i, b := range states {
		t, err := crdt.Decode(b)
		if err != nil {
			return nil, invalid(fmt.Sprintf("tasks[%d]", i), "%v", err)
		}
		if err := validateTask(t, n.cfg.Limits); err != nil {
			return nil, invalid(fmt.Sprintf("tasks[%d]", i), "%v", err)
		}
		p := n.partition(t.ID)
		if n.group(p) == nil {
			// The caller's ring and this node's disagree (a partition
			// moves): retryable, and the caller's next ring will tell.
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
				"tasks[%d]: partition %d is not replicated on %s (ring epoch %d)", i, p, n.cfg.NodeID, r.Epoch))
		}
		if err := n.checkEpoch(epoch, moving, p); err != nil {
			return nil, err
		}
		tasks[i] = t
	}
	if n.cfg.TestBugs.DropReplicatedWrite && n.replicatesIn.Add(1)%dropReplicateEvery == 0 {
		// The seeded bug: acknowledged, not stored.
		return connect.NewResponse(&nornv1.ReplicateResponse{}), nil
	}
	if err := n.mergeLocal(tasks); err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.ReplicateResponse{}), nil
}

// maxRead bounds the ids of one Read call.
const maxRead = 1000

func (s peerService) Read(_ context.Context, req *connect.Request[nornv1.ReadRequest]) (*connect.Response[nornv1.ReadResponse], error) {
	n := s.n
	if err := n.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	if n.ring.Load() == nil {
		return nil, errNotFormed
	}
	ids := req.Msg.GetIds()
	if len(ids) == 0 || len(ids) > maxRead {
		return nil, invalid("ids", "must hold 1 to %d ids, got %d", maxRead, len(ids))
	}
	out := make([]*nornv1.ReplicaTask, len(ids))
	for i, id := range ids {
		p := n.partition(id)
		g := n.group(p)
		if g == nil {
			return nil, n.notReplicated(fmt.Sprintf("ids[%d]", i), p)
		}
		rt := &nornv1.ReplicaTask{Leader: g.IsLeader()}
		t, err := n.store.TaskState(p, id)
		switch {
		case err == nil:
			rt.State = t.Encode()
		case !errors.Is(err, storage.ErrNotFound):
			return nil, apiError(err)
		}
		if rt.Leader {
			rec, err := n.store.ClaimFSMRecord(p, id)
			switch {
			case err == nil:
				rt.ClaimRecord = rec
			case !errors.Is(err, storage.ErrNotFound):
				return nil, apiError(err)
			}
		}
		out[i] = rt
	}
	return connect.NewResponse(&nornv1.ReadResponse{Tasks: out}), nil
}

func (s peerService) GetRing(_ context.Context, req *connect.Request[nornv1.GetRingRequest]) (*connect.Response[nornv1.GetRingResponse], error) {
	n := s.n
	if err := n.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	resp := &nornv1.GetRingResponse{}
	if r := n.ring.Load(); r != nil {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		resp.Ring = b
	}
	return connect.NewResponse(resp), nil
}

// decodeRecord decodes a claim record sent by a peer (nil when empty).
func decodeRecord(b []byte) (*claims.Record, error) {
	if len(b) == 0 {
		return nil, nil
	}
	return claims.DecodeRecord(b)
}
