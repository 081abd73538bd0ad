package node

import (
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/console"
	"github.com/norn-dev/norn/transport"
)

// Limits of the API's HTTP server (NewHTTPServer), documented in
// docs/API.md.
const (
	// HTTPReadHeaderTimeout bounds how long a client may take to send a
	// request's headers (slowloris).
	HTTPReadHeaderTimeout = 10 * time.Second
	// HTTPIdleTimeout closes a keep-alive connection idle this long.
	HTTPIdleTimeout = 2 * time.Minute
	// HTTPMaxHeaderBytes bounds a request's headers (HTTP/1.1 and the
	// HTTP/2 header list).
	HTTPMaxHeaderBytes = 64 << 10
	// HTTPMaxConcurrentStreams bounds the requests one HTTP/2 connection
	// may have open at once; more wait for the client's turn.
	HTTPMaxConcurrentStreams = 1000
)

// Handler returns the node's HTTP API: norn.v1.TaskService and
// AdminService over connect (gRPC, gRPC-Web and Connect/JSON on the same
// paths), GET /healthz (ready: 200 once every partition it replicates has
// a leader), GET /livez (alive: 200 while it serves HTTP) and the web
// console under /ui/ (package console). Serve it
// over HTTP/2 cleartext and HTTP/1.1.
// JSON requests with a field the API does not have are refused with
// INVALID_ARGUMENT naming it (transport.StrictJSON). Every call's caller
// is checked before its body is read, and bodies are read through the
// node's request budgets (edge, admit.go).
func (n *Node) Handler() http.Handler {
	opts := append([]connect.HandlerOption{
		connect.WithReadMaxBytes(n.cfg.MaxRequestBytes),
		// Gzip costs more than it saves on small messages (DESIGN §8).
		connect.WithCompressMinBytes(4 << 10),
		// The RPC metrics first (outermost), so refused calls count;
		// then who may call what: the access file's grants, or any
		// client certificate with TLS (server.AuthInterceptor).
		// Tracing (when on) between the two, so that a refusal has its
		// span.
		connect.WithInterceptors(n.apiInterceptors(n.server.AuthInterceptor())...),
	}, transport.StrictJSON()...)
	mux := http.NewServeMux()
	mux.Handle(nornv1connect.NewTaskServiceHandler(n.server.TaskService(), opts...))
	mux.Handle(nornv1connect.NewAdminServiceHandler(n.server.AdminService(), opts...))
	mux.Handle(nornv1connect.NewQueueServiceHandler(n.server.QueueService(), opts...))
	// Replication batches many tasks in one call (up to maxReplicate):
	// a larger limit, read only for callers admitted as nodes (edge).
	mux.Handle(nornv1connect.NewPeerServiceHandler(n.server.PeerService(),
		append([]connect.HandlerOption{connect.WithReadMaxBytes(PeerMaxRequestBytes), connect.WithCompressMinBytes(4 << 10),
			connect.WithInterceptors(n.apiInterceptors()...)}, transport.StrictJSON()...)...))
	n.mountEcosystem(mux)
	mountOpenAPI(mux) // GET /openapi.yaml and /openapi.json, open (openapi.go)
	if !n.cfg.MetricsElsewhere {
		mux.Handle("GET /metrics", n.metrics.handler)
	}
	// Ready once every partition has a leader; 503 before.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !n.Ready() {
			http.Error(w, "partitions without a leader", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	// Live while the process serves HTTP. It reads neither the disk nor
	// the cluster's state, so a slow disk, a lost quorum or a cluster not
	// formed yet never makes a supervisor (Kubernetes' liveness probe)
	// restart the node; readiness is /healthz.
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	api := n.edge(mux)
	// The web console (docs/CONSOLE.md) calls the API above in process,
	// as the browser, and charts the calls from the node's metrics.
	con := console.New(console.Config{API: api, AuthOn: n.cfg.TLS != nil || n.cfg.Auth != nil,
		NodeID: n.cfg.NodeID, Logger: n.cfg.Logger, CertUser: func(r *http.Request) string {
			if n.cfg.TLS == nil || r.TLS == nil {
				return ""
			}
			id, _ := transport.IdentityOf(*r.TLS)
			return id.User
		}, Metrics: n.metrics.reg, SampleEvery: consoleSampleEvery})
	n.closeWithNode(con)
	mux.Handle(console.Prefix, con)
	mux.Handle("GET /ui", http.RedirectHandler(console.Prefix, http.StatusMovedPermanently))
	return api
}

// consoleSampleEvery is the interval of the console's charts' points: 0
// for the console's default (10 s). Tests set it shorter.
var consoleSampleEvery time.Duration

// closeWithNode closes con (stops its sampling of the metrics) when the
// node closes: Close waits for it (n.stopped). After Close it closes con
// at once.
func (n *Node) closeWithNode(con *console.Console) {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.closed {
		con.Close()
		return
	}
	n.stopped.Add(1)
	go func() {
		defer n.stopped.Done()
		<-n.stop
		con.Close()
	}()
}

// apiInterceptors are the interceptors of the API's handlers: the RPC
// metrics, tracing when on, then inner.
func (n *Node) apiInterceptors(inner ...connect.Interceptor) []connect.Interceptor {
	out := append([]connect.Interceptor{n.metrics.rpc.Interceptor()}, n.tracing.interceptors...)
	return append(out, inner...)
}

// MetricsHandler serves GET /metrics alone, for an address of its own
// (nornd -metrics-addr).
func (n *Node) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", n.metrics.handler)
	return mux
}

// NewHTTPServer returns the HTTP server of the API port for h: HTTP/1.1
// and HTTP/2 (cleartext, or over TLS when served so), with the limits
// above.
func NewHTTPServer(h http.Handler) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: HTTPReadHeaderTimeout,
		IdleTimeout:       HTTPIdleTimeout,
		MaxHeaderBytes:    HTTPMaxHeaderBytes,
		Protocols:         new(http.Protocols),
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: HTTPMaxConcurrentStreams},
	}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetHTTP2(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv
}
