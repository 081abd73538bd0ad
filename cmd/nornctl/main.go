package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/client"
)

// defaultAddr is the node address when neither --addr nor NORN_ADDR is set.
const defaultAddr = "127.0.0.1:7400"

// addrEnv names the environment variable that overrides defaultAddr.
const addrEnv = "NORN_ADDR"

// defaultPollInterval is how often a placement command's watch asks for
// the moves' progress.
const defaultPollInterval = 500 * time.Millisecond

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// globals are the flags every command accepts, before or after its name.
type globals struct {
	addr    string        // node address, host:port or a URL
	output  string        // "table" or "json"
	timeout time.Duration // per call, retries included; 0: none
	ca      string        // CA bundle: TLS to the node (env NORN_CA)
	cert    string        // client certificate (env NORN_CERT)
	key     string        // its key (env NORN_KEY)
	token   string        // bearer token (env NORN_TOKEN)
}

// register adds the global flags to fs, with the current values as defaults.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.addr, "addr", g.addr, "node address, host:port or http(s)://host:port (env "+addrEnv+")")
	fs.StringVar(&g.output, "o", g.output, "output format: table or json")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "deadline of each call, retries included (0: none)")
	fs.StringVar(&g.ca, "ca", g.ca, "PEM bundle of the cluster's CA: speak TLS to the node (env NORN_CA)")
	fs.StringVar(&g.cert, "cert", g.cert, "PEM client certificate, with --key (env NORN_CERT)")
	fs.StringVar(&g.key, "key", g.key, "PEM key of --cert (env NORN_KEY)")
	fs.StringVar(&g.token, "token", g.token, "bearer token (nornctl token create; env NORN_TOKEN)")
}

// env is what a command runs with: its streams, the global flags and a
// client made on first use.
type env struct {
	ctx    context.Context
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	g      globals
	c      *client.Client
	poll   time.Duration // between the Status calls of a watch; tests set 0
	// onFlagSet, when set, is given every FlagSet flagSet makes
	// (completion reads the commands' flags so).
	onFlagSet func(*flag.FlagSet)
}

// client returns the client of the node at --addr, made on first use.
func (e *env) client(opts ...client.Option) (*client.Client, error) {
	if e.c != nil {
		return e.c, nil
	}
	c, err := e.newClient(e.g.addr, opts...)
	if err != nil {
		return nil, err
	}
	e.c = c
	return c, nil
}

// newClient returns a new client of the nodes at addrs with the global
// flags' TLS, token and timeout; the caller closes it.
func (e *env) newClient(addrs string, opts ...client.Option) (*client.Client, error) {
	base := []client.Option{client.WithTimeout(e.g.timeout)}
	if e.g.ca != "" {
		conf, err := client.LoadTLSConfig(e.g.ca, e.g.cert, e.g.key)
		if err != nil {
			return nil, err
		}
		base = append(base, client.WithTLS(conf))
	} else if e.g.cert != "" || e.g.key != "" {
		return nil, errors.New("--cert and --key need --ca (or NORN_CA)")
	}
	if e.g.token != "" {
		base = append(base, client.WithToken(e.g.token))
	}
	return client.New(addrs, append(base, opts...)...)
}

// json reports whether -o json was given.
func (e *env) json() bool { return e.g.output == "json" }

// command is one nornctl subcommand.
type command struct {
	name    string
	args    string // positional arguments, for the usage line
	summary string // one line, for `nornctl help`
	help    string // more, for `nornctl <command> -h`; may be empty
	run     func(e *env, cmd *command, args []string) error
}

