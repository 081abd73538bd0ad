package transport

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// Headers of node-to-node calls.
const (
	HeaderNode    = "Norn-Node"    // the calling node's id
	HeaderCluster = "Norn-Cluster" // the calling node's cluster id
	// HeaderHops marks a TaskService or AdminService call forwarded by
	// another node (its value counts the hops), so the receiver does not
	// forward it again.
	HeaderHops = "Norn-Hops"
	// HeaderEpoch is the calling node's ring epoch: a replica refuses
	// writes of a moving partition from a caller whose ring does not know
	// the move yet, and either side pulls the newer ring.
	HeaderEpoch = "Norn-Epoch"
	// HeaderClaimFloor is the lowest priority a forwarded claim takes
	// (the forwarding node weighed the leaders' heads).
	HeaderClaimFloor = "Norn-Claim-Floor"
	// HeaderClaimIDs names the tasks a forwarded claim takes, and no
	// other (comma-separated decimal ids): the forwarding node picked
	// them by their fairness keys.
	HeaderClaimIDs = "Norn-Claim-Ids"
	// HeaderClaimOwner marks a worker's claim of a limited queue passed
	// on toward the queue's owner (dispatch, limits.go): not a proxied
	// claim, it claims across the cluster and waits.
	HeaderClaimOwner = "Norn-Claim-Owner"
)

// peerHeaders are the headers only a node may send: from a client they
// would make a call look forwarded (StripPeerHeaders).
var peerHeaders = []string{HeaderNode, HeaderCluster, HeaderHops, HeaderEpoch, HeaderClaimFloor, HeaderClaimIDs, HeaderClaimOwner}

// StripPeerHeaders removes from h the headers of node-to-node calls: a
// client's call that set them is served as the client's own (not a
// forwarded one that looks at this node's partitions only, names the
// tasks it takes or skips forwarding).
func StripPeerHeaders(h http.Header) {
	for _, k := range peerHeaders {
		h.Del(k)
	}
}

// Peer is a node's connection to another node's API.
type Peer struct {
	Addr  string
	Peer  nornv1connect.PeerServiceClient
	Tasks nornv1connect.TaskServiceClient
	Admin nornv1connect.AdminServiceClient
	Queue nornv1connect.QueueServiceClient
}

// PeersConfig configures a node's Peers.
type PeersConfig struct {
	// NodeID is this node's id, sent with every peer request.
	NodeID string
	// APIAddr is this node's API address: calls leave from its IP when it
	// is a specific one (see Peers.Get).
	APIAddr string
	// TLS, when set, is this node's certificate and CA bundle: peers'
	// API ports are called over TLS 1.3 with it (HTTP/2 by ALPN), and
	// must present a node certificate of the CA. Nil: cleartext (h2c).
	TLS *Certs
	// Interceptors wrap every connect call to a peer (the node's RPC
	// metrics), the first outermost.
	Interceptors []connect.Interceptor
	// ObserveRPC, when set, is told of every framed call made through
	// RPC's clients once it returns: its method, when it started and its
	// error (nil: it succeeded). It runs on the caller's goroutine and
	// must be cheap.
	ObserveRPC RPCObserver
}

// RPCObserver is told of one framed call: its method, when it started
// and its outcome (a *connect.Error's code, or nil).
type RPCObserver func(m RPCMethod, start time.Time, err error)

// RingSource returns this node's cluster id and ring epoch ("" and 0
// before the cluster is formed), sent with every peer request.
type RingSource func() (clusterID string, epoch uint64)

// Peers holds one Peer per API address, made on first use, sharing one
// HTTP/2 (h2c) transport. Safe for concurrent use.
type Peers struct {
	cfg   PeersConfig
	ring  atomic.Pointer[RingSource] // nil until SetRing
	once  sync.Once
	hc    *http.Client
	tr    *http.Transport
	mu    sync.Mutex
	peers map[string]*Peer
	rpcs  map[string]*RPCClient // by Raft address
}

// NewPeers returns an empty set; connections are made on first use.
func NewPeers(cfg PeersConfig) *Peers { return &Peers{cfg: cfg} }

// SetRing sets where requests take the cluster id and ring epoch they
// carry (the node's part that holds the ring sets it as it starts); until
// then they carry neither.
func (s *Peers) SetRing(src RingSource) { s.ring.Store(&src) }

