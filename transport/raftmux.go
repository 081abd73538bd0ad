package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// muxMagic starts every connection to a RaftMux, before the group id.
var muxMagic = []byte("NRAFT\x01")

const muxHeaderLen = 6 + 4

// MetaGroup is the group id of the meta Raft group; partition groups use
// their partition number.
const MetaGroup uint32 = 0xFFFF_FFFF

// DefaultHandshakeTimeout bounds how long an accepted connection may take
// to send its header.
const DefaultHandshakeTimeout = 5 * time.Second

// ErrGroupExists is returned by Register for a group already registered.
var ErrGroupExists = errors.New("transport: raft group already registered")

// MuxConfig configures a RaftMux.
type MuxConfig struct {
	// Allow, when set, is asked about every accepted connection's remote
	// address; false closes the connection before its header is read.
	Allow func(remote net.Addr) bool
	// HandshakeTimeout bounds the header read. Default
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// Logger gets refused connections at debug level. Default: discard.
	Logger *slog.Logger
	// TLS, when set, makes every connection TLS 1.3 with node
	// certificates of its CA on both ends (RaftALPN); the group header
	// travels inside. A client or a user certificate is refused at the
	// handshake. Nil: cleartext.
	TLS *Certs
	// AllowNode, with TLS, is asked about the node a connection's
	// certificate names and its remote address; false closes it.
	AllowNode func(node string, remote net.Addr) bool
}

// RaftALPN is the ALPN protocol of the Raft port over TLS.
const RaftALPN = "norn-raft/1"

// RaftMux serves the Raft traffic of many groups on one listener.
type RaftMux struct {
	ln  net.Listener
	cfg MuxConfig

	mu     sync.Mutex
	groups map[uint32]*GroupStream
	closed bool
	conns  map[net.Conn]struct{} // accepted, header not read yet

	wg sync.WaitGroup
}

// ListenRaftMux listens on addr (host:port; port 0 picks one) and serves
// until Close.
func ListenRaftMux(addr string, cfg MuxConfig) (*RaftMux, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: raft listener: %w", err)
	}
	return NewRaftMux(ln, cfg), nil
}

// NewRaftMux serves on ln (which it owns) until Close.
func NewRaftMux(ln net.Listener, cfg MuxConfig) *RaftMux {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m := &RaftMux{ln: ln, cfg: cfg, groups: map[uint32]*GroupStream{}, conns: map[net.Conn]struct{}{}}
	m.wg.Add(1)
	go m.acceptLoop()
	return m
}

// Addr is the listener's address.
func (m *RaftMux) Addr() net.Addr { return m.ln.Addr() }

// Register adds group id and returns its stream layer, for
// raft.NewNetworkTransportWithConfig. Connections for the group are
// accepted from now until the stream is closed.
func (m *RaftMux) Register(id uint32) (*GroupStream, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, net.ErrClosed
	}
	if _, ok := m.groups[id]; ok {
		return nil, fmt.Errorf("%w: %d", ErrGroupExists, id)
	}
	g := &GroupStream{m: m, id: id, conns: make(chan net.Conn), done: make(chan struct{})}
	g.dialCtx, g.stopDials = context.WithCancel(context.Background())
	m.groups[id] = g
	return g, nil
}

// Close stops the listener, closes every group's stream and every
// connection still in its handshake, and waits for the mux's goroutines.
// Connections already handed to groups belong to their transports.
func (m *RaftMux) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	groups := make([]*GroupStream, 0, len(m.groups))
	for _, g := range m.groups {
		groups = append(groups, g)
	}
	for c := range m.conns {
		c.Close()
	}
	m.mu.Unlock()
	err := m.ln.Close()
	for _, g := range groups {
		g.Close()
	}
	m.wg.Wait()
	return err
}

func (m *RaftMux) acceptLoop() {
	defer m.wg.Done()
	var backoff time.Duration
	for {
		c, err := m.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient error (too many open files): wait, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			m.cfg.Logger.Warn("raft mux accept failed", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if m.cfg.Allow != nil && !m.cfg.Allow(c.RemoteAddr()) {
			m.cfg.Logger.Debug("raft connection refused: not a member", "remote", c.RemoteAddr())
			c.Close()
			continue
		}
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			c.Close()
			return
		}
		m.conns[c] = struct{}{}
		m.wg.Add(1)
		m.mu.Unlock()
		go m.handshake(c)
	}
}

// handshake reads c's header and hands c to its group.
func (m *RaftMux) handshake(c net.Conn) {
	defer m.wg.Done()
	raw := c
	var err error
	if m.cfg.TLS != nil {
		var tc net.Conn
		if tc, err = m.tlsHandshake(c); err == nil {
			c = tc
		}
	}
	var id uint32
	if err == nil {
		id, err = m.readHeader(c)
	}
	m.mu.Lock()
	delete(m.conns, raw)
	g := m.groups[id]
	m.mu.Unlock()
	if err != nil || g == nil {
		if err == nil {
			err = fmt.Errorf("no raft group %d here", id)
		}
		m.cfg.Logger.Debug("raft connection refused", "remote", c.RemoteAddr(), "err", err)
		c.Close()
		return
	}
	select {
	case g.conns <- c:
	case <-g.done:
		c.Close()
	}
}

