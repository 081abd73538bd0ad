package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// logFSM records the commands it applies.
type logFSM struct {
	mu  sync.Mutex
	got []string
}

func (f *logFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, string(l.Data))
	return nil
}
func (f *logFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("no snapshots") }
func (f *logFSM) Restore(io.ReadCloser) error         { return errors.New("no snapshots") }
func (f *logFSM) entries() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

func newMux(t *testing.T, cfg MuxConfig) *RaftMux {
	t.Helper()
	m, err := ListenRaftMux("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// member is one node's Raft instance of one group.
type member struct {
	r   *raft.Raft
	fsm *logFSM
	tr  *raft.NetworkTransport
}

// startGroup starts group id on every mux, bootstrapped by the first.
func startGroup(t *testing.T, muxes []*RaftMux, id uint32) []*member {
	t.Helper()
	var servers []raft.Server
	for i, m := range muxes {
		servers = append(servers, raft.Server{ID: raft.ServerID(fmt.Sprint("n", i)), Address: raft.ServerAddress(m.Addr().String())})
	}
	var out []*member
	for i, m := range muxes {
		stream, err := m.Register(id)
		if err != nil {
			t.Fatal(err)
		}
		tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream: stream, MaxPool: 2, Timeout: time.Second, Logger: hclog.NewNullLogger(),
		})
		cfg := raft.DefaultConfig()
		cfg.LocalID = servers[i].ID
		cfg.HeartbeatTimeout = 200 * time.Millisecond
		cfg.ElectionTimeout = 200 * time.Millisecond
		cfg.LeaderLeaseTimeout = 100 * time.Millisecond
		cfg.CommitTimeout = 10 * time.Millisecond
		cfg.Logger = hclog.NewNullLogger()
		fsm := &logFSM{}
		store := raft.NewInmemStore()
		r, err := raft.NewRaft(cfg, fsm, store, store, raft.NewInmemSnapshotStore(), tr)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
				t.Fatal(err)
			}
		}
		mem := &member{r: r, fsm: fsm, tr: tr}
		t.Cleanup(func() {
			mem.r.Shutdown().Error()
			mem.tr.Close()
		})
		out = append(out, mem)
	}
	return out
}

