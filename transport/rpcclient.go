package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"
)

// RPCClient makes framed calls to one node's Raft port over one
// connection, dialed on first use and again after it fails. Safe for
// concurrent use.
type RPCClient struct {
	addr  string   // the peer's Raft (mux) address
	local net.Addr // the address calls leave from, nil: the kernel's choice
	// dial connects and names the service (the mux group's header, or
	// ClientRPCMagic on an API port).
	dial func(addr string, timeout time.Duration, local net.Addr) (net.Conn, error)
	// sendCancels: the server takes MethodCancel (the framed client calls).
	sendCancels bool
	// observe, when set, is told of every call (PeersConfig.ObserveRPC).
	observe RPCObserver

	mu          sync.Mutex
	conn        *rpcConn
	unsupported time.Time // until then, the peer is taken to serve no framed calls
}

// NewRPCClient returns a client of the mux at addr whose connections leave
// from local (nil: any address), over TLS with certs when set (the mux's
// MuxConfig.TLS).
func NewRPCClient(addr string, local net.Addr, certs *Certs) *RPCClient {
	return &RPCClient{addr: addr, local: local, dial: func(addr string, timeout time.Duration, local net.Addr) (net.Conn, error) {
		return dialGroup(context.Background(), addr, PeerRPCGroup, timeout, local, certs)
	}}
}

// NewClientRPCClient returns a client of the framed client calls on the
// API port at addr (SplitListener).
func NewClientRPCClient(addr string) *RPCClient {
	return &RPCClient{addr: addr, dial: dialClientRPC, sendCancels: true}
}

// NewClientRPCClientTLS returns a client of the framed client calls on
// the TLS API port at addr (TLSSplitListener): TLS with conf, ALPN
// FramedALPN, no magic. A node that does not offer FramedALPN is taken to
// serve no framed calls (ErrRPCUnsupported).
func NewClientRPCClientTLS(addr string, conf *tls.Config) *RPCClient {
	conf = conf.Clone()
	// h2 too: a TLS port without framed calls then completes the
	// handshake (with h2) instead of failing it, and the client learns the
	// node serves none.
	conf.NextProtos = []string{FramedALPN, "h2"}
	if conf.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			conf.ServerName = host
		}
	}
	return &RPCClient{addr: addr, sendCancels: true, dial: func(addr string, timeout time.Duration, local net.Addr) (net.Conn, error) {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout, LocalAddr: local}, "tcp", addr, conf)
		if err != nil {
			return nil, err
		}
		if c.ConnectionState().NegotiatedProtocol != FramedALPN {
			c.Close()
			return nil, ErrRPCUnsupported
		}
		return c, nil
	}}
}

func dialClientRPC(addr string, timeout time.Duration, local net.Addr) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout, LocalAddr: local}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c.SetWriteDeadline(time.Now().Add(timeout)) //nolint:errcheck // a failed write reports it
	if _, err := c.Write(ClientRPCMagic); err != nil {
		c.Close()
		return nil, err
	}
	c.SetWriteDeadline(time.Time{}) //nolint:errcheck
	return c, nil
}

// rpcDialTimeout bounds a dial and the peer's hello.
const rpcDialTimeout = 2 * time.Second

// unsupportedFor is how long a peer that refused framed calls is not
// asked again.
const unsupportedFor = time.Minute

// Call makes one call and returns the answer's body. Transport failures
// are UNAVAILABLE (the call may or may not have run); ErrRPCUnsupported
// when the peer serves no framed calls.
func (c *RPCClient) Call(ctx context.Context, m RPCMethod, meta RPCMeta, body []byte) ([]byte, error) {
	return c.CallLate(ctx, m, meta, body, nil)
}

// CallLate is Call, and when ctx ends before the answer, late (if not
// nil) is given the answer's body should the peer still answer with
// success, on a goroutine of its own: a caller that left can undo what
// the call did (a claim gives back the tasks it got). An answer lost with
// the connection is not given.
func (c *RPCClient) CallLate(ctx context.Context, m RPCMethod, meta RPCMeta, body []byte, late func([]byte)) ([]byte, error) {
	if c.observe == nil {
		return c.call(ctx, m, meta, body, late)
	}
	start := time.Now()
	out, err := c.call(ctx, m, meta, body, late)
	c.observe(m, start, err)
	return out, err
}

func (c *RPCClient) call(ctx context.Context, m RPCMethod, meta RPCMeta, body []byte, late func([]byte)) ([]byte, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	return conn.call(ctx, m, meta, body, late)
}

// Close closes the connection; later calls dial again.
func (c *RPCClient) Close() {
	c.mu.Lock()
	conn := c.conn
	c.conn = nil
	c.mu.Unlock()
	if conn != nil {
		conn.fail(net.ErrClosed)
	}
}

