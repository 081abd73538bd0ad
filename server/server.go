package server

import (
	"log/slog"
	"time"

	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/dispatch"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/transport"
)

// IDs issues new task ids.
type IDs interface {
	// NextID returns a new, never-zero task id.
	NextID() (uint64, error)
}

// Config configures a Server. The node's Config documents the shared
// fields (units, defaults); New applies no defaults of its own.
type Config struct {
	// Limits bounds the fields of a task (queue, payload, errors, ...).
	Limits crdt.Limits
	// DefaultLease is the lease of a Claim or Renew that names none;
	// MaxLease bounds requested leases; MaxWait bounds a Claim's long poll.
	DefaultLease, MaxLease, MaxWait time.Duration
	Clock                           crdt.Clock
	HLC                             *crdt.HLC
	IDs                             IDs
	Logger                          *slog.Logger

	Host     *replicas.Host
	Peers    *transport.Peers
	Coord    *coord.Coordinator
	Dispatch *dispatch.Dispatcher
}

// Server is the API edge of a node: it validates every request field by
// field (naming the field in the error), translates between the API's
// messages and the node's parts, and calls them. It holds no state of its
// own. Safe for concurrent use.
type Server struct {
	cfg      Config
	host     *replicas.Host
	peers    *transport.Peers
	coord    *coord.Coordinator
	dispatch *dispatch.Dispatcher
	hlc      *crdt.HLC
	ids      IDs
}

// New returns a server over cfg's parts.
func New(cfg Config) *Server {
	return &Server{cfg: cfg, host: cfg.Host, peers: cfg.Peers, coord: cfg.Coord, dispatch: cfg.Dispatch,
		hlc: cfg.HLC, ids: cfg.IDs}
}

// TaskService is the server's norn.v1.TaskService.
func (sv *Server) TaskService() nornv1connect.TaskServiceHandler { return taskService{sv} }
