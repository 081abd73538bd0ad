package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// splitServer listens on loopback and serves HTTP (answering "http
// <path>") on one side of a SplitListener and framed calls (echoing the
// body and the call's timeout, or failing with a detail) on the other.
func splitServer(t *testing.T, maxFrame uint32) (addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rest, framed := SplitListener(ln)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "http %s", r.URL.Path)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(rest) //nolint:errcheck // stops with Close
	rpc := ServeRPCListener(framed, maxFrame, func(ctx context.Context, m RPCMethod, meta RPCMeta, body []byte) ([]byte, error) {
		if string(body) == "fail" {
			ce := connect.NewError(connect.CodeUnavailable, errors.New("not now"))
			d, _ := connect.NewErrorDetail(wrapperspb.String("retry with 7"))
			ce.AddDetail(d)
			return nil, ce
		}
		return fmt.Appendf(nil, "%d|%v|%s", m, ClientCallTimeout(meta) > 0, body), nil
	}, nil)
	t.Cleanup(func() {
		srv.Close()
		rpc.Close()
		framed.Close()
	})
	return ln.Addr().String()
}

// TestSplitListener: HTTP and framed client calls share one port.
func TestSplitListener(t *testing.T) {
	addr := splitServer(t, 0)

	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "http /healthz" {
		t.Fatalf("HTTP answer %q", b)
	}

	c := NewClientRPCClient(addr)
	defer c.Close()
	out, err := c.Call(context.Background(), MethodComplete, RPCMeta{}, []byte("hi"))
	if err != nil || string(out) != "18|false|hi" {
		t.Fatalf("framed call: %q, %v", out, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err = c.Call(ctx, MethodClaim, ClientCallMeta(ctx), []byte("with deadline"))
	if err != nil || string(out) != "17|true|with deadline" {
		t.Fatalf("framed call with a deadline: %q, %v", out, err)
	}

	// An error keeps its code, message and details.
	_, err = c.Call(context.Background(), MethodComplete, RPCMeta{}, []byte("fail"))
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable || ce.Message() != "not now" {
		t.Fatalf("failed call: %v", err)
	}
	if ds := ce.Details(); len(ds) != 1 {
		t.Fatalf("details %v, want 1", ds)
	} else if v, err := ds[0].Value(); err != nil || v.(*wrapperspb.StringValue).GetValue() != "retry with 7" {
		t.Fatalf("detail %v, %v", v, err)
	}

	// Bytes that are neither go to HTTP, which refuses them.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("NOPE/9\r\n\r\n"))
	line, _ := bufio.NewReader(conn).ReadString('\n')
	if !strings.HasPrefix(line, "HTTP/1.1 400") {
		t.Fatalf("garbage got %q, want an HTTP 400", line)
	}
}

// TestClientRPCUnsupported: a port with only HTTP on it answers the magic
// with an HTTP error, which the client takes as "no framed calls".
func TestClientRPCUnsupported(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// As an older nornd serves: HTTP/1.1 and HTTP/2 with prior knowledge,
	// whose server first waits for the 24 bytes of a preface.
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: 5 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln) //nolint:errcheck // stops with Close
	defer srv.Close()
	c := NewClientRPCClient(ln.Addr().String())
	defer c.Close()
	if _, err := c.Call(context.Background(), MethodComplete, RPCMeta{}, []byte("x")); !errors.Is(err, ErrRPCUnsupported) {
		t.Fatalf("call to an HTTP-only port: %v, want ErrRPCUnsupported", err)
	}
}

// TestClientRPCCancel: a framed client call whose context ends first
// cancels the server's call (a long poll must not go on for nobody), and
// so does closing the connection.
func TestClientRPCCancel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, framed := SplitListener(ln)
	ended := make(chan error, 2)
	started := make(chan struct{}, 2)
	rpc := ServeRPCListener(framed, 0, func(ctx context.Context, m RPCMethod, meta RPCMeta, body []byte) ([]byte, error) {
		started <- struct{}{}
		select {
		case <-ctx.Done():
			ended <- ctx.Err()
		case <-time.After(time.Minute):
			ended <- errors.New("not cancelled")
		}
		return nil, ctx.Err()
	}, nil)
	defer func() { rpc.Close(); framed.Close() }()

	c := NewClientRPCClient(ln.Addr().String())
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	if _, err := c.Call(ctx, MethodClaim, RPCMeta{}, nil); connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("cancelled call: %v, want CANCELED", err)
	}
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("server call after the client cancelled: %v", err)
	}

	go func() { <-started; c.Close() }()
	if _, err := c.Call(context.Background(), MethodClaim, RPCMeta{}, nil); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("call on a closed connection: %v, want UNAVAILABLE", err)
	}
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("server call after the connection closed: %v", err)
	}
}