func (c *RPCClient) connection() (*rpcConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil && !c.conn.dead() {
		return c.conn, nil
	}
	if time.Now().Before(c.unsupported) {
		return nil, ErrRPCUnsupported
	}
	nc, err := c.dial(c.addr, rpcDialTimeout, c.local)
	if errors.Is(err, ErrRPCUnsupported) {
		c.unsupported = time.Now().Add(unsupportedFor)
		return nil, err
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("peer call to %s: %w", c.addr, err))
	}
	r := bufio.NewReaderSize(nc, 64<<10)
	nc.SetReadDeadline(time.Now().Add(rpcDialTimeout)) //nolint:errcheck // a failed read reports it
	hello, err := r.ReadByte()
	nc.SetReadDeadline(time.Time{}) //nolint:errcheck
	if err != nil || hello != rpcHello {
		nc.Close()
		var ne net.Error
		if errors.Is(err, io.EOF) || err == nil || (c.sendCancels && errors.As(err, &ne) && ne.Timeout()) {
			// The mux closed the connection unread: it has no such
			// group; an API port answered something else (an HTTP
			// error) or, for client calls, nothing in time.
			c.unsupported = time.Now().Add(unsupportedFor)
			return nil, ErrRPCUnsupported
		}
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("peer call to %s: %w", c.addr, err))
	}
	c.conn = newRPCConn(nc, r, c.sendCancels)
	return c.conn, nil
}

// rpcConn is one connection's pending calls.
type rpcConn struct {
	c           net.Conn
	w           *frameWriter
	nextID      atomic.Uint64
	sendCancels bool // send MethodCancel when a call's context ends first
	// untraced: the peer answered a traced frame UNIMPLEMENTED (an older
	// version): frames on this connection go untraced.
	untraced atomic.Bool

	mu      sync.Mutex
	pending map[uint64]chan rpcResult
	late    map[uint64]func([]byte) // calls left by their callers (CallLate)
	err     error                   // set once the connection failed
}

func newRPCConn(nc net.Conn, r *bufio.Reader, sendCancels bool) *rpcConn {
	rc := &rpcConn{c: nc, w: newFrameWriter(nc), sendCancels: sendCancels, pending: map[uint64]chan rpcResult{}, late: map[uint64]func([]byte){}}
	go rc.readLoop(r)
	return rc
}

func (rc *rpcConn) dead() bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.err != nil
}

func (rc *rpcConn) readLoop(r *bufio.Reader) {
	for {
		f, err := readFrame(r, maxRPCFrame)
		if err != nil {
			rc.fail(err)
			return
		}
		id, res, err := parseResponse(f)
		if err != nil {
			rc.fail(err)
			return
		}
		rc.mu.Lock()
		ch := rc.pending[id]
		delete(rc.pending, id)
		late := rc.late[id]
		delete(rc.late, id)
		rc.mu.Unlock()
		switch {
		case ch != nil:
			ch <- res
		case late != nil && res.err == nil:
			go late(res.body)
		}
	}
}

// fail ends the connection and every call waiting on it.
func (rc *rpcConn) fail(err error) {
	rc.mu.Lock()
	if rc.err != nil {
		rc.mu.Unlock()
		return
	}
	rc.err = err
	pending := rc.pending
	rc.pending, rc.late = nil, nil
	rc.mu.Unlock()
	rc.c.Close()
	rc.w.close()
	for _, ch := range pending {
		ch <- rpcResult{err: connect.NewError(connect.CodeUnavailable, fmt.Errorf("peer call to %s: connection lost: %w", rc.c.RemoteAddr(), err))}
	}
}

// call makes one call, traced when ctx holds a valid span context and the
// peer reads traced frames: one that answers a traced frame UNIMPLEMENTED
// gets the call again untraced (it did not run it), and untraced frames
// from then on.
func (rc *rpcConn) call(ctx context.Context, m RPCMethod, meta RPCMeta, body []byte, late func([]byte)) ([]byte, error) {
	meta.Trace = trace.SpanContext{}
	if !rc.untraced.Load() {
		meta.Trace = trace.SpanContextFromContext(ctx)
	}
	out, err := rc.callOnce(ctx, m, meta, body, late)
	if meta.Trace.IsValid() && connect.CodeOf(err) == connect.CodeUnimplemented {
		rc.untraced.Store(true)
		meta.Trace = trace.SpanContext{}
		return rc.callOnce(ctx, m, meta, body, late)
	}
	return out, err
}

func (rc *rpcConn) callOnce(ctx context.Context, m RPCMethod, meta RPCMeta, body []byte, late func([]byte)) ([]byte, error) {
	id := rc.nextID.Add(1)
	f, err := encodeRequest(id, m, meta, body)
	if err != nil {
		return nil, err
	}
	ch := make(chan rpcResult, 1)
	rc.mu.Lock()
	if rc.err != nil {
		err := rc.err
		rc.mu.Unlock()
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("peer call to %s: %w", rc.c.RemoteAddr(), err))
	}
	rc.pending[id] = ch
	rc.mu.Unlock()
	if err := rc.w.send(f); err != nil {
		rc.fail(err)
	}
	select {
	case res := <-ch:
		return res.body, res.err
	case <-ctx.Done():
		rc.mu.Lock()
		if rc.pending != nil {
			delete(rc.pending, id)
			if late != nil {
				rc.late[id] = late
			}
		}
		rc.mu.Unlock()
		if rc.sendCancels {
			// Best effort: the server's call ends early (a long poll
			// stops waiting).
			if f, err := encodeRequest(rc.nextID.Add(1), MethodCancel, RPCMeta{}, binary.BigEndian.AppendUint64(nil, id)); err == nil {
				rc.w.send(f) //nolint:errcheck // a dead connection cancels every call anyway
			}
		}
		code := connect.CodeCanceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			code = connect.CodeDeadlineExceeded
		}
		return nil, connect.NewError(code, fmt.Errorf("peer call to %s: %w", rc.c.RemoteAddr(), ctx.Err()))
	}
}