// commands lists the subcommands in the order `nornctl help` shows them.
// Their help texts are in commands.go and bench.go. completion.go adds
// itself at the end (its run reads this table).
var commands = []*command{
	{name: "enqueue", args: "<queue> [payload]", summary: "store a new task and print its id", help: enqueueHelp, run: runEnqueue},
	{name: "get", args: "<id>", summary: "show a task with its claims, updates and errors", run: runGet},
	{name: "list", summary: "list tasks, filtered by queue and status", help: listHelp, run: runList},
	{name: "count", summary: "count tasks by status", run: runCount},
	{name: "claim", args: "<queue>", summary: "lease up to --max tasks of a queue", help: claimHelp, run: runClaim},
	{name: "renew", args: "<id> <claim-id>", summary: "extend a claim's lease", run: runRenew},
	{name: "update", args: "<id> <claim-id>", summary: "report progress under a claim", help: updateHelp, run: runUpdate},
	{name: "complete", args: "<id> <claim-id>", summary: "end a claim and its task as COMPLETED", run: runComplete},
	{name: "abort", args: "<id> <claim-id>", summary: "end a claim and its task as ABORTED (--retry: fail the attempt, retried after its backoff)", run: runAbort},
	{name: "yield", args: "<id> <claim-id>", summary: "give a claimed task back (READY again)", run: runYield},
	{name: "cancel", args: "<id> | --queue Q [filters]", summary: "end a task, or every task a filter selects, as CANCELLED", run: runCancel},
	{name: "retry", args: "<id> | --queue Q [filters]", summary: "give a DEAD, ABORTED or CANCELLED task a new life (READY again)", help: retryHelp, run: runRetry},
	{name: "queue", args: "list | get <queue> | pause <queue> | resume <queue> | set <queue>", summary: "list queues, show one, pause or resume it, change its defaults", help: queueHelp, run: runQueue},
	{name: "schedule", args: "create|update|list|get|pause|resume|trigger|delete [name]", summary: "periodic tasks: create, list and steer schedules", help: scheduleHelp, run: runSchedule},
	{name: "status", summary: "show the node and its partitions", run: runStatus},
	{name: "health", summary: "exit 0 if the node is ready (/healthz), or alive with --live (/livez)", help: healthHelp, run: runHealth},
	{name: "join", args: "<node>", summary: "make a started node a member of the cluster", help: joinHelp, run: runJoin},
	{name: "rebalance", args: "[status|cancel]", summary: "spread the replicas over the members, show the moves under way, or cancel them", help: rebalanceHelp, run: runRebalance},
	{name: "drain", args: "<node>", summary: "move every replica off a node, which stays a member", help: drainHelp, run: runDrain},
	{name: "decommission", args: "<node>", summary: "drain a node, then remove it from the cluster", help: decommissionHelp, run: runDecommission},
	{name: "remove", args: "--dead <node>", summary: "replace the replicas of a node gone for good and remove it", help: removeHelp, run: runRemove},
	{name: "token", args: "create <user> | revoke <id> | list", summary: "make, revoke or list the bearer tokens of an access file", help: tokenHelp, run: runToken},
	{name: "whoami", summary: "show who the node takes you for (your token's or certificate's user) and your grants", run: runWhoAmI},
	{name: "grant", args: "<user> <role> [--queues q1,q2] | --remove ...", summary: "give a user a role on queues in an access file (or take it back)", help: grantHelp, run: runGrant},
	{name: "cert", args: "create-ca | create-node <id> | create-client <user> | create-gossip-key", summary: "make the cluster's CA, node and client certificates", help: certHelp, run: runCert},
	{name: "export", args: "<file|->", summary: "write every task (or a queue's) as JSON lines, one task's state per line", help: exportHelp, run: runExport},
	{name: "import", args: "<file|->", summary: "load an export into the cluster: ids kept, terminal tasks kept terminal, no claims", help: importHelp, run: runImport},
	{name: "backup", args: "<dir>", summary: "make a checkpoint of every node's data in <dir> on the node's own machine", help: backupHelp, run: runBackup},
	{name: "bench", summary: "generate load: enqueue, then claim+complete, and report rates and latencies", help: benchHelp, run: runBench},
	{name: "version", summary: "print nornctl's version, commit and Go version", run: runVersion},
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// usageError is a bad command line: main prints it with the usage text of
// cmd (nil: the top level) and exits 2.
type usageError struct {
	cmd *command
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usagef(cmd *command, format string, args ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, args...)}
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	return newEnv(ctx, stdin, stdout, stderr, getenv).dispatch(args)
}

// newEnv returns the env of one run, the global flags at their defaults
// (--addr from getenv).
func newEnv(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) *env {
	e := &env{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr, poll: defaultPollInterval,
		g: globals{addr: defaultAddr, output: "table", timeout: client.DefaultTimeout}}
	if a := getenv(addrEnv); a != "" {
		e.g.addr = a
	}
	e.g.ca, e.g.cert, e.g.key, e.g.token = getenv("NORN_CA"), getenv("NORN_CERT"), getenv("NORN_KEY"), getenv("NORN_TOKEN")
	return e
}

