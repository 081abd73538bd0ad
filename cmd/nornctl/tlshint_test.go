package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/norn-dev/norn/transport"
)

// TestTLSHint: a call in cleartext to a server that speaks TLS fails with
// the hint that names the flags and the env file; a call to a port where
// nothing listens fails without it.
func TestTLSHint(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	call := func(addr string) (int, string) {
		var stderr bytes.Buffer
		code := run(context.Background(), []string{"--addr", addr, "--timeout", "3s", "count"},
			strings.NewReader(""), io.Discard, &stderr, func(string) string { return "" })
		return code, stderr.String()
	}
	code, stderr := call(srv.Listener.Addr().String())
	if code != exitError || !strings.Contains(stderr, tlsHint) {
		t.Errorf("cleartext call to a TLS server: exit %d, stderr %q; want exit 1 with the TLS hint", code, stderr)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	code, stderr = call(closed)
	if code != exitError || strings.Contains(stderr, "hint:") {
		t.Errorf("call to a closed port: exit %d, stderr %q; want exit 1 without a hint", code, stderr)
	}
}

// TestCertHint: a call over TLS with a client certificate of another CA
// fails with a hint that the node refused the certificate and why (the
// alert it sent), rather than a bare broken pipe; with the right
// certificate there is no hint.
func TestCertHint(t *testing.T) {
	ours, theirs := t.TempDir(), t.TempDir()
	for _, dir := range []string{ours, theirs} {
		if err := transport.CreateCA(dir, "ca of "+filepath.Base(dir)); err != nil {
			t.Fatal(err)
		}
		if err := transport.CreateClientCert(dir, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	if err := transport.CreateNodeCert(ours, "n1", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	nc, nk := transport.NodeCertFiles(ours, "n1")
	certs, err := transport.LoadCerts(transport.TLSFiles{CA: filepath.Join(ours, transport.CACertFile), Cert: nc, Key: nk})
	if err != nil {
		t.Fatal(err)
	}
	conf := certs.ServerConfig(nil, false) // as a node's API port
	conf.NextProtos = []string{"h2", "http/1.1"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ErrorLog: log.New(io.Discard, "", 0)} // the refused handshakes
	go srv.Serve(tls.NewListener(ln, conf))                                                    //nolint:errcheck // stops with Close
	defer srv.Close()

	call := func(certDir string) (int, string) {
		cc, ck := transport.ClientCertFiles(certDir, "alice")
		var stderr bytes.Buffer
		code := run(context.Background(), []string{"--addr", ln.Addr().String(), "--timeout", "3s",
			"--ca", filepath.Join(ours, transport.CACertFile), "--cert", cc, "--key", ck, "count"},
			strings.NewReader(""), io.Discard, &stderr, func(string) string { return "" })
		return code, stderr.String()
	}
	code, stderr := call(theirs)
	if code != exitError || !strings.Contains(stderr, "hint: the node refused nornctl's client certificate (bad certificate)") {
		t.Errorf("a certificate of another CA: exit %d, stderr %q; want the certificate hint", code, stderr)
	}
	if _, stderr := call(ours); strings.Contains(stderr, "hint:") {
		t.Errorf("the right certificate: stderr %q, want no hint", stderr)
	}
}
