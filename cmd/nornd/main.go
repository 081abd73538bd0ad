package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // served only with -pprof-addr
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/norn-dev/norn/access"
	"github.com/norn-dev/norn/node"
	"github.com/norn-dev/norn/transport"
)

var version = "dev"

func main() {
	if err := run(os.Args[1:]); errors.Is(err, flag.ErrHelp) {
		return
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "nornd:", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2) // as the flag package does
		}
		os.Exit(1)
	}
}

// usageError is a bad flag or flag value: nornd exits with code 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func run(args []string) error {
	fs := flag.NewFlagSet("nornd", flag.ContinueOnError)
	var cfg node.Config
	config := fs.String("config", "", "JSON file of options (keys are flag names); flags given on the command line win")
	listen := fs.String("listen", "127.0.0.1:7400", "address of the API (gRPC, Connect and JSON over HTTP/2 cleartext and HTTP/1.1)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	raftLogLevel := fs.String("raft-log-level", "error", "log level of the Raft library: trace, debug, info, warn or error")
	fs.StringVar(&cfg.DataDir, "data-dir", "./data", "directory of the node's data (created if missing)")
	fs.StringVar(&cfg.NodeID, "node-id", "n1", "this node's id")
	machine := fs.Uint("machine-id", 1, "sonyflake machine id base, unique per node (1-8191)")
	machineFromID := fs.Bool("machine-id-from-node-id", false, "take the machine id from -node-id: 1 + the number it ends with (norn-0: 1, norn-4: 5), for a Kubernetes StatefulSet whose node ids are its pod names")
	fs.IntVar(&cfg.Partitions, "partitions", 64, "number of partitions P (power of two; fixed when the data dir is created)")
	fs.DurationVar(&cfg.SkewBuffer, "skew-buffer", 2*time.Second, "extra time before an expired lease is taken back; must exceed -max-clock-offset")
	fs.DurationVar(&cfg.MaxClockOffset, "max-clock-offset", 500*time.Millisecond, "how far this node's clock may be from the cluster median while it leads partitions; beyond it the node hands its leaderships over until back in bound")
	fs.DurationVar(&cfg.LeaseGrace, "lease-grace", 10*time.Second, "least lease left to every live claim when a node becomes a partition's leader")
	fs.DurationVar(&cfg.DefaultLease, "default-lease", 30*time.Second, "lease of a claim or renew that names none")
	fs.DurationVar(&cfg.MaxLease, "max-lease", time.Hour, "longest lease a claim or renew may ask for")
	fs.DurationVar(&cfg.MaxWait, "max-wait", time.Minute, "longest long poll of a claim")
	fs.DurationVar(&cfg.Retention, "retention", 7*24*time.Hour, "how long a completed, aborted or cancelled task is kept")
	fs.IntVar(&cfg.Limits.MaxPayloadBytes, "max-payload-bytes", 1<<20, "largest payload, result or update data")
	fs.IntVar(&cfg.MaxRequestBytes, "max-request-bytes", 4<<20, "largest request body")
	fs.DurationVar(&cfg.MonitorInterval, "monitor-interval", 250*time.Millisecond, "how often the leader looks for expired claims and due delayed tasks")
	fs.DurationVar(&cfg.RaftTimeout, "raft-timeout", time.Second, "Raft heartbeat and election timeout of every partition group")
	fs.DurationVar(&cfg.RaftHeartbeatLinger, "raft-heartbeat-linger", transport.DefaultHeartbeatLinger, "how long a partition group's Raft heartbeat waits to travel with the others to the same node (negative: each on its own)")
	advertise := fs.String("advertise", "", "API address other nodes and clients use to reach this node (default: the -listen address)")
	fs.StringVar(&cfg.RaftAddr, "raft-addr", "127.0.0.1:0", "address of the Raft listener (all partition groups and the meta group); fixed ports are needed for restarts")
	fs.StringVar(&cfg.GossipAddr, "gossip-addr", "127.0.0.1:0", "address of gossip (memberlist, TCP and UDP)")
	join := fs.String("join", "", "comma-separated gossip addresses of nodes to join")
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
	leaderBalance := fs.Bool("leader-balance", true, "hand partition leaderships over until every node leads within -leader-balance-tolerance of its fair share (false: only report the counts)")
	fs.DurationVar(&cfg.LeaderBalanceInterval, "leader-balance-interval", time.Second, "how often the node compares leader counts with fair shares and gossips its own")
	fs.Float64Var(&cfg.LeaderBalanceRate, "leader-balance-rate", 2, "leadership transfers per second this node may start to balance leaderships (on average; one at a time)")
	fs.Float64Var(&cfg.LeaderBalanceTolerance, "leader-balance-tolerance", 0.2, "how far from its fair share of leaderships a node may be, as a fraction of it, before leaderships move (above 0, below 1)")
	fs.IntVar(&cfg.TreeLeafBits, "tree-leaf-bits", 14, "Merkle tree size: 2^bits leaves per partition replica, 4 to 16 (the same on every node)")
	fs.BoolVar(&cfg.GossipLAN, "gossip-lan", false, "use LAN gossip timings (nodes on several machines) instead of loopback ones")
	tlsCA := fs.String("tls-ca", "", "PEM bundle of the cluster's CA certificates (old and new ones during a rotation); with -tls-cert and -tls-key the API and Raft ports serve TLS 1.3 only and peers are called over TLS (docs/SECURITY.md)")
	tlsCert := fs.String("tls-cert", "", "PEM certificate of this node (nornctl cert create-node: its URI SAN names -node-id); reloaded when the files change or on SIGHUP")
	tlsKey := fs.String("tls-key", "", "PEM private key of -tls-cert")
	gossipKey := fs.String("gossip-key", "", "file of the cluster's gossip key (nornctl cert create-gossip-key: base64 of 32 bytes): gossip encrypted and authenticated with it; the same on every node")
	authFile := fs.String("auth-file", "", "access file: users' grants (roles on queues) and hashed tokens (nornctl grant, nornctl token create); every TaskService and AdminService call then needs a user allowed to make it; reloaded when it changes or on SIGHUP (docs/SECURITY.md)")
	insecure := fs.Bool("insecure", false, "allow serving cleartext on an address that is not loopback (logged as a warning at start)")
	metricsAddr := fs.String("metrics-addr", "", "if set, serve GET /metrics (Prometheus) on this address, in cleartext, and not on the API port")
	pprofAddr := fs.String("pprof-addr", "", "if set, serve net/http/pprof on this address (keep it on loopback)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	hooks := addTestHookFlags(fs) // none in a release build (testhooks_off.go)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if *showVersion {
		fmt.Println(version)
		return nil
	}
	if *config != "" {
		if err := applyConfigFile(fs, *config); err != nil {
			return usageError{err}
		}
	}
	if *machineFromID {
		m, err := machineIDFromNodeID(cfg.NodeID)
		if err != nil {
			return usageError{err}
		}
		*machine = m
	}
	if *machine == 0 || *machine > 1<<16-1 {
		return usageError{fmt.Errorf("-machine-id: %d out of range", *machine)}
	}
	tlsFiles := transport.TLSFiles{CA: *tlsCA, Cert: *tlsCert, Key: *tlsKey}
	if err := checkSecure(tlsFiles, *gossipKey != "", *insecure, *listen, cfg.RaftAddr, cfg.GossipAddr); err != nil {
		return usageError{err}
	}
	if *gossipKey != "" {
		key, err := transport.ReadGossipKey(*gossipKey)
		if err != nil {
			return usageError{fmt.Errorf("-gossip-key: %w", err)}
		}
		cfg.GossipKey = key
	}
	cfg.MachineID = uint16(*machine)
	cfg.NoLeaderBalance = !*leaderBalance
	if cfg.LeaderBalanceInterval <= 0 || cfg.LeaderBalanceRate <= 0 {
		return usageError{errors.New("-leader-balance-interval and -leader-balance-rate must be positive (-leader-balance=false turns balancing off)")}
	}
	if cfg.LeaderBalanceTolerance <= 0 || cfg.LeaderBalanceTolerance >= 1 {
		return usageError{fmt.Errorf("-leader-balance-tolerance %g: want above 0 and below 1", cfg.LeaderBalanceTolerance)}
	}
	lim := cfg.Limits.MaxPayloadBytes
	cfg.Limits = node.DefaultLimits()
	cfg.Limits.MaxPayloadBytes = lim
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usageError{fmt.Errorf("-log-level: %w", err)}
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg.Logger = logger
	rl := hclog.LevelFromString(*raftLogLevel)
	if rl == hclog.NoLevel {
		return usageError{fmt.Errorf("-raft-log-level: unknown level %q", *raftLogLevel)}
	}
	cfg.RaftLogger = hclog.New(&hclog.LoggerOptions{Name: "raft", Level: rl, Output: os.Stderr})
	cfg.Version = version
	for _, a := range strings.Split(*join, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.Join = append(cfg.Join, a)
		}
	}

	if err := hooks.configure(&cfg, logger); err != nil {
		return usageError{err}
	}
	if tlsFiles.CA != "" {
		certs, err := loadNodeCerts(tlsFiles, cfg.NodeID)
		if err != nil {
			return err
		}
		cfg.TLS = certs
	}
	if *authFile != "" {
		auth, err := access.LoadRules(*authFile)
		if err != nil {
			return usageError{fmt.Errorf("-auth-file: %w", err)}
		}
		cfg.Auth = auth
	}
	cfg.Insecure = *insecure
	cfg.MetricsElsewhere = *metricsAddr != ""
	if *insecure {
		logger.Warn("started with -insecure: cleartext is allowed on addresses that are not loopback; anyone who reaches a cleartext port can read and write every task",
			"tls", cfg.TLS != nil, "gossip_encrypted", cfg.GossipKey != nil)
	}

	// Listen first: the node advertises the address it really got.
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	cfg.APIAddr = *advertise
	if cfg.APIAddr == "" {
		cfg.APIAddr = ln.Addr().String()
	}
	n, err := node.New(cfg)
	if err != nil {
		ln.Close()
		return err
	}
	handler := hooks.wrap(n.Handler(), logger)
	srv := node.NewHTTPServer(handler)
	if *metricsAddr != "" {
		mln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			ln.Close()
			n.Close()
			return fmt.Errorf("-metrics-addr: %w", err)
		}
		msrv := &http.Server{Handler: n.MetricsHandler(), ReadHeaderTimeout: node.HTTPReadHeaderTimeout}
		go msrv.Serve(mln) //nolint:errcheck // stops with the process
		defer msrv.Close()
	}
	if *pprofAddr != "" {
		go func() {
			// http.DefaultServeMux carries net/http/pprof's handlers.
			if err := http.ListenAndServe(*pprofAddr, nil); err != nil {
				logger.Error("pprof server stopped", "err", err)
			}
		}()
	}
	// One port: HTTP (connect, /healthz, /metrics) and the framed client
	// calls (transport.SplitListener).
	var httpLn, framedLn net.Listener
	if cfg.TLS != nil {
		httpLn, framedLn = transport.TLSSplitListener(ln, cfg.TLS.ServerConfig(nil, false))
	} else {
		httpLn, framedLn = transport.SplitListener(ln)
	}
	framed := n.ServeClientRPC(framedLn, logger)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(httpLn) }()
	logger.Info("nornd serving", "addr", ln.Addr().String(), "data_dir", cfg.DataDir, "node_id", cfg.NodeID,
		"raft", n.RaftAddr(), "gossip", n.GossipAddr(), "partitions", cfg.Partitions, "version", version)
	go func() {
		if err := n.WaitReady(60 * time.Second); err != nil {
			logger.Warn("not ready yet", "err", err)
		}
	}()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	if cfg.TLS != nil {
		go cfg.TLS.Watch(certWatchPeriod, stopWatch, func(err error) {
			logger.Error("reloading the TLS certificates failed; the old ones stay in use", "err", err)
		})
	}
	if cfg.Auth != nil {
		go cfg.Auth.Watch(certWatchPeriod, stopWatch, func(err error) {
			logger.Error("reloading the access file failed; the old rules stay in use", "err", err)
		})
	}
