package node

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/trace"

	"github.com/norn-dev/norn/access"
	"github.com/norn-dev/norn/antientropy"
	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/testhooks"
	"github.com/norn-dev/norn/transport"
)

// Config configures a node. Zero fields take the defaults documented here
// (and in docs/OPERATIONS.md).
type Config struct {
	// DataDir holds the node's Pebble database (DataDir/db) and Raft
	// snapshots (DataDir/raft). Required.
	DataDir string
	// NodeID names the node in Raft groups and Status. Default "n1".
	NodeID string
	// MachineID is the base of this node's sonyflake machine ids: the node
	// uses MachineID*idGenerators .. +idGenerators-1. Must be unique in the
	// cluster. Default 1.
	MachineID uint16
	// Partitions is P, a power of two. Default 64.
	Partitions int
	// SkewBuffer is added to every lease before the monitor expires it; it
	// must exceed the worst clock offset between two nodes that may both
	// lead: more than 2 × MaxClockOffset + cluster.ClockMeasurementError
	// (100 ms; cluster.MinSkewBuffer). Default 2 s.
	SkewBuffer time.Duration
	// MaxClockOffset bounds how far this node's clock may be from the
	// median of the cluster's clocks (measured by gossip probes; from its
	// one measured peer's clock when it measures only one) while it leads
	// partitions: beyond it, or with no peer's clock measured, the node
	// hands over its leaderships and refuses every claim proposal until it
	// is back in bound (cluster.JudgeClock). Two nodes in bound can be
	// twice this apart, hence SkewBuffer's rule. Default 500 ms.
	MaxClockOffset time.Duration
	// LeaseGrace is the least lease a new partition leader leaves every live
	// claim (etcd-style promote), so a leader change never shortens a lease.
	// Default 10 s.
	LeaseGrace time.Duration
	// DefaultLease is the lease of a Claim or Renew that names none. Default
	// 30 s. MaxLease bounds requested leases. Default 1 h.
	DefaultLease time.Duration
	MaxLease     time.Duration
	// DefaultRetry is the retry policy of a retryable Abort of a task
	// whose spec has none (docs/API.md, "Retries"). Default: 25
	// attempts, waits from 1 s doubling up to 1 h, jitter 0.2.
	DefaultRetry *crdt.RetryPolicy
	// MaxWait bounds a Claim's long poll. Default 60 s.
	MaxWait time.Duration
	// MinQueueRetention is the shortest retention SetQueue takes for a
	// queue (QueueSettings.retention). Default an hour
	// (cluster.MinQueueRetentionMs); only the Jepsen harness's test hooks
	// lower it (nornd -test-hooks: a second), so that a run sees tasks
	// deleted. The rejoin rule never follows a queue retention below
	// the default.
	MinQueueRetention time.Duration
	// ScheduleRanDelay is a wait between a schedule tick's write and its
	// record in the meta group (server.Config.ScheduleRanDelay): 0 but
	// under the Jepsen harness's test hooks (nornd -test-hooks: 500 ms),
	// where it makes leader changes run ticks twice often.
	ScheduleRanDelay time.Duration
	// ClaimRecheck is how often a long-polling claim on a cluster of
	// several nodes looks across the cluster again even when nothing woke
	// it: the safety net under the wake-ups (see Claim), and the only way
	// to learn of tasks of partitions the node does not replicate.
	// Default 2 s.
	ClaimRecheck time.Duration
	// ClaimHeadsTTL is how long a claim relies on the best ready tasks
	// another leader reported, and ClaimHeadsWait how long a claim waits
	// for a leader's report before it goes on without it (priority across
	// the cluster, docs/API.md "Claim order"). Defaults 50 ms and 250 ms.
	ClaimHeadsTTL, ClaimHeadsWait time.Duration
	// Retention is how long a terminal task is kept after its terminal
	// event; then the monitor deletes it. Default 7 days.
	Retention time.Duration
	// MonitorInterval is how often the monitor looks for expired claims and
	// due delayed tasks. Default 250 ms.
	MonitorInterval time.Duration
	// AntiEntropyInterval is how often the node compares the partitions it
	// shares with each other node (their Merkle tree roots), when the last
	// round found them equal; a fifth of it after a round that found
	// differences. Jittered by 20%. Default 10 s.
	AntiEntropyInterval time.Duration
	// AntiEntropySettle is how long an exchange waits before comparing the
	// entries of differing segments a second time; only tasks that differ
	// both times are transferred (writes in flight are not differences).
	// Default 500 ms.
	AntiEntropySettle time.Duration
	// MaxMovesPerNode bounds the replica moves under way that involve one
	// node (as source or target); more wait queued. The meta leader's
	// setting counts. Default 2.
	MaxMovesPerNode int
	// MoveRate bounds the bytes per second the fills of this node's
	// incoming replicas (moves to it) send and ask for, over all of them;
	// anti-entropy rounds have AntiEntropyRate of their own. Default
	// 16 MiB/s.
	MoveRate int
	// MoveTargetTimeout is how long a move's target may be down (as gossip
	// sees it) before a move not yet promoted is rolled back; a promoted
	// move always finishes. The meta leader's setting counts. Default
	// 2 min.
	MoveTargetTimeout time.Duration
	// AutoRebalance lets the meta leader plan and apply a rebalance by
	// itself when a member has joined and holds nothing, or a member has
	// been dead for AutoDeadAfter (it is then removed as by Remove with
	// dead). Off by default: placement changes only on an admin's call.
	AutoRebalance bool
	// AutoDeadAfter is how long a member must be dead, as gossip sees it,
	// before AutoRebalance replaces it. Default 10 min.
	AutoDeadAfter time.Duration
	// LeaderBalanceInterval is how often the node compares the partition
	// leaderships it and the others hold with their fair shares, gossips
	// its own count and, when it leads too many, hands leaderships over
	// (replicas.LeaderBalancer). Default 1 s.
	LeaderBalanceInterval time.Duration
	// SchedulePass is how often the meta group's leader runs its
	// schedules' due ticks (server.RunSchedulesOnce). Default 200 ms.
	SchedulePass time.Duration
	// LeaderBalanceRate bounds the leadership transfers this node starts
	// to balance leaderships, per second on average (in bursts of at most
	// rate x interval, one at a time). Default 2.
	LeaderBalanceRate float64
	// LeaderBalanceTolerance is how far, as a fraction of its fair share,
	// a node's count of leaderships may be from it before leaderships
	// move (rounded outwards to the integers around the share for small
	// counts). Default 0.2 (-+20%).
	LeaderBalanceTolerance float64
	// NoLeaderBalance turns the handing over off: the node still gossips
	// its count (Status shows every node's) but moves no leadership.
	NoLeaderBalance bool
	// AntiEntropyTimeout bounds one exchange with one peer. Default 30 s.
	AntiEntropyTimeout time.Duration
	// AntiEntropyRate bounds the bytes per second anti-entropy sends and
	// asks for, over all peers. Default 16 MiB/s.
	AntiEntropyRate int
	// TreeLeafBits sizes every partition's Merkle tree: 2^TreeLeafBits
	// leaves (4 to 16). Every node of a cluster must use the same.
	// Default 14 (137 KiB per partition replica).
	TreeLeafBits int
	// Limits bounds request fields. Default crdt.DefaultLimits.
	Limits crdt.Limits
	// MaxRequestBytes bounds a client request's body (TaskService and
	// AdminService; a framed call's frame, plus 1 KiB of header): the
	// largest legitimate one is a batch (EnqueueBatch, ImportTasks),
	// which must fit in it. At least Limits.MaxPayloadBytes. Default
	// 4 MiB (4 payloads of the default limit; the Go client's batches
	// are at most 2 MiB). PeerService has PeerMaxRequestBytes, for
	// nodes only.
	MaxRequestBytes int
	// MaxInflightClientBytes bounds the bytes of client requests (bodies
	// of TaskService and AdminService calls, frames of the framed client
	// calls) the node holds at once, from the first byte read until the
	// call is answered; a request that finds no room is refused
	// RESOURCE_EXHAUSTED, at once over HTTP/2, after waiting up to a
	// second otherwise (transport.Budget). At least MaxRequestBytes +
	// 1 KiB. Default 64 MiB.
	MaxInflightClientBytes int
	// MaxInflightPeerBytes is MaxInflightClientBytes for the other
	// nodes' requests (PeerService bodies, framed peer calls on the Raft
	// port): a budget of their own, so that clients never starve Raft
	// and replication. At least PeerMaxRequestBytes + 1 KiB. Default
	// 256 MiB.
	MaxInflightPeerBytes int
	// Clock is the node's wall clock (HLC, leases, monitor). Default the
	// system clock; tests and the jepsen harness inject their own.
	Clock crdt.Clock
	// RaftTimeout is the heartbeat and election timeout of every partition
	// group. Default 1 s (tests use less).
	RaftTimeout time.Duration
	// RaftHeartbeatLinger is how long a partition group's heartbeat waits
	// to travel with the others to the same node (transport.Heartbeats).
	// Default 10 ms; negative: each heartbeat on its own, as
	// NetworkTransport sends it.
	RaftHeartbeatLinger time.Duration
	// Logger is the node's structured log. Default slog.Default().
	Logger *slog.Logger
	// RaftLogger receives hashicorp/raft's and memberlist's logs.
	// Default: NewRaftLogger(Logger, warnings and errors).
	RaftLogger hclog.Logger
	// Version is reported by Status.
	Version string
	// Build is the binary's build, reported by Status (nil: left out).
	Build *nornv1.BuildInfo
	// TracerProvider, when set, traces the node's calls and its quorum
	// writes, claims and anti-entropy rounds (package tracing; nornd sets
	// it from the OTEL_* environment). Nil, the default: tracing is off
	// and costs nothing.
	TracerProvider trace.TracerProvider

	// APIAddr is where other nodes and clients reach this node's API
	// (host:port), advertised through gossip and the ring. Required for
	// a node of a multi-node cluster.
	APIAddr string
	// RaftAddr is where this node listens for the Raft traffic of all its
	// groups (host:port; port 0 picks one). Default 127.0.0.1:0.
	RaftAddr string
	// GossipAddr is where this node gossips membership (TCP and UDP).
	// Default 127.0.0.1:0.
	GossipAddr string
	// GossipLAN picks memberlist's LAN timings instead of its loopback
	// ones (for nodes on different machines).
	GossipLAN bool
	// Join is the gossip addresses of nodes to join at start. A restarted
	// node also contacts the nodes of the ring it kept.
	Join []string
	// BootstrapExpect is how many nodes form a new cluster: once gossip
	// shows that many nodes without a cluster, the one with the lowest
	// id creates the cluster over them. 1 forms a cluster of this node
	// alone at once. 0 (with Join) joins an existing cluster. Ignored
	// once the node belongs to a cluster. Default 1 when Join is empty.
	BootstrapExpect int
	// Replication is N, the replicas of each partition, used when this
	// node creates the cluster (capped at BootstrapExpect). Default 3.
	Replication int
	// WriteTimeout bounds how long a write waits for its quorum. Default
	// 5 s.
	WriteTimeout time.Duration
	// WALMinSyncInterval is the least time between two fsyncs of the
	// node's write-ahead log (storage.Config.WALMinSyncInterval): synced
	// writes that come sooner wait and share the next one. Default
	// DefaultWALMinSyncInterval; negative: sync at once.
	WALMinSyncInterval time.Duration

	// TLS, when set, is the node's certificate (of node NodeID) and its CA
	// bundle: peers are called over TLS and PeerService calls take their
	// node id from the caller's certificate (docs/SECURITY.md). The API
	// listener's TLS is the server's (cmd/nornd serves it with
	// transport.TLSSplitListener). Nil: cleartext.
	TLS *transport.Certs
	// GossipKey, when set (16, 24 or 32 bytes), encrypts and
	// authenticates gossip with memberlist's keyring; every node needs
	// the same key. Nil: cleartext gossip.
	GossipKey []byte
	// Auth, when set, is the access file (nornd -auth-file): users'
	// grants and tokens, checked on every TaskService and AdminService
	// call (docs/SECURITY.md).
	Auth *access.Rules
	// MetricsElsewhere takes GET /metrics off the API port: nornd
	// -metrics-addr serves MetricsHandler on an address of its own.
	MetricsElsewhere bool
	// Insecure is nornd -insecure (cleartext allowed beyond loopback),
	// shown in Status.
	Insecure bool

	// Test-only fields, set by nornd -test-hooks for the Jepsen harness;
	// production leaves them zero.

	// StorageFS is the filesystem Pebble runs on (DataDir/db); nil is the
	// OS filesystem. nornd -test-hooks passes a faultfs.FS, which keeps
	// unsynced writes in memory so a crash loses them as a power loss
	// would.
	StorageFS vfs.FS
	// TestBugs are seeded bugs (nornd -test-bug), all off by default.
	TestBugs TestBugs
	// HoldRing, in a testhooks build only (ignored otherwise): while it
	// returns true the node adopts no newer ring from the meta group or
	// gossip (replicas.Config.HoldRing), as a node cut off from both;
	// in-process tests hold a node on an old ring with it.
	HoldRing func() bool

	// olderBuild makes the node gossip no features
	// (cluster.NodeMeta.Features), as a node of a build from before them:
	// the tests of the feature gates.
	olderBuild bool
}

