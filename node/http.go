package node

import (
	"net/http"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// Handler returns the node's HTTP API: norn.v1.TaskService and
// AdminService over connect (gRPC, gRPC-Web and Connect/JSON on the same
// paths), and GET /healthz. Serve it over HTTP/2 cleartext and HTTP/1.1.
func (n *Node) Handler() http.Handler {
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(n.cfg.MaxRequestBytes),
		// Gzip costs more than it saves on small messages (DESIGN §8).
		connect.WithCompressMinBytes(4 << 10),
	}
	mux := http.NewServeMux()
	mux.Handle(nornv1connect.NewTaskServiceHandler(n.server.TaskService(), opts...))
	mux.Handle(nornv1connect.NewAdminServiceHandler(n.server.AdminService(), opts...))
	// Replication batches many tasks in one call (up to maxReplicate).
	mux.Handle(nornv1connect.NewPeerServiceHandler(n.server.PeerService(),
		connect.WithReadMaxBytes(64<<20), connect.WithCompressMinBytes(4<<10)))
	mux.HandleFunc("GET /metrics", n.serveMetrics)
	// Ready once every partition has a leader; 503 before.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !n.Ready() {
			http.Error(w, "partitions without a leader", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return mux
}