wait:
	for {
		select {
		case s := <-sig:
			if s == syscall.SIGHUP {
				reloadCerts(cfg.TLS, logger)
				if cfg.Auth != nil {
					if err := cfg.Auth.Reload(); err != nil {
						logger.Error("SIGHUP: reloading the access file failed; the old rules stay in use", "err", err)
					} else {
						logger.Info("SIGHUP: access file reloaded")
					}
				}
				continue
			}
			logger.Info("shutting down", "signal", s.String())
			break wait
		case err := <-served:
			framed.Close()
			n.Close()
			return fmt.Errorf("serve: %w", err)
		}
	}
	n.StopWaiting() // long polls return so Shutdown can finish
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shutdownErr := srv.Shutdown(ctx)
	framed.Close() // waits for its calls under way
	closeErr := n.Close()
	if err := errors.Join(shutdownErr, closeErr); err != nil {
		return err
	}
	logger.Info("stopped cleanly")
	return nil
}

// machineIDFromNodeID is 1 + the decimal number id ends with: a
// StatefulSet's pod names (norn-0, norn-1, ...) give each pod a machine id
// of its own without a shell in the image to compute it.
func machineIDFromNodeID(id string) (uint, error) {
	digits := len(id) - len(strings.TrimRightFunc(id, func(r rune) bool { return r >= '0' && r <= '9' }))
	if digits == 0 {
		return 0, fmt.Errorf("-machine-id-from-node-id: node id %q does not end with a number", id)
	}
	n, err := strconv.ParseUint(id[len(id)-digits:], 10, 16)
	if err != nil {
		return 0, fmt.Errorf("-machine-id-from-node-id: node id %q: %w", id, err)
	}
	return uint(n) + 1, nil
}

