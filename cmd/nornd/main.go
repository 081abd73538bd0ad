package main

import (
	"bytes"
	"cmp"
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

	// Time zones for schedules' cron expressions, in the binary: the
	// image (distroless) and many hosts have no zoneinfo.
	_ "time/tzdata"

	"github.com/hashicorp/go-hclog"

	"github.com/norn-dev/norn/access"
	"github.com/norn-dev/norn/buildinfo"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/node"
	"github.com/norn-dev/norn/tracing"
	"github.com/norn-dev/norn/transport"
)

// version, when set at link time (-ldflags "-X main.version=v1.2.3", as
// deploy/Dockerfile does), overrides the main module's version that Go's
// build information records (buildinfo.Read).
var version string

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
	var cfg node.Config
	fs := flag.NewFlagSet("nornd", flag.ContinueOnError)
	o := defineFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	info := buildinfo.Read(version)
	if *o.showVersion {
		fmt.Println("nornd", info)
		return nil
	}
	// Precedence: the command line, then NORN_* variables, then -config.
	if err := applyEnv(fs, os.Environ()); err != nil {
		return usageError{err}
	}
	if *o.config != "" {
		if err := applyConfigFile(fs, *o.config); err != nil {
			return usageError{err}
		}
	}
	if *o.machineFromID {
		m, err := machineIDFromNodeID(cfg.NodeID)
		if err != nil {
			return usageError{err}
		}
		*o.machine = m
	}
	if *o.machine == 0 || *o.machine > 1<<16-1 {
		return usageError{fmt.Errorf("-machine-id: %d out of range", *o.machine)}
	}
	tlsFiles := transport.TLSFiles{CA: *o.tlsCA, Cert: *o.tlsCert, Key: *o.tlsKey}
	if err := checkSecure(tlsFiles, *o.gossipKey != "", *o.insecure, *o.listen, cfg.RaftAddr, cfg.GossipAddr); err != nil {
		return usageError{err}
	}
	if *o.gossipKey != "" {
		key, err := transport.ReadGossipKey(*o.gossipKey)
		if err != nil {
			return usageError{fmt.Errorf("-gossip-key: %w", err)}
		}
		cfg.GossipKey = key
	}
	cfg.MachineID = uint16(*o.machine)
	cfg.NoLeaderBalance = !*o.leaderBalance
	if cfg.LeaderBalanceInterval <= 0 || cfg.LeaderBalanceRate <= 0 {
		return usageError{errors.New("-leader-balance-interval and -leader-balance-rate must be positive (-leader-balance=false turns balancing off)")}
	}
	if *o.handOver < 0 {
		return usageError{fmt.Errorf("-handover-timeout %s: want 0 (hand nothing over) or more", *o.handOver)}
	}
	if cfg.LeaderBalanceTolerance <= 0 || cfg.LeaderBalanceTolerance >= 1 {
		return usageError{fmt.Errorf("-leader-balance-tolerance %g: want above 0 and below 1", cfg.LeaderBalanceTolerance)}
	}
	lim := cfg.Limits.MaxPayloadBytes
	cfg.Limits = node.DefaultLimits()
	cfg.Limits.MaxPayloadBytes = lim
	logger, err := newLogger(os.Stderr, *o.logFormat, *o.logLevel)
	if err != nil {
		return usageError{err}
	}
	cfg.Logger = logger
	rl := hclog.LevelFromString(*o.raftLogLevel)
	if rl == hclog.NoLevel {
		return usageError{fmt.Errorf("-raft-log-level: unknown level %q", *o.raftLogLevel)}
	}
	cfg.RaftLogger = node.NewRaftLogger(logger, rl)
	cfg.Version = info.Version
	cfg.Build = info.Proto()
	// Tracing: off unless the standard OTEL_* variables ask for it
	// (docs/OPERATIONS.md, Tracing).
	tp, err := tracing.FromEnv(os.Getenv, tracing.Resource{Instance: cfg.NodeID, Version: info.Version}, os.Stdout)
	if err != nil {
		return usageError{err}
	}
	if tp != nil {
		cfg.TracerProvider = tp
		logger.Info("tracing on", "exporter", cmp.Or(os.Getenv(tracing.EnvTracesExporter), "otlp"))
		defer func() {
			// Send the spans still queued, within a bound.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(ctx); err != nil {
				logger.Warn("tracing: spans not sent at shutdown", "err", err)
			}
		}()
	}
	for _, a := range strings.Split(*o.join, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.Join = append(cfg.Join, a)
		}
	}

	if err := o.hooks.configure(&cfg, logger); err != nil {
		return usageError{err}
	}
	if tlsFiles.CA != "" {
		certs, err := loadNodeCerts(tlsFiles, cfg.NodeID)
		if err != nil {
			return err
		}
		cfg.TLS = certs
	}
	if *o.authFile != "" {
		auth, err := access.LoadRules(*o.authFile)
		if err != nil {
			return usageError{fmt.Errorf("-auth-file: %w", err)}
		}
		cfg.Auth = auth
	}
	cfg.Insecure = *o.insecure
	cfg.MetricsElsewhere = *o.metricsAddr != ""
	if *o.insecure {
		logger.Warn("started with -insecure: cleartext is allowed on addresses that are not loopback; anyone who reaches a cleartext port can read and write every task",
			"tls", cfg.TLS != nil, "gossip_encrypted", cfg.GossipKey != nil)
	}

	// Listen first: the node advertises the address it really got.
	ln, err := net.Listen("tcp", *o.listen)
	if err != nil {
		return err
	}
	cfg.APIAddr = *o.advertise
	if cfg.APIAddr == "" {
		cfg.APIAddr = ln.Addr().String()
	}
	n, err := node.New(cfg)
	if err != nil {
		ln.Close()
		return err
	}
	handler := o.hooks.wrap(n.Handler(), n, logger)
	srv := node.NewHTTPServer(handler)
	if *o.metricsAddr != "" {
		mln, err := net.Listen("tcp", *o.metricsAddr)
		if err != nil {
			ln.Close()
			n.Close()
			return fmt.Errorf("-metrics-addr: %w", err)
		}
		msrv := &http.Server{Handler: n.MetricsHandler(), ReadHeaderTimeout: node.HTTPReadHeaderTimeout}
		go msrv.Serve(mln) //nolint:errcheck // stops with the process
		defer msrv.Close()
	}
	if *o.pprofAddr != "" {
		go func() {
			// http.DefaultServeMux carries net/http/pprof's handlers.
			if err := http.ListenAndServe(*o.pprofAddr, nil); err != nil {
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
		"raft", n.RaftAddr(), "gossip", n.GossipAddr(), "partitions", cfg.Partitions, "version", info.String())
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
	// The first SIGTERM or SIGINT starts the shutdown; a second stops at
	// once: no more waiting for the hand-over or for requests in flight
	// (the groups and Pebble still close). A third exits without closing
	// anything (nothing acked is lost: it was fsynced).
	stopping := make(chan os.Signal, 1)
	hurry, stopNow := context.WithCancelCause(context.Background())
	defer stopNow(nil)
	go watchSignals(sig, stopWatch, stopping, stopNow, func() { reload(cfg, logger) }, logger)
	select {
	case s := <-stopping:
		logger.Info("shutting down", "signal", s.String())
	case err := <-served:
		framed.Close()
		n.Close()
		return fmt.Errorf("serve: %w", err)
	case err := <-n.Failed():
		// Going on would serve from a replica that missed a claim entry,
		// or take part under an id whose data dir the cluster does not know.
		if errors.Is(err, cluster.ErrDataDirReplaced) {
			logger.Error("stopping: the cluster knows this node's id with another data dir", "err", err)
		} else {
			logger.Error("stopping: a partition's claim state machine cannot go on", "err", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		srv.Shutdown(ctx)
		cancel()
		framed.Close()
		n.Close()
		return err
	}
	// Hand the leaderships over while still serving: claims of the
	// partitions that moved go to their new leaders meanwhile.
	if *o.handOver > 0 {
		ctx, cancel := context.WithTimeoutCause(hurry, *o.handOver, fmt.Errorf("-handover-timeout %s passed", *o.handOver))
		n.HandOver(ctx) // logs what it did
		cancel()
	}
	n.StopWaiting() // long polls return so Shutdown can finish
	ctx, cancel := context.WithTimeout(hurry, 30*time.Second)
	defer cancel()
	shutdownErr := srv.Shutdown(ctx)
	if shutdownErr != nil && hurry.Err() != nil {
		shutdownErr = fmt.Errorf("requests in flight cut short: %w", context.Cause(hurry))
	}
	framed.Close() // waits for its calls under way
	closeErr := n.Close()
	if err := errors.Join(shutdownErr, closeErr); err != nil {
		return err
	}
	logger.Info("stopped cleanly")
	return nil
}

// watchSignals handles nornd's signals until done is closed: SIGHUP
// calls reload; the first SIGTERM or SIGINT goes to stopping, the second
// calls hurry, the third exits the process at once.
func watchSignals(sig <-chan os.Signal, done <-chan struct{}, stopping chan<- os.Signal, hurry context.CancelCauseFunc,
	reload func(), logger *slog.Logger) {
	stops := 0
	for {
		select {
		case s := <-sig:
			if s == syscall.SIGHUP {
				reload()
				continue
			}
			switch stops++; stops {
			case 1:
				stopping <- s // buffered for one
			case 2:
				logger.Warn("second signal: stopping at once (a third exits without closing)", "signal", s.String())
				hurry(fmt.Errorf("second signal (%s)", s))
			default:
				logger.Error("third signal: exiting without closing", "signal", s.String())
				os.Exit(1)
			}
		case <-done:
			return
		}
	}
}

// reload reads the TLS certificates and the access file again (SIGHUP).
func reload(cfg node.Config, logger *slog.Logger) {
	reloadCerts(cfg.TLS, logger)
	if cfg.Auth != nil {
		if err := cfg.Auth.Reload(); err != nil {
			logger.Error("SIGHUP: reloading the access file failed; the old rules stay in use", "err", err)
		} else {
			logger.Info("SIGHUP: access file reloaded")
		}
	}
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