// Get returns the peer at API address addr.
func (s *Peers) Get(addr string) *Peer {
	s.once.Do(func() {
		var p http.Protocols
		var tlsConf *tls.Config
		if s.cfg.TLS != nil {
			p.SetHTTP2(true)
			tlsConf = s.cfg.TLS.ClientConfig([]string{"h2"}, "")
		} else {
			p.SetUnencryptedHTTP2(true)
		}
		// Calls leave from this node's API IP when it is a specific one:
		// peers check the caller's address against its API address, and
		// on a host with several addresses (nodes on loopback aliases
		// 127.0.0.x) the kernel would pick another source.
		d := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 10 * time.Second}
		if host, _, err := net.SplitHostPort(s.cfg.APIAddr); err == nil {
			if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
				d.LocalAddr = &net.TCPAddr{IP: ip}
			}
		}
		s.tr = &http.Transport{
			Protocols:           &p,
			DialContext:         d.DialContext,
			TLSClientConfig:     tlsConf,
			TLSHandshakeTimeout: 2 * time.Second,
			HTTP2: &http.HTTP2Config{
				// A peer that stops answering (paused, cut off) is noticed
				// within seconds even on an idle connection.
				SendPingTimeout: 5 * time.Second,
				PingTimeout:     3 * time.Second,
			},
		}
		s.hc = &http.Client{Transport: s.tr}
		s.peers = map[string]*Peer{}
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.peers[addr]; ok {
		return p
	}
	// No gzip between nodes: a node's CPU, not the network, is what a
	// large answer (a proxied claim, anti-entropy entries) costs.
	opts := []connect.ClientOption{connect.WithGRPC(), connect.WithAcceptCompression("gzip", nil, nil), connect.WithSendMaxBytes(64 << 20), connect.WithReadMaxBytes(64 << 20)}
	opts = append(opts, connect.WithInterceptors(append([]connect.Interceptor{identify{s}}, s.cfg.Interceptors...)...))
	base := "http://" + addr
	if s.cfg.TLS != nil {
		base = "https://" + addr
	}
	p := &Peer{
		Addr:  addr,
		Peer:  nornv1connect.NewPeerServiceClient(s.hc, base, opts...),
		Tasks: nornv1connect.NewTaskServiceClient(s.hc, base, opts...),
		Admin: nornv1connect.NewAdminServiceClient(s.hc, base, opts...),
		Queue: nornv1connect.NewQueueServiceClient(s.hc, base, opts...),
	}
	s.peers[addr] = p
	return p
}

// RPC returns the framed-call client of the node whose Raft port is at
// raftAddr. Its connections leave from this node's API IP, as the HTTP
// calls do (the peer checks the caller's address).
func (s *Peers) RPC(raftAddr string) *RPCClient {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.rpcs[raftAddr]; ok {
		return c
	}
	var local net.Addr
	if host, _, err := net.SplitHostPort(s.cfg.APIAddr); err == nil {
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
			local = &net.TCPAddr{IP: ip}
		}
	}
	if s.rpcs == nil {
		s.rpcs = map[string]*RPCClient{}
	}
	c := NewRPCClient(raftAddr, local, s.cfg.TLS)
	c.observe = s.cfg.ObserveRPC
	s.rpcs[raftAddr] = c
	return c
}

// Meta is this node's identity for a framed call: what Request puts in
// the headers of a connect call.
func (s *Peers) Meta() RPCMeta {
	m := RPCMeta{Node: s.cfg.NodeID}
	if src := s.ring.Load(); src != nil {
		m.Cluster, m.Epoch = (*src)()
	}
	return m
}

// Close closes the idle connections and the framed-call connections.
func (s *Peers) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tr != nil {
		s.tr.CloseIdleConnections()
	}
	for _, c := range s.rpcs {
		c.Close()
	}
}

// Request wraps a node-to-node request with this node's identity (its
// id, cluster id and ring epoch).
func Request[T any](s *Peers, msg *T) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set(HeaderNode, s.cfg.NodeID)
	if src := s.ring.Load(); src != nil {
		if cid, epoch := (*src)(); cid != "" {
			req.Header().Set(HeaderCluster, cid)
			req.Header().Set(HeaderEpoch, strconv.FormatUint(epoch, 10))
		}
	}
	return req
}

// identify names this node (and its cluster) on every call it makes to
// another node, as Request does for PeerService: a forwarded TaskService,
// AdminService or QueueService call needs it too, since over cleartext a
// node with an access file knows a peer by its name and address alone
// (over TLS, by its certificate).
type identify struct{ s *Peers }

func (i identify) set(h http.Header) {
	if h.Get(HeaderNode) == "" {
		h.Set(HeaderNode, i.s.cfg.NodeID)
	}
	if src := i.s.ring.Load(); src != nil && h.Get(HeaderCluster) == "" {
		if cid, _ := (*src)(); cid != "" {
			h.Set(HeaderCluster, cid)
		}
	}
}

func (i identify) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		i.set(req.Header())
		return next(ctx, req)
	}
}

func (i identify) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		i.set(conn.RequestHeader())
		return conn
	}
}

func (i identify) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Unary makes one PeerService call with this node's identity and returns
// the answer's message.
func Unary[Req, Resp any](ctx context.Context, s *Peers, msg *Req,
	call func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) (*Resp, error) {
	resp, err := call(ctx, Request(s, msg))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// Hops is how often a request was forwarded already.
func Hops[T any](req *connect.Request[T]) int {
	h, _ := strconv.Atoi(req.Header().Get(HeaderHops))
	return h
}

// Forwarded returns msg as a request forwarded by this node, hopsSoFar
// forwards after the client's.
func Forwarded[T any](msg *T, hopsSoFar int) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set(HeaderHops, strconv.Itoa(hopsSoFar+1))
	return req
}

// SameHost reports whether hostport's host is the address ip.
func SameHost(hostport string, ip net.IP) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	other := net.ParseIP(host)
	return other != nil && other.Equal(ip)
}

// FormatIDs writes ids as HeaderClaimIDs carries them.
func FormatIDs(ids []uint64) string {
	b := make([]byte, 0, 20*len(ids))
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, id, 10)
	}
	return string(b)
}

// ParseIDs reads HeaderClaimIDs: at most max ids.
func ParseIDs(s string, max int) ([]uint64, error) {
	parts := strings.Split(s, ",")
	if len(parts) > max {
		return nil, fmt.Errorf("%d ids, more than the %d claimed", len(parts), max)
	}
	out := make([]uint64, len(parts))
	for i, p := range parts {
		id, err := strconv.ParseUint(p, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("%q is not a task id", p)
		}
		out[i] = id
	}
	return out, nil
}