// tlsHandshake runs the server side of c's TLS handshake within the
// handshake timeout.
func (m *RaftMux) tlsHandshake(c net.Conn) (net.Conn, error) {
	tc := tls.Server(c, m.cfg.TLS.ServerConfig([]string{RaftALPN}, true))
	if err := c.SetDeadline(time.Now().Add(m.cfg.HandshakeTimeout)); err != nil {
		return nil, err
	}
	if err := tc.Handshake(); err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	id, ok := IdentityOf(tc.ConnectionState())
	if !ok || id.Node == "" {
		return nil, errors.New("tls: not a node certificate")
	}
	if m.cfg.AllowNode != nil && !m.cfg.AllowNode(id.Node, c.RemoteAddr()) {
		return nil, fmt.Errorf("node %q is not a member at %s", id.Node, c.RemoteAddr())
	}
	return tc, c.SetDeadline(time.Time{})
}

func (m *RaftMux) readHeader(c net.Conn) (uint32, error) {
	if err := c.SetReadDeadline(time.Now().Add(m.cfg.HandshakeTimeout)); err != nil {
		return 0, err
	}
	var hdr [muxHeaderLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return 0, fmt.Errorf("header: %w", err)
	}
	if !bytes.Equal(hdr[:len(muxMagic)], muxMagic) {
		return 0, errors.New("header: not a norn raft connection")
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(hdr[len(muxMagic):]), nil
}

// GroupStream is one group's raft.StreamLayer on a RaftMux.
type GroupStream struct {
	m     *RaftMux
	id    uint32
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	// dialCtx ends when the stream closes: a Dial under way to a peer
	// that does not answer (a stopped container's address drops packets)
	// returns then, not at its timeout, so the group's Shutdown, which
	// waits for Raft's goroutines, is not held up by it.
	dialCtx   context.Context
	stopDials context.CancelFunc
}

var _ raft.StreamLayer = (*GroupStream)(nil)

// Accept returns the next connection for this group, or net.ErrClosed once
// the stream is closed.
func (g *GroupStream) Accept() (net.Conn, error) {
	select {
	case c := <-g.conns:
		return c, nil
	case <-g.done:
		return nil, net.ErrClosed
	}
}

// Close unregisters the group: the mux refuses its connections from now
// on. Connections accepted earlier stay open (the transport closes them).
func (g *GroupStream) Close() error {
	g.once.Do(func() {
		g.m.mu.Lock()
		if g.m.groups[g.id] == g {
			delete(g.m.groups, g.id)
		}
		g.m.mu.Unlock()
		close(g.done)
		g.stopDials()
	})
	return nil
}

// Addr is the mux's listener address.
func (g *GroupStream) Addr() net.Addr { return g.m.Addr() }

// Dial connects to the mux at address and names this group in the header.
// When the mux listens on a specific IP, the connection leaves from that
// IP: the peer's membership check (MuxConfig.Allow) matches the remote
// address against the members' Raft addresses, and on a host with several
// addresses (nodes on loopback aliases 127.0.0.x) the kernel would pick
// another source.
func (g *GroupStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return dialGroup(g.dialCtx, string(address), g.id, timeout, g.m.DialFrom(), g.m.cfg.TLS)
}

// DialFrom is the address connections to other muxes leave from: the
// mux's IP when it listens on a specific one, nil (the kernel's choice)
// otherwise.
func (m *RaftMux) DialFrom() net.Addr {
	if ta, ok := m.Addr().(*net.TCPAddr); ok && ta.IP != nil && !ta.IP.IsUnspecified() {
		return &net.TCPAddr{IP: ta.IP}
	}
	return nil
}

// RaftMuxHeader is the header that opens a stream of group id on a
// RaftMux (after the TLS handshake, when there is one).
func RaftMuxHeader(id uint32) []byte {
	return binary.BigEndian.AppendUint32(append([]byte(nil), muxMagic...), id)
}

// DialGroup connects to the cleartext RaftMux at address for group id.
func DialGroup(address string, id uint32, timeout time.Duration) (net.Conn, error) {
	return dialGroup(context.Background(), address, id, timeout, nil, nil)
}

// ProbeNode checks that the node at the TLS Raft port at address is
// node: it completes a TLS handshake there, from local (nil: any
// address), only if the certificate presented names node (a node
// certificate of certs' CA), and closes the connection before naming any
// group. The peer's mux checks this node's certificate the same way, so
// local must be this node's Raft IP.
func ProbeNode(address, node string, local net.Addr, certs *Certs, timeout time.Duration) error {
	d := net.Dialer{Timeout: timeout, LocalAddr: local}
	c, err := d.Dial("tcp", address)
	if err != nil {
		return err
	}
	defer c.Close()
	tc := tls.Client(c, certs.ClientConfig([]string{RaftALPN}, node))
	c.SetDeadline(time.Now().Add(timeout)) //nolint:errcheck // a failed handshake reports it
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("transport: raft TLS to %s: %w", address, err)
	}
	return nil
}

// dialGroup connects to the RaftMux at address for group id, over TLS
// with certs when they are set. It gives up when ctx ends.
func dialGroup(ctx context.Context, address string, id uint32, timeout time.Duration, local net.Addr, certs *Certs) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout, LocalAddr: local}
	c, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}
	if certs != nil {
		tc := tls.Client(c, certs.ClientConfig([]string{RaftALPN}, ""))
		if timeout > 0 {
			c.SetDeadline(time.Now().Add(timeout)) //nolint:errcheck // a failed handshake reports it
		}
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, fmt.Errorf("transport: raft TLS to %s: %w", address, err)
		}
		c.SetDeadline(time.Time{}) //nolint:errcheck
		c = tc
	}
	hdr := RaftMuxHeader(id)
	if timeout > 0 {
		if err := c.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
			c.Close()
			return nil, err
		}
	}
	if _, err := c.Write(hdr); err != nil {
		c.Close()
		return nil, fmt.Errorf("transport: raft header to %s: %w", address, err)
	}
	if err := c.SetWriteDeadline(time.Time{}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
