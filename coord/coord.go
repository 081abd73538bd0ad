package coord

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// Ended is a task that a merge into this node's replica made terminal.
type Ended struct {
	P     uint16
	ID    uint64
	Event crdt.Terminal // the deciding terminal event
}

// Config configures a Coordinator. The node's Config documents the
// shared fields (units, defaults).
type Config struct {
	NodeID       string
	Partitions   int
	WriteTimeout time.Duration
	Limits       crdt.Limits
	Clock        crdt.Clock
	Logger       *slog.Logger

	Store *storage.Store
	Host  *replicas.Host
	Peers *transport.Peers

	// Tracer, when set, traces the quorum writes (SpanWrite) and each
	// replica's share of them (SpanReplicaWrite); nil: tracing is off,
	// and the write path starts no span.
	Tracer trace.Tracer

	// OnEnded runs after a merge into this node's replicas made tasks
	// terminal (the claim side ends their claims and wakes waiting
	// claims); it must not block.
	OnEnded func([]Ended)
	// DepsDone reports whether every id is a COMPLETED task as far as
	// this node knows without asking another (views show a task with
	// undone dependencies DELAYED).
	DepsDone func(ids []uint64) bool

	// DropReplicatedWrite is the seeded bug TestBugs.DropReplicatedWrite.
	DropReplicatedWrite bool
}

// Coordinator runs the AP side of the task API on one node: it writes
// task states to their partition's cohort with a write quorum, reads them
// back from R replicas (merging by the CRDT join and repairing replicas
// found behind), routes calls to the node that should answer them, and
// lists and counts across the cluster. Safe for concurrent use.
type Coordinator struct {
	cfg   Config
	store *storage.Store
	host  *replicas.Host
	peers *transport.Peers

	sendersMu sync.Mutex
	senders   map[string]*replicaSender // by peer API address
	hints     leaderHints               // leaders of partitions not replicated here (lists.go)

	specConflicts atomic.Uint64 // merges that met two specs for one id
	readRepairs   atomic.Uint64
	replicatesIn  atomic.Uint64 // incoming Replicate calls, for DropReplicatedWrite
}

// New returns a coordinator over cfg's store, host and peers.
func New(cfg Config) *Coordinator {
	return &Coordinator{cfg: cfg, store: cfg.Store, host: cfg.Host, peers: cfg.Peers,
		senders: map[string]*replicaSender{}}
}

// Stats are the coordinator's counters (metrics).
type Stats struct {
	SpecConflicts uint64 // merges that met two different specs for one id
	ReadRepairs   uint64 // replicas sent a merged state because a read found them behind
}

// Stats returns the counters so far.
func (c *Coordinator) Stats() Stats {
	return Stats{SpecConflicts: c.specConflicts.Load(), ReadRepairs: c.readRepairs.Load()}
}