// TestClientRPCCallLate: a call its caller left whose server still
// answers with success (it had done the work when the cancel came) hands
// that answer to late; a late failure is not handed over, and a call
// answered in time never reaches late.
func TestClientRPCCallLate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, framed := SplitListener(ln)
	started, release := make(chan struct{}, 1), make(chan struct{})
	rpc := ServeRPCListener(framed, 0, func(ctx context.Context, m RPCMethod, meta RPCMeta, body []byte) ([]byte, error) {
		if string(body) == "now" {
			return []byte("now-answer"), nil
		}
		started <- struct{}{}
		<-release // the work is done whatever the caller does
		if string(body) == "fail" {
			return nil, errors.New("late failure")
		}
		return []byte("late-answer"), nil
	}, nil)
	defer func() { rpc.Close(); framed.Close() }()
	c := NewClientRPCClient(ln.Addr().String())
	defer c.Close()

	lateGot := make(chan string, 3)
	late := func(b []byte) { lateGot <- string(b) }
	for _, body := range []string{"fail", "work"} {
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-started; cancel() }()
		if _, err := c.CallLate(ctx, MethodClaim, RPCMeta{}, []byte(body), late); connect.CodeOf(err) != connect.CodeCanceled {
			t.Fatalf("cancelled call: %v, want CANCELED", err)
		}
		release <- struct{}{}
	}
	if out, err := c.CallLate(context.Background(), MethodClaim, RPCMeta{}, []byte("now"), late); err != nil || string(out) != "now-answer" {
		t.Fatalf("call answered in time: %q, %v", out, err)
	}
	select {
	case got := <-lateGot:
		if got != "late-answer" {
			t.Fatalf("late got %q, want the successful late answer only", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the late answer was not handed to late")
	}
	// The connection answers in order: by the time a call made after
	// both late answers returns, a second hand-over would have begun.
	if _, err := c.Call(context.Background(), MethodClaim, RPCMeta{}, []byte("now")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-lateGot:
		t.Fatalf("late also got %q", got)
	default:
	}
}

// TestClientRPCFrameLimit: a request frame over the server's limit is
// answered RESOURCE_EXHAUSTED with the limit, and the connection goes on.
func TestClientRPCFrameLimit(t *testing.T) {
	addr := splitServer(t, 1024)
	c := NewClientRPCClient(addr)
	defer c.Close()
	_, err := c.Call(context.Background(), MethodEnqueueBatch, RPCMeta{}, make([]byte, 4096))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "exceeds 1024") {
		t.Fatalf("oversized call: %v, want RESOURCE_EXHAUSTED naming 1024", err)
	}
	out, err := c.Call(context.Background(), MethodComplete, RPCMeta{}, []byte("after"))
	if err != nil || string(out) != "18|false|after" {
		t.Fatalf("call after an oversized one: %q, %v", out, err)
	}
}

// TestTLSSplitListener: over TLS the API port splits by ALPN: HTTP/2 and
// HTTP/1.1 reach net/http with the client's certificate, framed calls
// (FramedALPN) reach the framed server, whose handler sees the
// certificate's identity; a framed client of a port that does not offer
// FramedALPN learns that it is unsupported.
func TestTLSSplitListener(t *testing.T) {
	dir := t.TempDir()
	if err := CreateCA(dir, "test"); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{CreateNodeCert(dir, "n1", []string{"127.0.0.1"}), CreateClientCert(dir, "alice")} {
		if err != nil {
			t.Fatal(err)
		}
	}
	nc, nk := NodeCertFiles(dir, "n1")
	certs, err := LoadCerts(TLSFiles{CA: filepath.Join(dir, CACertFile), Cert: nc, Key: nk})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rest, framed := TLSSplitListener(ln, certs.ServerConfig(nil, false))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := IdentityOf(*r.TLS)
		fmt.Fprintf(w, "%s %s", r.Proto, id.User)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(rest) //nolint:errcheck // stops with Close
	rpc := ServeRPCListener(framed, 0, func(_ context.Context, _ RPCMethod, meta RPCMeta, body []byte) ([]byte, error) {
		if meta.Cert == nil {
			return []byte("no certificate"), nil
		}
		return []byte(meta.Cert.User + " " + string(body)), nil
	}, nil)
	t.Cleanup(func() { srv.Close(); rpc.Close(); framed.Close() })
	addr := ln.Addr().String()

	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(filepath.Join(dir, CACertFile))
	pool.AppendCertsFromPEM(caPEM)
	cc, ck := ClientCertFiles(dir, "alice")
	kp, err := tls.LoadX509KeyPair(cc, ck)
	if err != nil {
		t.Fatal(err)
	}
	conf := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS13}

	for _, h2 := range []bool{false, true} {
		p := new(http.Protocols)
		p.SetHTTP1(!h2)
		p.SetHTTP2(h2)
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: conf.Clone(), Protocols: p}}
		resp, err := hc.Get("https://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := map[bool]string{false: "HTTP/1.1 alice", true: "HTTP/2.0 alice"}[h2]; string(b) != want {
			t.Fatalf("http: %q, want %q", b, want)
		}
	}
	// Plain HTTP to the TLS port (curl http://...) is answered with a 400
	// that says the port serves TLS, not an empty reply.
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("cleartext to the TLS port: %v, want an answer", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "serves TLS only") {
		t.Fatalf("cleartext to the TLS port: %d %q", resp.StatusCode, b)
	}
	c := NewClientRPCClientTLS(addr, conf)
	defer c.Close()
	got, err := c.Call(context.Background(), MethodEnqueue, RPCMeta{}, []byte("hi"))
	if err != nil || string(got) != "alice hi" {
		t.Fatalf("framed over TLS: %q %v", got, err)
	}

	// A TLS port without framed calls: unsupported, not a failure.
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.NotFoundHandler(), TLSConfig: certs.ServerConfig([]string{"h2", "http/1.1"}, false), ReadHeaderTimeout: 5 * time.Second}
	go hs.ServeTLS(plain, "", "") //nolint:errcheck // stops with Close
	t.Cleanup(func() { hs.Close() })
	c2 := NewClientRPCClientTLS(plain.Addr().String(), conf)
	defer c2.Close()
	if _, err := c2.Call(context.Background(), MethodEnqueue, RPCMeta{}, []byte("hi")); !errors.Is(err, ErrRPCUnsupported) {
		t.Fatalf("a port without framed calls: %v, want ErrRPCUnsupported", err)
	}
}