// DefaultWALMinSyncInterval is Config.WALMinSyncInterval's default: with 8
// workers completing tasks one at a time on 3 nodes, 250 µs cut server
// CPU per task by about 11% and raised throughput by about 8%; 1 ms cost
// more latency than it saved (docs/BENCHMARKS.md).
const DefaultWALMinSyncInterval = 250 * time.Microsecond

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.NodeID == "" {
		c.NodeID = "n1"
	}
	if c.MachineID == 0 {
		c.MachineID = 1
	}
	if c.Partitions == 0 {
		c.Partitions = ring.DefaultPartitions
	}
	def(&c.SkewBuffer, 2*time.Second)
	def(&c.MaxClockOffset, 500*time.Millisecond)
	def(&c.LeaseGrace, 10*time.Second)
	def(&c.DefaultLease, 30*time.Second)
	if c.DefaultRetry == nil {
		c.DefaultRetry = &crdt.RetryPolicy{MaxAttempts: 25, InitialMs: 1000, MaxMs: 3_600_000, MultiplierMilli: 2000, JitterMilli: 200}
	}
	def(&c.MaxLease, time.Hour)
	def(&c.MaxWait, 60*time.Second)
	def(&c.MinQueueRetention, cluster.MinQueueRetentionMs*time.Millisecond)
	def(&c.ClaimRecheck, 2*time.Second)
	def(&c.Retention, 7*24*time.Hour)
	def(&c.MonitorInterval, 250*time.Millisecond)
	def(&c.AntiEntropyInterval, 10*time.Second)
	def(&c.AntiEntropySettle, 500*time.Millisecond)
	def(&c.AntiEntropyTimeout, 30*time.Second)
	if c.MaxMovesPerNode == 0 {
		c.MaxMovesPerNode = 2
	}
	if c.AntiEntropyRate == 0 {
		c.AntiEntropyRate = 16 << 20
	}
	if c.MoveRate == 0 {
		c.MoveRate = 16 << 20
	}
	def(&c.MoveTargetTimeout, 2*time.Minute)
	def(&c.AutoDeadAfter, 10*time.Minute)
	def(&c.LeaderBalanceInterval, time.Second)
	def(&c.SchedulePass, 200*time.Millisecond)
	if c.LeaderBalanceRate == 0 {
		c.LeaderBalanceRate = 2
	}
	if c.LeaderBalanceTolerance == 0 {
		c.LeaderBalanceTolerance = 0.2
	}
	if c.TreeLeafBits == 0 {
		c.TreeLeafBits = antientropy.DefaultLeafBits
	}
	def(&c.RaftTimeout, time.Second)
	def(&c.RaftHeartbeatLinger, transport.DefaultHeartbeatLinger)
	def(&c.WriteTimeout, 5*time.Second)
	def(&c.WALMinSyncInterval, DefaultWALMinSyncInterval)
	if c.RaftAddr == "" {
		c.RaftAddr = "127.0.0.1:0"
	}
	if c.GossipAddr == "" {
		c.GossipAddr = "127.0.0.1:0"
	}
	if c.BootstrapExpect == 0 && len(c.Join) == 0 {
		c.BootstrapExpect = 1
	}
	if c.Replication == 0 {
		c.Replication = 3
	}
	if c.Limits == (crdt.Limits{}) {
		c.Limits = crdt.DefaultLimits
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 4 << 20
	}
	if c.MaxInflightClientBytes == 0 {
		c.MaxInflightClientBytes = DefaultMaxInflightClientBytes
	}
	if c.MaxInflightPeerBytes == 0 {
		c.MaxInflightPeerBytes = DefaultMaxInflightPeerBytes
	}
	if c.Clock == nil {
		c.Clock = crdt.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.RaftLogger == nil {
		c.RaftLogger = NewRaftLogger(c.Logger, hclog.Warn)
	}
	if c.Version == "" {
		c.Version = "dev"
	}
}