// applyConfigFile sets every flag named in a JSON object file that was not
// given on the command line.
func applyConfigFile(fs *flag.FlagSet, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-config: %w", err)
	}
	var values map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // 1048576 stays "1048576", not "1.048576e+06"
	if err := dec.Decode(&values); err != nil {
		return fmt.Errorf("-config %s: %w", path, err)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for name, v := range values {
		if fs.Lookup(name) == nil || name == "config" {
			return fmt.Errorf("-config %s: unknown option %q", path, name)
		}
		if given[name] {
			continue
		}
		if err := fs.Set(name, fmt.Sprint(v)); err != nil {
			return fmt.Errorf("-config %s: %s: %w", path, name, err)
		}
	}
	return nil
}

// certWatchPeriod is how often nornd looks for changed certificate files.
const certWatchPeriod = 5 * time.Second

// loadNodeCerts reads the node's TLS files and checks that the
// certificate is node id's.
func loadNodeCerts(files transport.TLSFiles, id string) (*transport.Certs, error) {
	certs, err := transport.LoadCerts(files)
	if err != nil {
		return nil, err
	}
	ident, err := certs.Identity()
	if err != nil {
		return nil, fmt.Errorf("-tls-cert: %w", err)
	}
	if ident.Node != id {
		return nil, fmt.Errorf("-tls-cert %s is the certificate of %+v, not of node %q (-node-id)", files.Cert, ident, id)
	}
	return certs, nil
}