// dispatch parses the global flags and the command name of args, runs
// the command and returns the exit code.
func (e *env) dispatch(args []string) int {
	stderr := e.stderr
	fs := flag.NewFlagSet("nornctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	e.g.register(fs)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printUsage(e.stdout, fs)
		return exitOK
	case err != nil:
		fmt.Fprintf(stderr, "nornctl: %v\n", err)
		printUsage(stderr, fs)
		return exitUsage
	case fs.NArg() == 0:
		fmt.Fprintln(stderr, "nornctl: no command")
		printUsage(stderr, fs)
		return exitUsage
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		return runHelp(e, fs, rest)
	}
	cmd := lookup(name)
	if cmd == nil {
		fmt.Fprintf(stderr, "nornctl: unknown command %q\n", name)
		printUsage(stderr, fs)
		return exitUsage
	}
	err = cmd.run(e, cmd, rest)
	if e.c != nil {
		if cerr := e.c.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}
	return report(e, cmd, err)
}

// runHelp serves `nornctl help [command]`.
func runHelp(e *env, fs *flag.FlagSet, args []string) int {
	if len(args) == 0 {
		printUsage(e.stdout, fs)
		return exitOK
	}
	cmd := lookup(args[0])
	if cmd == nil {
		fmt.Fprintf(e.stderr, "nornctl: unknown command %q\n", args[0])
		printUsage(e.stderr, fs)
		return exitUsage
	}
	return report(e, cmd, cmd.run(e, cmd, []string{"-h"}))
}

// report prints err (if any) and returns the exit code for it.
func report(e *env, cmd *command, err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK // the usage went to stdout
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "nornctl: %s: %s\n", cmd.name, ue.msg)
		if ue.cmd != nil {
			fmt.Fprintf(e.stderr, "usage: nornctl %s\nRun 'nornctl %s -h' for its flags.\n", usageLine(ue.cmd), ue.cmd.name)
		}
		return exitUsage
	default:
		fmt.Fprintf(e.stderr, "nornctl: %s: %s\n", cmd.name, commandError(cmd.name, err))
		if needsTLSHint(e.ctx, e.g, err) {
			fmt.Fprintln(e.stderr, tlsHint)
		} else if alert, ok := certRefused(e.ctx, e.g, err); ok {
			fmt.Fprintln(e.stderr, certHint(alert))
		}
		return exitError
	}
}

// errorMessage renders an error of the client as "CODE: message", the code
// spelled as in docs/API.md, keeping what wraps it ("watching the moves:
// CODE: message"); other errors as they are.
func errorMessage(err error) string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err.Error()
	}
	s := strings.ToUpper(ce.Code().String())
	if msg := ce.Message(); msg != "" {
		s += ": " + msg
	}
	return strings.Replace(err.Error(), ce.Error(), s, 1)
}

// commandError is errorMessage for the line "nornctl: <command>: ..."
// of command name's error: without the client's own "norn: <call>: "
// prefix, which would say it again.
func commandError(name string, err error) string {
	msg := errorMessage(err)
	if rest, ok := strings.CutPrefix(msg, "norn: "+name+": "); ok {
		return rest
	}
	return strings.TrimPrefix(msg, "norn: ")
}

func usageLine(cmd *command) string {
	s := cmd.name + " [flags]"
	if cmd.args != "" {
		s += " " + cmd.args
	}
	return s
}

// printUsage prints the top-level usage: commands and global flags.
func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "nornctl is the command-line client of a Norn node.\n\n")
	fmt.Fprintf(w, "usage: nornctl [global flags] <command> [flags] [args]\n\ncommands:\n")
	width := len("help")
	for _, c := range commands {
		width = max(width, len(c.name))
	}
	for _, c := range commands {
		fmt.Fprintf(w, "  %-*s  %s\n", width, c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-*s  %s\n", width, "help", "show this text, or a command's usage: help <command>")
	fmt.Fprintf(w, "\nglobal flags (also accepted after the command):\n")
	printFlags(w, fs)
	fmt.Fprintf(w, "\nRun 'nornctl <command> -h' for a command's flags.\n")
}

// printFlags is flag.PrintDefaults to w.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}