// leader waits for the group to elect a leader.
func leader(t *testing.T, ms []*member) *member {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range ms {
			if m.r.State() == raft.Leader {
				return m
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader within 10s")
	return nil
}

// waitEntries waits until every member applied want.
func waitEntries(t *testing.T, ms []*member, want []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, m := range ms {
		for !slices.Equal(m.fsm.entries(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("entries %v, want %v", m.fsm.entries(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// Two Raft groups over the same three muxes elect, replicate and apply
// independently: each group's entries reach exactly its own FSMs.
func TestMuxCarriesIndependentGroups(t *testing.T) {
	muxes := []*RaftMux{newMux(t, MuxConfig{}), newMux(t, MuxConfig{}), newMux(t, MuxConfig{})}
	g1 := startGroup(t, muxes, 1)
	g2 := startGroup(t, muxes, MetaGroup)
	for i := range 5 {
		if err := leader(t, g1).r.Apply([]byte(fmt.Sprint("a", i)), time.Second).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if err := leader(t, g2).r.Apply([]byte("meta"), time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	waitEntries(t, g1, []string{"a0", "a1", "a2", "a3", "a4"})
	waitEntries(t, g2, []string{"meta"})
}

// expectRefused dials group id at addr and checks that the mux closes the
// connection instead of handing it to a group.
func expectRefused(t *testing.T, addr string, id uint32) {
	t.Helper()
	c, err := DialGroup(addr, id, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); !closedByPeer(err) {
		t.Fatalf("connection for group %d not refused: read %d bytes, %v", id, n, err)
	}
}

// expectAccepted dials group id at addr and checks that g accepts the
// connection: g's side writes a byte that the dialer reads.
func expectAccepted(t *testing.T, g *GroupStream, addr string, id uint32) {
	t.Helper()
	go func() {
		if c, err := g.Accept(); err == nil {
			c.Write([]byte{1})
			c.Close()
		}
	}()
	c, err := DialGroup(addr, id, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatalf("connection for group %d not accepted: %v", id, err)
	}
}

// closedByPeer reports whether a read error means the other side closed
// the connection (a reset when it closed with our bytes unread).
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// A connection for a group that is not registered, or no longer is, is
// closed; the group's id can be registered again afterwards.
func TestMuxRefusesUnknownAndClosedGroups(t *testing.T) {
	m := newMux(t, MuxConfig{})
	addr := m.Addr().String()
	expectRefused(t, addr, 7)

	g, err := m.Register(7)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Register(7); !errors.Is(err, ErrGroupExists) {
		t.Fatalf("second Register: %v", err)
	}
	expectAccepted(t, g, addr, 7)

	g.Close() // the first step of a group's shutdown
	if _, err := g.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	expectRefused(t, addr, 7)
	if _, err := m.Register(7); err != nil {
		t.Fatalf("Register after Close: %v", err)
	}
}

// Garbage instead of a header, and a client that sends nothing, are
// closed, and the mux keeps serving.
func TestMuxRefusesBadHandshakes(t *testing.T) {
	m := newMux(t, MuxConfig{HandshakeTimeout: 100 * time.Millisecond})
	addr := m.Addr().String()
	for _, hdr := range [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n"), nil} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if hdr != nil {
			c.Write(hdr)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !closedByPeer(err) {
			t.Errorf("header %q: read %v, want the connection closed by the mux", hdr, err)
		}
		c.Close()
	}
	g, err := m.Register(1)
	if err != nil {
		t.Fatal(err)
	}
	expectAccepted(t, g, addr, 1) // after the bad ones
}

// Allow refuses connections from addresses that are not members.
func TestMuxAllow(t *testing.T) {
	var mu sync.Mutex
	allowed := false
	m := newMux(t, MuxConfig{Allow: func(net.Addr) bool { mu.Lock(); defer mu.Unlock(); return allowed }})
	g, err := m.Register(3)
	if err != nil {
		t.Fatal(err)
	}
	expectRefused(t, m.Addr().String(), 3)
	mu.Lock()
	allowed = true
	mu.Unlock()
	expectAccepted(t, g, m.Addr().String(), 3)
}

// n1Certs makes a CA and node n1's certificate for 127.0.0.1 in a
// temporary directory and loads them.
func n1Certs(tb testing.TB) *Certs {
	tb.Helper()
	dir := tb.TempDir()
	if err := CreateCA(dir, "test"); err != nil {
		tb.Fatal(err)
	}
	if err := CreateNodeCert(dir, "n1", []string{"127.0.0.1"}); err != nil {
		tb.Fatal(err)
	}
	cert, key := NodeCertFiles(dir, "n1")
	certs, err := LoadCerts(TLSFiles{CA: filepath.Join(dir, CACertFile), Cert: cert, Key: key})
	if err != nil {
		tb.Fatal(err)
	}
	return certs
}

// FuzzMuxHandshake feeds arbitrary first bytes to a mux's handshake, in
// cleartext and under TLS (the bytes then stand for the ClientHello): no
// input may panic, and a connection is handed to a group only when its
// header names that group.
func FuzzMuxHandshake(f *testing.F) {
	f.Add(binary.BigEndian.AppendUint32(append([]byte(nil), muxMagic...), 1))
	f.Add(binary.BigEndian.AppendUint32(append([]byte(nil), muxMagic...), 7))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00})
	certs := n1Certs(f)
	var muxes []*RaftMux
	for _, c := range []*Certs{nil, certs} {
		m, err := ListenRaftMux("127.0.0.1:0", MuxConfig{TLS: c, HandshakeTimeout: 50 * time.Millisecond})
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { m.Close() })
		muxes = append(muxes, m)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range muxes {
			g, err := m.Register(1)
			if err != nil {
				t.Fatal(err)
			}
			client, server := net.Pipe()
			m.mu.Lock()
			m.conns[server] = struct{}{}
			m.wg.Add(1)
			m.mu.Unlock()
			done := make(chan struct{})
			go func() { m.handshake(server); close(done) }()
			go func() {
				client.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				client.Write(data)
				io.Copy(io.Discard, client) // the TLS server's answers
			}()
			select {
			case c := <-g.conns: // the handshake waits for this Accept
				<-done
				want := binary.BigEndian.AppendUint32(append([]byte(nil), muxMagic...), 1)
				if m.cfg.TLS != nil || len(data) < len(want) || !bytes.Equal(data[:len(want)], want) {
					t.Fatalf("a connection with header %x reached group 1", data)
				}
				c.Close()
			case <-done:
			}
			client.Close()
			g.Close()
		}
	})
}

// ProbeNode completes a handshake only with the node it names, over TLS;
// a cleartext port or another node's certificate fails it.
func TestProbeNode(t *testing.T) {
	dir := t.TempDir()
	if err := CreateCA(dir, "probe"); err != nil {
		t.Fatal(err)
	}
	load := func(id string) *Certs {
		if err := CreateNodeCert(dir, id, []string{"127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
		cert, key := NodeCertFiles(dir, id)
		c, err := LoadCerts(TLSFiles{CA: filepath.Join(dir, CACertFile), Cert: cert, Key: key})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	n1, n2 := load("n1"), load("n2")
	m := newMux(t, MuxConfig{TLS: n1})
	plain := newMux(t, MuxConfig{})
	addr := m.Addr().String()
	if err := ProbeNode(addr, "n1", nil, n2, time.Second); err != nil {
		t.Fatalf("probe of n1 at its address: %v", err)
	}
	if err := ProbeNode(addr, "n3", nil, n2, time.Second); err == nil {
		t.Fatal("n1's port passed a probe for n3")
	}
	if err := ProbeNode(plain.Addr().String(), "n1", nil, n2, time.Second); err == nil {
		t.Fatal("a cleartext port passed a probe for n1")
	}
	// A port where nothing listens.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := ln.Addr().String()
	ln.Close()
	if err := ProbeNode(free, "n1", nil, n2, time.Second); err == nil {
		t.Fatal("a closed port passed a probe")
	}
}

// TestGroupStreamCloseEndsDials: a Dial under way to a peer that does not
// answer returns when the group's stream closes, not at its timeout. A
// group's Shutdown waits for Raft's goroutines, and before this a whole
// cluster stopped at once (every peer gone) took a dial timeout per
// group to stop. The peer here takes the TCP connection and never
// answers the TLS handshake.
func TestGroupStreamCloseEndsDials(t *testing.T) {
	m := newMux(t, MuxConfig{TLS: n1Certs(t)})
	g, err := m.Register(1)
	if err != nil {
		t.Fatal(err)
	}
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := silent.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	dialed := make(chan error, 1)
	go func() {
		c, err := g.Dial(raft.ServerAddress(silent.Addr().String()), time.Minute)
		if c != nil {
			c.Close()
		}
		dialed <- err
	}()
	// The TCP connection is up and the handshake waits for the peer.
	var peer net.Conn
	select {
	case peer = <-accepted:
		defer peer.Close()
	case err := <-dialed:
		t.Fatalf("the dial ended before the peer took it: %v", err)
	}
	g.Close()
	select {
	case err := <-dialed:
		if err == nil {
			t.Fatal("the dial succeeded with a peer that never answered")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the dial was still waiting 10 s after its stream closed (its timeout is a minute)")
	}
}
