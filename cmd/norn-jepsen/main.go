package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/norn-dev/norn/jepsen"
	"github.com/norn-dev/norn/jepsen/check"
)

func main() {
	fs := flag.NewFlagSet("norn-jepsen", flag.ContinueOnError)
	scenario := fs.String("scenario", "", "scenario to run (or comma-separated list; a self-test's name+clean runs it without its seeded bug); see below")
	all := fs.Bool("all", false, "run every scenario")
	short := fs.Bool("short", false, "run the short subset (make jepsen-short)")
	seed := fs.Uint64("seed", 0, "seed of the fault schedule and the workload (0: from the time)")
	dur := fs.Duration("time", 30*time.Second, "workload time under faults, per scenario (membership-churn: a minimum; it runs until its sequence is done, at most 8m)")
	clients := fs.Int("clients", 5, "concurrent clients, 4 to 8")
	results := fs.String("results", "jepsen-results", "parent directory of the results directories")
	recheck := fs.String("check", "", "only check the history of this results directory again (linearizability, queue without final reads, exclusion, terminal stability)")
	noBugs := fs.Bool("no-bugs", false, "run the self-test (bug-*) scenarios without their seeded bugs: the clean build must pass them")
	keep := fs.Int("keep", 50, "results directories to keep under --results (the oldest are removed before each run, with their data dirs); 0 keeps all")
	keepData := fs.Bool("keep-data", false, "keep the nodes' data dirs of runs with the expected outcome too (always kept otherwise)")
	bin := fs.String("nornd", "", "nornd binary to test (default: build ./cmd/nornd of the current module)")
	allowSkip := fs.Bool("allow-skip", false, "exit 0 when scenarios were skipped (no root, no iptables): by default a skipped scenario fails the run, so a harness that could not run never looks green")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: norn-jepsen [--scenario name[,name] | --short | --all] [--seed n] [--time 60s]\n\nflags:\n")
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\nscenarios:\n")
		for _, s := range jepsen.Scenarios {
			tag := ""
			if s.Short {
				tag += " [short]"
			}
			if s.NeedsHooks {
				tag += " [needs -test-hooks]"
			}
			nodes := fmt.Sprintf("%d nodes", s.Nodes)
			if s.Initial > 0 && s.Initial < s.Nodes {
				nodes = fmt.Sprintf("%d nodes (%d initial)", s.Nodes, s.Initial)
			}
			fmt.Fprintf(fs.Output(), "  %-26s %s: %s%s\n", s.Name, nodes, s.Desc, tag)
		}
		fmt.Fprintf(fs.Output(), "\nnemeses:\n")
		for _, n := range jepsen.Nemeses {
			fmt.Fprintf(fs.Output(), "  %s\n", n)
		}
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return
		}
		os.Exit(2)
	}
	if *recheck != "" {
		ops, err := check.ReadHistory(filepath.Join(*recheck, "history.jsonl"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "norn-jepsen:", err)
			os.Exit(1)
		}
		for _, v := range []check.Verdict{check.Linearizable(ops, jepsen.Replication, time.Minute, *recheck), check.Exclusion(ops), check.Terminal(ops, jepsen.Replication)} {
			fmt.Printf("%-16s %-7s %v\n  %s\n", v.Checker, v.Status(), v.Counts, strings.Join(v.Details, "\n  "))
		}
		return
	}
	var names []string
	switch {
	case *all:
		// Every scenario; each self-test also without its seeded bug
		// (name+clean): the clean build must pass it.
		for _, s := range jepsen.Scenarios {
			names = append(names, s.Name)
		}
		for _, s := range jepsen.Scenarios {
			if len(s.Bugs) > 0 {
				names = append(names, s.Name+"+clean")
			}
		}
	case *short:
		for _, s := range jepsen.Scenarios {
			if s.Short {
				names = append(names, s.Name)
			}
		}
	case *scenario != "":
		names = strings.Split(*scenario, ",")
	default:
		fs.Usage()
		os.Exit(2)
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano()%100000) + 1
	}
	if *clients < 4 || *clients > 8 {
		fmt.Fprintln(os.Stderr, "norn-jepsen: --clients must be 4 to 8")
		os.Exit(2)
	}
	root, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "norn-jepsen:", err)
		os.Exit(1)
	}
	removeBin := func() {}
	if *bin == "" {
		tmp, err := os.MkdirTemp("", "norn-jepsen-")
		if err == nil {
			err = os.Chmod(tmp, 0o755) // the nodes run as their own uids
		}
		if err == nil {
			*bin, err = jepsen.BuildNornd(root, tmp)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "norn-jepsen:", err)
			os.Exit(1)
		}
		removeBin = func() { os.RemoveAll(tmp) }
	}
	logf := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	keepRuns := *keep
	if keepRuns == 0 {
		keepRuns = -1 // Options.Keep: negative keeps all
	}
	var rs []*jepsen.Result
	failed := false
	for _, name := range names {
		base, clean := strings.CutSuffix(name, "+clean")
		r, err := jepsen.Run(context.Background(), jepsen.Options{Scenario: base, Seed: *seed, Time: *dur, Clients: *clients,
			Results: *results, Root: root, Bin: *bin, Logf: logf, NoBugs: *noBugs || clean, KeepData: *keepData, Keep: keepRuns})
		if r == nil {
			r = &jepsen.Result{Scenario: name, Seed: *seed}
		}
		if err != nil {
			r.Err = err.Error()
		}
		if err != nil || !r.OK || (r.Skipped != "" && !*allowSkip) {
			failed = true
		}
		rs = append(rs, r)
		fmt.Printf("--- %s seed %d: valid=%v expected=%s ok=%v dir=%s %s\n", name, *seed, r.Valid, r.Expect, r.OK, r.Dir, r.Err)
		for _, v := range r.Verdicts {
			fmt.Printf("    %-16s %-7s %v %s\n", v.Checker, v.Status(), v.Counts, strings.Join(v.Details, "; "))
		}
	}
	fmt.Print("\n", jepsen.Table(rs))
	// What failed, again at the end: CI keeps the tail of the output.
	for _, r := range rs {
		if r.OK {
			continue
		}
		for _, v := range r.Verdicts {
			if !v.Valid && v.Skipped == "" && !v.ReportOnly {
				d := strings.Join(v.Details, "; ")
				if len(d) > 4000 {
					d = d[:4000] + " ..."
				}
				fmt.Printf("\nFAILED %s seed %d, %s: %s\n", r.Scenario, r.Seed, v.Checker, d)
			}
		}
	}
	removeBin()
	for _, r := range rs {
		if r.Skipped != "" && !*allowSkip {
			fmt.Fprintf(os.Stderr, "norn-jepsen: %s was skipped (%s): a run that checked nothing fails; --allow-skip accepts it\n", r.Scenario, r.Skipped)
		}
	}
	if failed {
		os.Exit(1)
	}
}
