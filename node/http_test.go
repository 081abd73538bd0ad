package node

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// postJSON sends a Connect/JSON unary call over HTTP/1.1 and returns the
// status and body.
func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestJSONUnknownFieldRefused: a typo'd JSON field is refused with
// INVALID_ARGUMENT naming it, and nothing is enqueued; the same request
// spelled right is served.
func TestJSONUnknownFieldRefused(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	url := h.srv.URL + "/norn.v1.TaskService/Enqueue"
	code, body := postJSON(t, url, `{"task": {"queue": "q", "priorty": 5}}`)
	if code != http.StatusBadRequest || !strings.Contains(body, "invalid_argument") || !strings.Contains(body, "priorty") {
		t.Fatalf("typo'd field: %d %s, want 400 invalid_argument naming priorty", code, body)
	}
	code, body = postJSON(t, url, `{"task": {"queue": "q"}, "nope": 1}`)
	if code != http.StatusBadRequest || !strings.Contains(body, "nope") {
		t.Fatalf("unknown top-level field: %d %s", code, body)
	}
	if n := countQueue(t, h, "q"); n != 0 {
		t.Fatalf("%d tasks stored after refused requests", n)
	}
	if code, body = postJSON(t, url, `{"task": {"queue": "q", "priority": 5}}`); code != http.StatusOK {
		t.Fatalf("well-formed enqueue: %d %s", code, body)
	}
	if n := countQueue(t, h, "q"); n != 1 {
		t.Fatalf("count %d after one enqueue", n)
	}
}

func countQueue(t *testing.T, h *harness, queue string) uint64 {
	t.Helper()
	cnt, err := h.api.CountTasks(context.Background(), connect.NewRequest(&nornv1.CountTasksRequest{Queue: queue}))
	if err != nil {
		t.Fatal(err)
	}
	return cnt.Msg.Total
}

// TestHTTPServerLimits: the API's server refuses headers over its limit
// and serves HTTP/2 cleartext and HTTP/1.1.
func TestHTTPServerLimits(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewHTTPServer(h.node.Handler())
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String() + "/healthz"
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-Big", strings.Repeat("a", 2*HTTPMaxHeaderBytes))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("headers of %d bytes: %d, want 431", 2*HTTPMaxHeaderBytes, resp.StatusCode)
	}
	for _, c := range []*http.Client{http.DefaultClient, h2cClient()} {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", resp.Proto, resp.StatusCode)
		}
	}
}

// TestLivezBeforeReady: a node waiting for the others of its cluster
// (-bootstrap-expect 3, alone) is not ready (/healthz 503) but is alive
// (/livez 200), so a liveness probe does not restart it while it waits.
func TestLivezBeforeReady(t *testing.T) {
	srv := httptest.NewUnstartedServer(nil)
	n, err := New(Config{
		DataDir: t.TempDir(), NodeID: "n1", MachineID: 1, Partitions: 8,
		APIAddr:         srv.Listener.Addr().String(),
		BootstrapExpect: 3, Replication: 3, SkewBuffer: testSkew,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		RaftLogger: hclog.NewNullLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	srv.Config.Handler = n.Handler()
	srv.Start()
	t.Cleanup(srv.Close)
	for path, want := range map[string]int{"/healthz": http.StatusServiceUnavailable, "/livez": http.StatusOK} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s on a node waiting for its cluster: %d, want %d", path, resp.StatusCode, want)
		}
	}
	// No cluster, nothing to count: the gauge /healthz's answer comes
	// from is absent (norn_ring_epoch 0 says why).
	if _, ok := sample(scrape(t, srv.URL+"/metrics"), "norn_partitions_without_leader", nil); ok {
		t.Errorf("norn_partitions_without_leader on a node waiting for its cluster")
	}
}
