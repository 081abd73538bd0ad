package main

import (
	"bytes"
	"context"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestHealth: nornctl health exits 0 when every node of --addr answers
// /healthz with 200 and 1, naming the node and its answer, when one does
// not; --live asks /livez; with --ca it speaks TLS and verifies the node.
func TestHealth(t *testing.T) {
	var ready atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "partitions without a leader", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	plain := httptest.NewServer(mux)
	defer plain.Close()
	secure := httptest.NewUnstartedServer(mux)
	secure.EnableHTTP2 = true
	secure.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake refused on purpose
	secure.StartTLS()
	defer secure.Close()
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: secure.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	plainAddr := plain.Listener.Addr().String()
	secureAddr := secure.Listener.Addr().String()

	health := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"--timeout", "3s", "health"}, args...),
			strings.NewReader(""), &stdout, &stderr, func(string) string { return "" })
		return code, stdout.String(), stderr.String()
	}
	for _, tc := range []struct {
		name    string
		ready   bool
		args    []string
		want    int
		wantOut string // in stdout (exit 0) or stderr
	}{
		{"not ready", false, []string{"--addr", plainAddr}, exitError, "503 Service Unavailable: partitions without a leader"},
		{"alive while not ready", false, []string{"--addr", plainAddr, "--live"}, exitOK, "http://" + plainAddr + ": ok"},
		{"ready", true, []string{"--addr", plainAddr}, exitOK, "http://" + plainAddr + ": ok"},
		{"ready over TLS", true, []string{"--addr", secureAddr, "--ca", ca}, exitOK, "https://" + secureAddr + ": ok"},
		{"a list, --live", false, []string{"--addr", secureAddr + ",http://" + plainAddr, "--ca", ca, "--live"}, exitOK, "http://" + plainAddr + ": ok"},
		{"a list, not ready", false, []string{"--addr", secureAddr + ",http://" + plainAddr, "--ca", ca}, exitError, "https://" + secureAddr + "/healthz: 503"},
		{"JSON", true, []string{"--addr", plainAddr, "-o", "json"}, exitOK, `{"nodes":[{"address":"http://` + plainAddr + `","ok":true}]}`},
		{"TLS without the CA", true, []string{"--addr", "https://" + secureAddr}, exitError, "certificate"},
		{"an argument", true, []string{"--addr", plainAddr, "extra"}, exitUsage, "unexpected argument"},
	} {
		ready.Store(tc.ready)
		code, stdout, stderr := health(tc.args...)
		out := stderr
		if tc.want == exitOK {
			out = stdout
		}
		if code != tc.want || !strings.Contains(out, tc.wantOut) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d with %q", tc.name, code, stdout, stderr, tc.want, tc.wantOut)
		}
	}
}
