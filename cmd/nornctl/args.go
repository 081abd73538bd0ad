package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// flagSet returns a FlagSet for cmd that also holds the global flags. It
// prints nothing itself: parse reports its errors.
func (e *env) flagSet(cmd *command) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	e.g.register(fs)
	if e.onFlagSet != nil {
		e.onFlagSet(fs)
	}
	return fs
}

// parse parses args, flags and positional arguments in any order, and
// returns the positional ones, between minArgs and maxArgs of them
// (maxArgs < 0: no limit). After "--" everything is positional. With -h it
// prints cmd's usage on stdout and returns flag.ErrHelp; any other problem
// is a *usageError.
func (e *env) parse(cmd *command, fs *flag.FlagSet, args []string, minArgs, maxArgs int) ([]string, error) {
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		printCommandUsage(e.stdout, cmd, fs)
		return nil, err
	}
	if err != nil {
		return nil, usagef(cmd, "%v", err)
	}
	if e.g.output != "table" && e.g.output != "json" {
		return nil, usagef(cmd, "-o %q: want table or json", e.g.output)
	}
	if e.g.timeout < 0 {
		return nil, usagef(cmd, "--timeout %v: negative", e.g.timeout)
	}
	switch {
	case len(pos) < minArgs:
		return nil, usagef(cmd, "want %s, got %d argument(s)", cmd.args, len(pos))
	case maxArgs >= 0 && len(pos) > maxArgs:
		return nil, usagef(cmd, "unexpected argument %q", pos[maxArgs])
	}
	return pos, nil
}

// parseInterleaved is fs.Parse for flags mixed with positional arguments:
// flag.FlagSet stops at the first positional one, so parse again after
// each. It returns the positional arguments in order.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// Parse stops at a positional argument or just after "--". (A flag
		// whose value is "--" looks the same; such a value must be written
		// --flag=--.)
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// printCommandUsage prints cmd's usage line, summary and flags.
func printCommandUsage(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: nornctl %s\n\n%s.\n", usageLine(cmd), upperFirst(cmd.summary))
	if cmd.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(cmd.help))
	}
	fmt.Fprintf(w, "\nflags:\n")
	printFlags(w, fs)
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// parseID parses a task or claim id: a decimal uint64 other than 0. what
// names the argument in the error.
func parseID(what, s string) (uint64, error) {
	id, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q: not a decimal id", what, s)
	}
	if id == 0 {
		return 0, fmt.Errorf("%s: must not be 0", what)
	}
	return id, nil
}

// parseNode parses the <node> argument of the placement commands: a node
// id or an API address (host:port), which the server resolves.
func parseNode(s string) (string, error) {
	node := strings.TrimSpace(s)
	switch {
	case node == "":
		return "", errors.New("node: empty; want a node id or an API address (host:port)")
	case strings.Contains(node, "://"):
		return "", fmt.Errorf("node %q: want a node id or an API address host:port, not a URL", s)
	case strings.ContainsFunc(node, unicode.IsSpace):
		return "", fmt.Errorf("node %q: want a node id or an API address (host:port)", s)
	}
	return node, nil
}

// parseIDs parses a comma-separated list of task ids ("" is none).
func parseIDs(what, s string) ([]uint64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var ids []uint64
	for part := range strings.SplitSeq(s, ",") {
		id, err := parseID(what, part)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// parseNotBefore parses --not-before: an RFC 3339 time, or a duration
// (time.ParseDuration, not negative) counted from now. "" is the zero time
// (no delay).
func parseNotBefore(s string, now time.Time) (time.Time, error) {
	return parseTimeFlag("--not-before", s, now)
}

// parseTimeFlag parses a time flag (name): an RFC 3339 time, or a
// duration (time.ParseDuration, not negative) counted from now. "" is
// the zero time.
func parseTimeFlag(name, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%s %q: negative duration", name, s)
		}
		return now.Add(d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %q: want an RFC 3339 time (2006-01-02T15:04:05Z) or a duration (5m)", name, s)
	}
	return t, nil
}

// parseStatus parses --status: a TaskStatus name with or without its
// TASK_STATUS_ prefix, in any case ("" is every status).
func parseStatus(s string) (nornv1.TaskStatus, error) {
	if s == "" {
		return nornv1.TaskStatus_TASK_STATUS_UNSPECIFIED, nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, statusPrefix) {
		name = statusPrefix + name
	}
	v, ok := nornv1.TaskStatus_value[name]
	if !ok || v == int32(nornv1.TaskStatus_TASK_STATUS_UNSPECIFIED) {
		return 0, fmt.Errorf("--status %q: want one of READY, DELAYED, CLAIMED, COMPLETED, ABORTED, CANCELLED", s)
	}
	return nornv1.TaskStatus(v), nil
}

// readPayload returns the payload of enqueue: the argument arg when
// hasArg, else the file named by file ("-": stdin), else none.
func readPayload(arg string, hasArg bool, file string, stdin io.Reader) ([]byte, error) {
	switch {
	case hasArg:
		return []byte(arg), nil
	case file == "-":
		return io.ReadAll(stdin)
	case file != "":
		return os.ReadFile(file)
	default:
		return nil, nil
	}
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}
