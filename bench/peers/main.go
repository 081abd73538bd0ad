// Command peers measures Norn next to NATS JetStream on the same workloads,
// for `make bench-peers` (scripts/bench-peers.sh starts the clusters and
// drives it; docs/BENCHMARKS.md).
//
//	peers nats|norn [common flags] [system flags]   one run of one workload
//	peers idle -server-pids p1,p2,p3                 the servers' idle CPU (cores)
//	peers table -in results.jsonl                    the medians as markdown
//
// Each run appends one JSON line to -out. With -server-pids it also
// measures the CPU time the server processes spent (utime+stime from
// /proc/<pid>/stat) over the timed part of the run, which leaves out a
// claim run's preload.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: peers nats|norn|idle|table [flags]")
		os.Exit(2)
	}
	sub := os.Args[1]
	fs := flag.NewFlagSet(sub, flag.ExitOnError)
	if sub == "table" || sub == "idle" {
		f := tableMain
		if sub == "idle" {
			f = idleMain
		}
		if err := f(fs, os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", sub, err)
			os.Exit(1)
		}
		return
	}
	c := &Common{}
	fs.StringVar(&c.System, "system", sub, "row label for the results table")
	fs.StringVar(&c.Setting, "setting", "", "durability/replication setting text for the results table")
	fs.StringVar(&c.Workload, "workload", "enqueue", "enqueue | claim")
	fs.IntVar(&c.N, "n", 50000, "number of tasks")
	fs.IntVar(&c.Inflight, "inflight", 256, "enqueue: max outstanding enqueue requests")
	fs.IntVar(&c.Workers, "workers", 8, "claim: concurrent workers")
	fs.IntVar(&c.Payload, "payload", 64, "payload bytes")
	fs.IntVar(&c.Run, "run", 1, "run number (for the record)")
	fs.StringVar(&c.Out, "out", "-", "append the JSON result line to this file (- = stdout)")
	fs.DurationVar(&c.Timeout, "timeout", 5*time.Minute, "hard limit for this run")
	fs.Var(&c.CPU.pids, "server-pids", "comma-separated pids of the server processes whose CPU time to measure (none: not measured)")
	fs.IntVar(&c.CPU.clkTck, "clk-tck", 100, "clock ticks per second of /proc/<pid>/stat (getconf CLK_TCK)")
	fs.Float64Var(&c.CPU.idleCores, "idle-cores", 0, "the servers' CPU rate when idle, in cores (the idle subcommand)")
	fs.Float64Var(&c.CPU.quietCores, "settle-cores", 0.1, "the servers are idle when they use at most this many cores above -idle-cores, together")
	fs.DurationVar(&c.CPU.settleMax, "settle-max", 5*time.Second, "longest wait for the servers to become idle, before and after the timed part")
	// BENCH_CPUPROFILE=<file>: the driver's own CPU profile (its client's
	// cost per task).
	if path := os.Getenv("BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cpuprofile: %v\n", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "cpuprofile: %v\n", err)
			os.Exit(1)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	var err error
	switch sub {
	case "nats":
		err = natsMain(c, fs, os.Args[2:])
	case "norn":
		err = nornMain(c, fs, os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q", sub)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", sub, c.Workload, err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