// maxClockOffsetFor is the largest max clock offset, in whole
// milliseconds, that a skew buffer of skew covers (cluster.MinSkewBuffer
// below skew); negative when none does.
func maxClockOffsetFor(skew time.Duration) time.Duration {
	return ((skew-cluster.ClockMeasurementError)/2 - time.Nanosecond).Truncate(time.Millisecond)
}

// Validate reports the first invalid field, naming it.
func (c *Config) Validate() error {
	switch {
	case c.DataDir == "":
		return errors.New("node: data dir is required")
	case c.MachineID >= 1<<16/idGenerators:
		return fmt.Errorf("node: machine id %d must be below %d", c.MachineID, 1<<16/idGenerators)
	case c.Retention < 0:
		return errors.New("node: retention must not be negative")
	case c.MonitorInterval < 0 || c.ClaimRecheck < 0 || c.MaxWait < 0 || c.ClaimHeadsTTL < 0 || c.ClaimHeadsWait < 0:
		return errors.New("node: monitor interval, claim recheck, claim heads TTL and wait, and max wait must not be negative")
	case c.MaxMovesPerNode < 0 || c.MoveRate < 0 || c.MoveTargetTimeout < 0 || c.AutoDeadAfter < 0:
		return errors.New("node: max moves per node, move rate, move target timeout and auto dead after must not be negative")
	case c.LeaderBalanceInterval < 0 || c.LeaderBalanceRate < 0:
		return errors.New("node: leader balance interval and rate must not be negative")
	case c.LeaderBalanceTolerance <= 0 || c.LeaderBalanceTolerance >= 1:
		return fmt.Errorf("node: leader balance tolerance %g: want above 0 and below 1", c.LeaderBalanceTolerance)
	case c.WALMinSyncInterval > time.Second:
		return errors.New("node: WALMinSyncInterval must be at most 1s")
	case c.AntiEntropyInterval < 0 || c.AntiEntropySettle < 0 || c.AntiEntropyTimeout < 0 || c.AntiEntropyRate < 0:
		return errors.New("node: anti-entropy interval, settle, timeout and rate must not be negative")
	case c.TreeLeafBits < antientropy.MinLeafBits || c.TreeLeafBits > antientropy.MaxLeafBits:
		return fmt.Errorf("node: tree leaf bits %d: want %d to %d", c.TreeLeafBits, antientropy.MinLeafBits, antientropy.MaxLeafBits)
	case c.SkewBuffer < 0 || c.LeaseGrace < 0 || c.MaxClockOffset < 0:
		return errors.New("node: skew buffer, max clock offset and lease grace must not be negative")
	case testhooks.Built && c.TestBugs.SkewOneOffset && c.SkewBuffer <= c.MaxClockOffset:
		return fmt.Errorf("node: skew buffer %s must be larger than max clock offset %s (seeded bug skew-one-offset)", c.SkewBuffer, c.MaxClockOffset)
	case !(testhooks.Built && c.TestBugs.SkewOneOffset) && c.SkewBuffer <= cluster.MinSkewBuffer(c.MaxClockOffset):
		return fmt.Errorf("node: skew buffer %s (-skew-buffer) must be larger than 2 × max clock offset %s (-max-clock-offset) + %s (the clock measurement error) = %s: "+
			"two nodes whose clocks are each within max clock offset of the cluster median can be twice that apart, and a lease granted by the slow one "+
			"and taken back by the fast one ends that much early on the fast one's clock; raise the skew buffer or lower the max clock offset "+
			"(to at most %s for this buffer)",
			c.SkewBuffer, c.MaxClockOffset, cluster.ClockMeasurementError, cluster.MinSkewBuffer(c.MaxClockOffset), maxClockOffsetFor(c.SkewBuffer))
	case c.DefaultRetry.Validate() != nil:
		return fmt.Errorf("node: default retry policy: %w", c.DefaultRetry.Validate())
	case c.DefaultLease <= 0 || c.MaxLease < c.DefaultLease:
		return fmt.Errorf("node: default lease %s must be positive and at most the max lease %s", c.DefaultLease, c.MaxLease)
	case c.BootstrapExpect < 0 || c.Replication < 1:
		return fmt.Errorf("node: bootstrap expect %d and replication %d must be positive", c.BootstrapExpect, c.Replication)
	case c.APIAddr == "" && (c.BootstrapExpect != 1 || len(c.Join) > 0):
		return errors.New("node: the API address is required in a multi-node cluster")
	case c.Partitions > 1<<15:
		return fmt.Errorf("node: partitions %d above the limit %d", c.Partitions, 1<<15)
	case c.MaxRequestBytes < c.Limits.MaxPayloadBytes:
		return fmt.Errorf("node: max request size %d is below the payload limit %d", c.MaxRequestBytes, c.Limits.MaxPayloadBytes)
	case c.MaxRequestBytes > PeerMaxRequestBytes:
		return fmt.Errorf("node: max request size %d is above %d, the most a request may be", c.MaxRequestBytes, PeerMaxRequestBytes)
	case c.MaxInflightClientBytes < c.MaxRequestBytes+clientFrameOverhead:
		return fmt.Errorf("node: max in-flight client bytes %d is below the largest client request, %d (max request size + %d)",
			c.MaxInflightClientBytes, c.MaxRequestBytes+clientFrameOverhead, clientFrameOverhead)
	case c.MaxInflightPeerBytes < PeerMaxRequestBytes+clientFrameOverhead:
		return fmt.Errorf("node: max in-flight peer bytes %d is below the largest peer request, %d", c.MaxInflightPeerBytes, PeerMaxRequestBytes+clientFrameOverhead)
	}
	if err := ring.ValidatePartitions(c.Partitions); err != nil {
		return fmt.Errorf("node: partitions: %w", err)
	}
	return nil
}

// DefaultLimits returns the default request field limits.
func DefaultLimits() crdt.Limits { return crdt.DefaultLimits }

// features are the features the node gossips: this build's, none for an
// olderBuild test node.
func (c *Config) features() uint64 {
	if c.olderBuild {
		return 0
	}
	return cluster.FeaturesBuilt
}
