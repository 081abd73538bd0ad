package jepsen

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// TestJepsen runs real scenarios: the short subset (two scenarios of 8 s
// with -short). It needs root, iptables and Linux, and NORN_JEPSEN=1 so
// that `make test` does not run it (make jepsen-short runs the runner).
// Like jepsen-short, it tolerates the known Norn bugs' anomaly
// (docs/JEPSEN.md).
func TestJepsen(t *testing.T) {
	switch {
	case runtime.GOOS != "linux":
		t.Skip("jepsen: needs Linux")
	case os.Geteuid() != 0:
		t.Skip("jepsen: needs root (iptables, nodes run as their own uids)")
	case IPTablesPath() == "":
		t.Skip("jepsen: needs iptables (apt-get install iptables)")
	case os.Getenv("NORN_JEPSEN") == "":
		t.Skip("jepsen: set NORN_JEPSEN=1 to run real scenarios (or use make jepsen-short)")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("jepsen: needs the go tool to build nornd")
	}
	dir, err := os.MkdirTemp("", "norn-jepsen-test-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	root, _ := filepath.Abs("..")
	bin, err := BuildNornd(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"baseline", "leader-isolation"}
	d := 8 * time.Second
	if !testing.Short() {
		names, d = nil, 20*time.Second
		for _, s := range Scenarios {
			if s.Short {
				names = append(names, s.Name)
			}
		}
	}
	failed := false
	var rs []*Result
	for _, name := range names {
		r, err := Run(context.Background(), Options{Scenario: name, Seed: 1, Time: d, Clients: 4, Results: dir, Bin: bin, Logf: t.Logf})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			failed = true
			continue
		}
		rs = append(rs, r)
		if !r.OK {
			failed = true
			for _, v := range r.Verdicts {
				t.Errorf("%s: %s %s %v %v", name, v.Checker, v.Status(), v.Counts, v.Details)
			}
		}
	}
	t.Log("\n" + Table(rs))
	if failed {
		t.Logf("results kept in %s", dir)
	} else {
		os.RemoveAll(dir)
	}
}
