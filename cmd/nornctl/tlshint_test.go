package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