// reloadCerts reads the certificate files again (SIGHUP).
func reloadCerts(certs *transport.Certs, logger *slog.Logger) {
	if certs == nil {
		logger.Info("SIGHUP: no TLS certificates to reload")
		return
	}
	if err := certs.Reload(); err != nil {
		logger.Error("SIGHUP: reloading the TLS certificates failed; the old ones stay in use", "err", err)
		return
	}
	logger.Info("SIGHUP: TLS certificates reloaded")
}

// checkSecure refuses to serve cleartext on an address that is not
// loopback unless -insecure: the API and Raft ports without -tls-*, the
// gossip port without -gossip-key. The three -tls-* flags go together.
func checkSecure(files transport.TLSFiles, gossipKey, insecure bool, api, raft, gossip string) error {
	set := 0
	for _, f := range []string{files.CA, files.Cert, files.Key} {
		if f != "" {
			set++
		}
	}
	if set != 0 && set != 3 {
		return errors.New("-tls-ca, -tls-cert and -tls-key go together")
	}
	if insecure {
		return nil
	}
	cleartext := map[string]string{}
	if !gossipKey {
		cleartext["-gossip-addr"] = gossip
	}
	if set == 0 {
		cleartext["-listen"], cleartext["-raft-addr"] = api, raft
	}
	for _, flag := range []string{"-listen", "-raft-addr", "-gossip-addr"} {
		addr, ok := cleartext[flag]
		if ok && !loopback(addr) {
			return fmt.Errorf("%s %s is not a loopback address and would carry cleartext: give -tls-ca, -tls-cert and -tls-key (and -gossip-key for gossip), or -insecure to accept it", flag, addr)
		}
	}
	return nil
}

// loopback reports whether a listen address is on loopback only.
func loopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
