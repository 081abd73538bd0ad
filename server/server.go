package server

import (
	"log/slog"
	"time"

	"github.com/norn-dev/norn/access"
	"github.com/norn-dev/norn/antientropy"
	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/dispatch"
	"github.com/norn-dev/norn/rebalance"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/storage"
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
	// NodeID and APIAddr are this node's id and API address; Version its
	// build (Status).
	NodeID, APIAddr, Version string
	// Start is when the node started (Status's uptime).
	Start time.Time
	// Limits bounds the fields of a task (queue, payload, errors, ...).
	Limits crdt.Limits
	// DefaultLease is the lease of a Claim or Renew that names none;
	// MaxLease bounds requested leases; MaxWait bounds a Claim's long poll.
	DefaultLease, MaxLease, MaxWait time.Duration
	// MinQueueRetention is the shortest QueueSettings.retention taken
	// (node.Config.MinQueueRetention).
	MinQueueRetention time.Duration
	// DefaultRetry is the retry policy of a retryable Abort of a task
	// whose spec has none.
	DefaultRetry crdt.RetryPolicy
	Clock        crdt.Clock
	HLC          *crdt.HLC
	IDs          IDs
	Logger       *slog.Logger

	Store      *storage.Store
	Host       *replicas.Host
	Peers      *transport.Peers
	Coord      *coord.Coordinator
	Dispatch   *dispatch.Dispatcher
	AE         *antientropy.Scheduler
	Rebalance  *rebalance.Driver
	ClockGuard *cluster.ClockGuard
	// Heartbeats answers the coalesced Raft heartbeats
	// (transport.MethodRaftHeartbeats); nil refuses them.
	Heartbeats *transport.Heartbeats
	// Security is how the node's ports are secured, for Status; with TLS
	// and no Auth, every call needs a client certificate.
	Security SecurityStatus
	// Auth, when set, is the access file: every TaskService and
	// AdminService call needs a user whose grants allow it
	// (AuthInterceptor, AuthorizeFramed).
	Auth *access.Rules
	// ActLocal, EndAfterWrite and RetryCompleted are the seeded bugs
	// node.TestBugs.ActLocal, EndAfterWrite and RetryCompleted,
	// test-only.
	ActLocal, EndAfterWrite, RetryCompleted bool
	// UniqueAfterWrite is the seeded bug node.TestBugs.UniqueAfterWrite,
	// test-only: a task with a unique key is written before its key is
	// taken, and kept when the key is held (unique.go).
	UniqueAfterWrite bool
	// UniquePhantomAfter is how old a unique key's record must be before
	// a holder no majority of its replicas has is taken as gone: the
	// node's rejoin limit (no replica away longer comes back). Nil: an
	// hour.
	UniquePhantomAfter func() time.Duration
	// ScheduleRandomID is the seeded bug node.TestBugs.ScheduleRandomID,
	// test-only: a tick's task gets a fresh id at every write.
	ScheduleRandomID bool
	// ScheduleRanDelay (test hooks only) is a wait between a tick's write
	// and its record, which widens the window in which a leader change
	// makes the next leader write the tick again (scheduler.go).
	ScheduleRanDelay time.Duration
	// WriteTimeout bounds the scheduler's writes and reads.
	WriteTimeout time.Duration
	// Events, when set, is told of what the API does to tasks (metrics).
	Events TaskEvents
	// Build is the node's build (Status's build); nil leaves it out.
	Build *nornv1.BuildInfo
	// DataDir is the node's data directory, which a Backup may not write
	// into. Backup makes a checkpoint; nil refuses Backup calls.
	DataDir string
	Backup  Backuper
	// ExchangeGate, when set, decides whether task states may pass
	// between this node and the peer calling: serving is true for the
	// calls that hand this node's states out (Read, TreeRoots,
	// TreeNodes, SegmentEntries), false for Replicate. Its error is the
	// refusal (FAILED_PRECONDITION). The node's rejoin rule: a node out
	// of the cluster longer than the retention allows spreads nothing.
	ExchangeGate func(peer string, serving bool) error
	// OutTooLong, when set, says why this node was out of the cluster
	// longer than the retention allows ("" when it was not): Status
	// reports it unhealthy.
	OutTooLong func() string
}

// TaskEvents is told of what the API did to tasks, on the node that did
// it: a call forwarded to the task's leader is told there, a claim
// proxied to another leader is told on the node the worker called.
// Idempotent retries that find their effect stored already are told
// again. The queue is the task's ("" when this node does not know it).
// Methods run on the request's goroutine: they must be cheap and safe
// for concurrent use.
type TaskEvents interface {
	// Enqueued: n tasks of queue were written (with their quorum).
	Enqueued(queue string, n int)
	// Claimed: a Claim of queue answered its worker with tasks (perhaps
	// none) after waiting waited; now is the node's clock (Config.Clock),
	// to tell the tasks' ages.
	Claimed(queue string, tasks []*nornv1.ClaimedTask, now time.Time, waited time.Duration)
	// Renewed, Completed, Aborted, Cancelled: one task of queue was.
	Renewed(queue string)
	Completed(queue string)
	Aborted(queue string)
	Cancelled(queue string)
	// Failed: a worker failed an attempt of a task of queue (a
	// retryable Abort).
	Failed(queue string)
}

// SecurityStatus is how a node's ports are secured (Status's security).
type SecurityStatus struct {
	TLS, GossipEncrypted, Insecure bool
}

// Server is the API edge of a node: it validates every request field by
// field (naming the field in the error), translates between the API's
// messages and the node's parts, and calls them. It holds no state of its
// own. Safe for concurrent use.
type Server struct {
	cfg        Config
	start      time.Time
	store      *storage.Store
	host       *replicas.Host
	peers      *transport.Peers
	coord      *coord.Coordinator
	dispatch   *dispatch.Dispatcher
	ae         *antientropy.Scheduler
	rebalance  *rebalance.Driver
	clockGuard *cluster.ClockGuard
	hlc        *crdt.HLC
	ids        IDs
	events     TaskEvents // Config.Events, or noEvents
}

// New returns a server over cfg's parts.
func New(cfg Config) *Server {
	if cfg.Events == nil {
		cfg.Events = noEvents{}
	}
	return &Server{cfg: cfg, start: cfg.Start, store: cfg.Store, host: cfg.Host, peers: cfg.Peers, coord: cfg.Coord,
		dispatch: cfg.Dispatch, ae: cfg.AE, rebalance: cfg.Rebalance, clockGuard: cfg.ClockGuard,
		hlc: cfg.HLC, ids: cfg.IDs, events: cfg.Events}
}

// noEvents is the TaskEvents of a server told nothing.
type noEvents struct{}

func (noEvents) Enqueued(string, int)                                            {}
func (noEvents) Claimed(string, []*nornv1.ClaimedTask, time.Time, time.Duration) {}
func (noEvents) Renewed(string)                                                  {}
func (noEvents) Completed(string)                                                {}
func (noEvents) Aborted(string)                                                  {}
func (noEvents) Failed(string)                                                   {}
func (noEvents) Cancelled(string)                                                {}

// AdminService is the server's norn.v1.AdminService.
func (sv *Server) AdminService() nornv1connect.AdminServiceHandler { return adminService{sv} }

// PeerService is the server's norn.v1.PeerService: the calls between
// nodes, each refused unless it comes from a node of this cluster.
func (sv *Server) PeerService() nornv1connect.PeerServiceHandler { return peerService{sv} }

// TaskService is the server's norn.v1.TaskService.
func (sv *Server) TaskService() nornv1connect.TaskServiceHandler { return taskService{sv} }
