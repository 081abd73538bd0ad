package transport

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// ClientRPCMagic opens a connection of framed client calls on a node's API
// port: SplitListener hands connections that start with it to the framed
// server, every other connection (HTTP/1.1, the HTTP/2 preface) to
// net/http. It is longer than the HTTP/2 preface (24 bytes), so that a
// server without framed calls that waits for a preface gets enough bytes
// to refuse it as a bad HTTP request instead of waiting for more.
var ClientRPCMagic = []byte("NORN-FRAMED-CALLS/1\r\n\r\n\r\n")

// splitPeekTimeout bounds the wait for a new connection's first bytes.
const splitPeekTimeout = 10 * time.Second

// SplitListener splits ln's connections by their first bytes: those that
// start with ClientRPCMagic (consumed) come from framed, the others (their
// first bytes kept) from rest. Closing either closes ln.
func SplitListener(ln net.Listener) (rest, framed net.Listener) {
	return splitListener(ln, nil)
}

// FramedALPN is the ALPN protocol of framed client calls over TLS.
var FramedALPN = "norn-framed/1"

// TLSSplitListener is SplitListener over TLS: it runs each connection's
// handshake with conf (whose NextProtos it sets to h2, http/1.1 and
// FramedALPN) and splits by the protocol negotiated: FramedALPN to framed
// (no magic over TLS), the others to rest as *tls.Conn, so that net/http
// serves HTTP/2 by ALPN and handlers see the client's certificate.
func TLSSplitListener(ln net.Listener, conf *tls.Config) (rest, framed net.Listener) {
	conf = conf.Clone()
	// The server's order decides: FramedALPN first, which only framed
	// clients offer.
	conf.NextProtos = []string{FramedALPN, "h2", "http/1.1"}
	return splitListener(ln, conf)
}

func splitListener(ln net.Listener, conf *tls.Config) (rest, framed net.Listener) {
	s := &splitter{ln: ln, tls: conf, rest: make(chan net.Conn), framed: make(chan net.Conn), done: make(chan struct{})}
	go s.acceptLoop()
	return &splitSide{s: s, ch: s.rest}, &splitSide{s: s, ch: s.framed}
}

type splitter struct {
	ln           net.Listener
	tls          *tls.Config // nil: cleartext, split by the first bytes
	rest, framed chan net.Conn
	done         chan struct{}
	once         sync.Once
	err          error // why acceptLoop stopped; read after done
}

func (s *splitter) acceptLoop() {
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				s.close(err)
				return
			}
			// Out of file descriptors and the like: wait and go on, as
			// net/http's Serve does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(delay):
				continue
			case <-s.done:
				return
			}
		}
		delay = 0
		go s.route(c)
	}
}

func (s *splitter) route(c net.Conn) {
	if s.tls != nil {
		s.routeTLS(c)
		return
	}
	r := bufio.NewReaderSize(c, 4096)
	c.SetReadDeadline(time.Now().Add(splitPeekTimeout)) //nolint:errcheck // a failed peek reports it
	// Decide at the first byte that differs from the magic: an HTTP
	// request is routed as soon as its first byte arrives, whatever its
	// length.
	framed, got := true, 0
	for i := 1; i <= len(ClientRPCMagic); i++ {
		head, err := r.Peek(i)
		got = len(head)
		if err != nil {
			framed = false
			break
		}
		if head[i-1] != ClientRPCMagic[i-1] {
			framed = false
			break
		}
	}
	c.SetReadDeadline(time.Time{}) //nolint:errcheck
	if got == 0 {
		c.Close() // gone, or silent, before its first byte
		return
	}
	ch := s.rest
	if framed {
		r.Discard(len(ClientRPCMagic)) //nolint:errcheck // peeked
		ch = s.framed
	}
	select {
	case ch <- &peekedConn{Conn: c, r: r}:
	case <-s.done:
		c.Close()
	}
}

// routeTLS runs c's handshake (a client that does not finish it within
// splitPeekTimeout is dropped) and hands it on by its ALPN protocol.
func (s *splitter) routeTLS(c net.Conn) {
	tc := tls.Server(c, s.tls)
	c.SetDeadline(time.Now().Add(splitPeekTimeout)) //nolint:errcheck // a failed handshake reports it
	if err := tc.Handshake(); err != nil {
		answerCleartext(err)
		c.Close()
		return
	}
	c.SetDeadline(time.Time{}) //nolint:errcheck
	ch := s.rest
	if tc.ConnectionState().NegotiatedProtocol == FramedALPN {
		ch = s.framed
	}
	select {
	case ch <- tc:
	case <-s.done:
		tc.Close()
	}
}

// answerCleartext answers a client that spoke plain HTTP to the TLS port
// (curl http://... to a node serving TLS) with a 400 saying so, as
// net/http does on its own TLS listeners, instead of closing without a
// word.
func answerCleartext(err error) {
	var rhe tls.RecordHeaderError
	if !errors.As(err, &rhe) || rhe.Conn == nil || !looksLikeHTTP(rhe.RecordHeader[:]) {
		return
	}
	rhe.Conn.SetWriteDeadline(time.Now().Add(time.Second)) //nolint:errcheck // best effort
	io.WriteString(rhe.Conn, "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"+
		"Client sent an HTTP request to a TLS port: this node serves TLS only (use https:// and the cluster's CA).\n") //nolint:errcheck // best effort
}

// looksLikeHTTP reports whether a connection's first bytes are an HTTP
// request line (or the HTTP/2 cleartext preface).
func looksLikeHTTP(head []byte) bool {
	for _, m := range []string{"GET /", "HEAD ", "POST ", "PUT /", "PRI *", "OPTIO", "DELET", "PATCH"} {
		if strings.HasPrefix(string(head), m[:min(len(m), len(head))]) {
			return true
		}
	}
	return false
}

func (s *splitter) close(err error) {
	s.once.Do(func() {
		s.err = err
		close(s.done)
		s.ln.Close()
	})
}

type splitSide struct {
	s  *splitter
	ch chan net.Conn
}

func (l *splitSide) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.s.done:
		if l.s.err != nil && !errors.Is(l.s.err, net.ErrClosed) {
			return nil, l.s.err
		}
		return nil, net.ErrClosed
	}
}

func (l *splitSide) Close() error   { l.s.close(net.ErrClosed); return nil }
func (l *splitSide) Addr() net.Addr { return l.s.ln.Addr() }

// peekedConn reads first what the splitter peeked.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if c.r.Buffered() == 0 {
		return c.Conn.Read(p)
	}
	return c.r.Read(p)
}
