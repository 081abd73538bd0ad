package main

import (
	"flag"
	"time"

	"github.com/norn-dev/norn/node"
	"github.com/norn-dev/norn/transport"
)

// options are the flags of nornd that are not fields of node.Config
// (defineFlags sets those directly).
type options struct {
	config        *string
	listen        *string
	logLevel      *string
	logFormat     *string
	raftLogLevel  *string
	machine       *uint
	machineFromID *bool
	advertise     *string
	join          *string
	leaderBalance *bool
	tlsCA         *string
	tlsCert       *string
	tlsKey        *string
	gossipKey     *string
	authFile      *string
	insecure      *bool
	metricsAddr   *string
	pprofAddr     *string
	showVersion   *bool
	handOver      *time.Duration
	hooks         *testHooks // none in a release build (testhooks_off.go)
}

// defineFlags defines every nornd flag on fs: node.Config's in cfg, the
// others in the options it returns. docs/CONFIGURATION.md lists them all
// (TestConfigurationTable checks it).
func defineFlags(fs *flag.FlagSet, cfg *node.Config) *options {
	o := &options{}
	o.config = fs.String("config", "", "JSON file of options (keys are flag names); flags given on the command line win")
	o.listen = fs.String("listen", "127.0.0.1:7400", "address of the API (gRPC, Connect and JSON over HTTP/2 cleartext and HTTP/1.1)")
	o.logLevel = fs.String("log-level", "info", "log level: debug, info, warn or error, then optionally levels per component, comma-separated: info,dispatch=debug,antientropy=warn (components: "+componentList()+")")
	o.logFormat = fs.String("log-format", "text", "log format: text (slog's key=value lines) or json (one JSON object per line)")
	o.raftLogLevel = fs.String("raft-log-level", "error", "log level of the Raft library: trace, debug, info, warn or error")
	fs.StringVar(&cfg.DataDir, "data-dir", "./data", "directory of the node's data (created if missing)")
	fs.StringVar(&cfg.NodeID, "node-id", "n1", "this node's id")
	o.machine = fs.Uint("machine-id", 1, "sonyflake machine id base, unique per node (1-8191)")
	o.machineFromID = fs.Bool("machine-id-from-node-id", false, "take the machine id from -node-id: 1 + the number it ends with (norn-0: 1, norn-4: 5), for a Kubernetes StatefulSet whose node ids are its pod names")
	fs.IntVar(&cfg.Partitions, "partitions", 64, "number of partitions P (power of two; fixed when the data dir is created)")
	fs.DurationVar(&cfg.SkewBuffer, "skew-buffer", 2*time.Second, "extra time before an expired lease is taken back; must exceed 2 × -max-clock-offset + 100ms (the clock measurement error): two nodes each within -max-clock-offset of the median can be twice that apart")
	fs.DurationVar(&cfg.MaxClockOffset, "max-clock-offset", 500*time.Millisecond, "how far this node's clock may be from the cluster median (from its one measured peer's clock when it measures only one) while it leads partitions; beyond it, or with no peer measured, the node hands its leaderships over until back in bound")
	fs.DurationVar(&cfg.LeaseGrace, "lease-grace", 10*time.Second, "least lease left to every live claim when a node becomes a partition's leader")
	fs.DurationVar(&cfg.DefaultLease, "default-lease", 30*time.Second, "lease of a claim or renew that names none")
	fs.DurationVar(&cfg.MaxLease, "max-lease", time.Hour, "longest lease a claim or renew may ask for")
	fs.DurationVar(&cfg.MaxWait, "max-wait", time.Minute, "longest long poll of a claim")
	fs.DurationVar(&cfg.Retention, "retention", 7*24*time.Hour, "how long a completed, aborted or cancelled task is kept")
	fs.IntVar(&cfg.Limits.MaxPayloadBytes, "max-payload-bytes", 1<<20, "largest payload, result or update data")
	fs.IntVar(&cfg.MaxRequestBytes, "max-request-bytes", 4<<20, "largest body of a client request (TaskService, AdminService; a framed call's frame has 1 KiB more); PeerService takes up to 64 MiB, from nodes only")
	fs.IntVar(&cfg.MaxInflightClientBytes, "max-inflight-client-bytes", node.DefaultMaxInflightClientBytes, "bytes of client requests the node holds at once, from their first byte until answered; a request that does not fit is refused RESOURCE_EXHAUSTED (at least -max-request-bytes + 1 KiB)")
	fs.IntVar(&cfg.MaxInflightPeerBytes, "max-inflight-peer-bytes", node.DefaultMaxInflightPeerBytes, "bytes of the other nodes' requests (PeerService, framed peer calls) the node holds at once, a budget apart from the clients' (at least 64 MiB + 1 KiB)")
	fs.DurationVar(&cfg.MonitorInterval, "monitor-interval", 250*time.Millisecond, "how often the leader looks for expired claims and due delayed tasks")
	fs.DurationVar(&cfg.RaftTimeout, "raft-timeout", time.Second, "Raft heartbeat and election timeout of every partition group")
	fs.DurationVar(&cfg.RaftHeartbeatLinger, "raft-heartbeat-linger", transport.DefaultHeartbeatLinger, "how long a partition group's Raft heartbeat waits to travel with the others to the same node (negative: each on its own)")
	o.advertise = fs.String("advertise", "", "API address other nodes and clients use to reach this node (default: the -listen address)")
	fs.StringVar(&cfg.RaftAddr, "raft-addr", "127.0.0.1:0", "address of the Raft listener (all partition groups and the meta group); fixed ports are needed for restarts")
	fs.StringVar(&cfg.GossipAddr, "gossip-addr", "127.0.0.1:0", "address of gossip (memberlist, TCP and UDP)")
	o.join = fs.String("join", "", "comma-separated gossip addresses of nodes to join")
	fs.IntVar(&cfg.BootstrapExpect, "bootstrap-expect", 0, "create a new cluster once this many nodes are there (default 1 without -join: a cluster of this node alone)")
	fs.IntVar(&cfg.Replication, "replication", 3, "replicas of each partition N, for a new cluster (capped at -bootstrap-expect)")
	fs.DurationVar(&cfg.WriteTimeout, "write-timeout", 5*time.Second, "how long a write waits for its quorum")
	fs.DurationVar(&cfg.WALMinSyncInterval, "wal-min-sync-interval", node.DefaultWALMinSyncInterval, "least time between two fsyncs of the write-ahead log: synced writes that come sooner wait and share the next one (negative: sync at once)")
	fs.DurationVar(&cfg.AntiEntropyInterval, "antientropy-interval", 10*time.Second, "how often replicas compare their Merkle trees with each peer (a fifth of it after differences)")
	fs.IntVar(&cfg.AntiEntropyRate, "antientropy-rate", 16<<20, "bytes per second anti-entropy may send and ask for")
	fs.IntVar(&cfg.MaxMovesPerNode, "max-moves-per-node", 2, "replica moves under way at once per node during a rebalance (the meta leader's setting counts)")
	fs.IntVar(&cfg.MoveRate, "move-rate", 16<<20, "bytes per second the fills of replicas moving to this node may send and ask for, over all of them")
	fs.DurationVar(&cfg.MoveTargetTimeout, "move-target-timeout", 2*time.Minute, "how long a move's target may be down before a move not yet promoted is rolled back (the meta leader's setting counts)")
	fs.BoolVar(&cfg.AutoRebalance, "auto-rebalance", false, "let the meta leader rebalance by itself when a joined member holds nothing or a member has been dead for -auto-dead-after (the meta leader's setting counts)")
	fs.DurationVar(&cfg.AutoDeadAfter, "auto-dead-after", 10*time.Minute, "with -auto-rebalance: how long a member must be dead before it is replaced")
	o.leaderBalance = fs.Bool("leader-balance", true, "hand partition leaderships over until every node leads within -leader-balance-tolerance of its fair share (false: only report the counts)")
	fs.DurationVar(&cfg.LeaderBalanceInterval, "leader-balance-interval", time.Second, "how often the node compares leader counts with fair shares and gossips its own")
	fs.Float64Var(&cfg.LeaderBalanceRate, "leader-balance-rate", 2, "leadership transfers per second this node may start to balance leaderships (on average; one at a time)")
	fs.Float64Var(&cfg.LeaderBalanceTolerance, "leader-balance-tolerance", 0.2, "how far from its fair share of leaderships a node may be, as a fraction of it, before leaderships move (above 0, below 1)")
	fs.IntVar(&cfg.TreeLeafBits, "tree-leaf-bits", 14, "Merkle tree size: 2^bits leaves per partition replica, 4 to 16 (the same on every node)")
	fs.BoolVar(&cfg.GossipLAN, "gossip-lan", false, "use LAN gossip timings (nodes on several machines) instead of loopback ones")
	o.tlsCA = fs.String("tls-ca", "", "PEM bundle of the cluster's CA certificates (old and new ones during a rotation); with -tls-cert and -tls-key the API and Raft ports serve TLS 1.3 only and peers are called over TLS (docs/SECURITY.md)")
	o.tlsCert = fs.String("tls-cert", "", "PEM certificate of this node (nornctl cert create-node: its URI SAN names -node-id); reloaded when the files change or on SIGHUP")
	o.tlsKey = fs.String("tls-key", "", "PEM private key of -tls-cert")
	o.gossipKey = fs.String("gossip-key", "", "file of the cluster's gossip key (nornctl cert create-gossip-key: base64 of 32 bytes): gossip encrypted and authenticated with it; the same on every node")
	o.authFile = fs.String("auth-file", "", "access file: users' grants (roles on queues) and hashed tokens (nornctl grant, nornctl token create); every TaskService and AdminService call then needs a user allowed to make it; reloaded when it changes or on SIGHUP (docs/SECURITY.md)")
	o.insecure = fs.Bool("insecure", false, "allow serving cleartext on an address that is not loopback (logged as a warning at start)")
	o.metricsAddr = fs.String("metrics-addr", "", "if set, serve GET /metrics (Prometheus) on this address, in cleartext, and not on the API port")
	o.pprofAddr = fs.String("pprof-addr", "", "if set, serve net/http/pprof on this address (keep it on loopback)")
	o.showVersion = fs.Bool("version", false, "print the version and exit")
	o.handOver = fs.Duration("handover-timeout", 10*time.Second, "on SIGTERM or SIGINT, how long the node may take to hand its partition leaderships over to the other nodes before it stops serving (0: hand nothing over; a second signal stops waiting)")
	o.hooks = addTestHookFlags(fs)
	return o
}
