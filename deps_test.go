package norn_test

// The architecture rules of docs/ARCHITECTURE.md as a test: dependencies
// point down only (cmd -> node/client -> coord -> replicas/antientropy ->
// cluster/claims -> transport/storage -> crdt/ring), the pure cores import
// nothing but the standard library and xxhash, faultfs nothing but the
// standard library and Pebble's vfs, and nothing but cmd imports node or
// jepsen.

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/norn-dev/norn"

// allowed lists, for every top-level package directory of the module, the
// module packages it may import. A directory missing from the table fails
// the test, so a new package has to take its place in the layering.
// antientropy sits on cluster: its scheduler picks its peers and
// partitions from the ring (cohorts, moves filling a replica, the peers'
// addresses), a cluster.Ring read once per round.
var allowed = map[string][]string{
	"crdt":        {},
	"ring":        {},
	"faultfs":     {},
	"testhooks":   {},
	"buildinfo":   {"api"},
	"access":      {"transport", "api", "crdt", "ring"},
	"storage":     {"crdt", "ring", "faultfs", "testhooks"},
	"api":         {},
	"transport":   {"api", "crdt", "ring", "testhooks"},
	"claims":      {"storage", "transport", "api", "crdt", "ring", "testhooks"},
	"cluster":     {"storage", "transport", "api", "crdt", "ring"},
	"antientropy": {"cluster", "storage", "transport", "api", "crdt", "ring"},
	"apierr":      {"claims", "storage", "crdt"},
	"replicas":    {"cluster", "claims", "storage", "transport", "api", "crdt", "ring"},
	"coord":       {"replicas", "apierr", "cluster", "claims", "storage", "transport", "api", "crdt", "ring", "testhooks"},
	"dispatch":    {"coord", "replicas", "apierr", "claims", "storage", "transport", "api", "crdt", "ring", "testhooks"},
	"server":      {"dispatch", "rebalance", "coord", "antientropy", "replicas", "apierr", "cluster", "claims", "storage", "transport", "api", "crdt", "ring", "access", "testhooks"},
	"rebalance":   {"replicas", "apierr", "cluster", "claims", "transport", "api", "ring"},
	"client":      {"api", "transport", "crdt", "ring"},
	"metrics":     {"api", "transport"},
	"tracing":     {"api", "transport"},
	"console":     {"api"},
	"node":        {"console", "server", "dispatch", "rebalance", "coord", "replicas", "apierr", "cluster", "claims", "antientropy", "storage", "transport", "client", "api", "crdt", "ring", "faultfs", "testhooks", "access", "metrics", "tracing"},
	"jepsen":      {"client", "api", "transport", "crdt", "ring", "access"},
	"cmd":         {"node", "metrics", "server", "dispatch", "rebalance", "coord", "replicas", "apierr", "jepsen", "client", "cluster", "claims", "antientropy", "storage", "transport", "api", "crdt", "ring", "faultfs", "testhooks", "access", "buildinfo", "tracing"},
}

// banned lists arrows that must never exist, whatever the table above
// says, with the reason: the table may grow, these stay.
var banned = []struct{ from, to, why string }{
	{"coord", "dispatch", "the AP side must not depend on the claim side; dispatch plugs in through coord.Config.OnEnded and DepsDone"},
	{"coord", "server", "the API edge sits above the parts it calls"},
	{"dispatch", "server", "the API edge sits above the parts it calls"},
	{"rebalance", "server", "the API edge sits above the parts it calls"},
	{"antientropy", "server", "the API edge sits above the parts it calls"},
	{"replicas", "coord", "the host tells the parts above it what changed through callbacks (replicas.Config)"},
	{"replicas", "dispatch", "the host tells the parts above it what changed through callbacks (replicas.Config)"},
	{"replicas", "antientropy", "the host tells the parts above it what changed through callbacks (replicas.Config)"},
	{"replicas", "rebalance", "the host tells the parts above it what changed through callbacks (replicas.Config)"},
	{"claims", "antientropy", "the claim FSM and the Merkle exchange are independent; node plugs them together"},
	{"antientropy", "claims", "the claim FSM and the Merkle exchange are independent; node plugs them together"},
	{"rebalance", "dispatch", "moves change placement, not who holds a task"},
	{"server", "node", "nothing but cmd imports the composition root"},
}

// TestBannedArrows checks that no package imports what banned forbids,
// and that the table does not allow it either.
func TestBannedArrows(t *testing.T) {
	got := imports(t)
	for _, b := range banned {
		if slices.Contains(allowed[b.from], b.to) {
			t.Errorf("the table allows %s -> %s, which is banned: %s", b.from, b.to, b.why)
		}
		for _, p := range got[b.from] {
			if d, _, _ := strings.Cut(strings.TrimPrefix(p, module+"/"), "/"); strings.HasPrefix(p, module+"/") && d == b.to {
				t.Errorf("%s imports %s: banned, %s", b.from, p, b.why)
			}
		}
	}
}

// pureExternal is everything outside the standard library that crdt and ring
// may import: they are deterministic cores with no I/O.
var pureExternal = []string{"github.com/cespare/xxhash/v2"}

// faultfsExternal is everything outside the standard library that faultfs
// (a test-only filesystem wrapper) may import.
var faultfsExternal = []string{"github.com/cockroachdb/pebble/v2/vfs"}

// isStdlib reports whether an import path is in the standard library (its
// first element has no dot).
func isStdlib(p string) bool {
	first, _, _ := strings.Cut(p, "/")
	return !strings.Contains(first, ".")
}

// imports returns, per top-level directory, the import paths of its non-test
// Go files. The files are read in-process, so `go test` reruns this test
// whenever one of them changes.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "data") {
			return filepath.SkipDir
		}
		// A directory with a go.mod of its own (bench/) is another module,
		// outside this one's layers.
		if d.IsDir() && p != "." {
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		layer, _, _ := strings.Cut(filepath.ToSlash(p), "/")
		if !strings.Contains(filepath.ToSlash(p), "/") {
			layer = ""
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			out[layer] = append(out[layer], path)
		}
		if _, ok := out[layer]; !ok {
			out[layer] = nil
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDependencyDirection(t *testing.T) {
	for layer, paths := range imports(t) {
		ok, known := allowed[layer]
		if !known {
			t.Errorf("directory %q is in no layer: add it to the table in deps_test.go and to docs/ARCHITECTURE.md", layer)
			continue
		}
		for _, p := range paths {
			switch {
			case strings.HasPrefix(p, module+"/"):
				d, _, _ := strings.Cut(strings.TrimPrefix(p, module+"/"), "/")
				if d != layer && !slices.Contains(ok, d) {
					t.Errorf("%s imports %s: %s may import only %v", layer, p, layer, ok)
				}
			case (layer == "crdt" || layer == "ring") && !isStdlib(p) && !slices.Contains(pureExternal, p):
				t.Errorf("%s imports %s: the pure cores may use only the standard library and %v", layer, p, pureExternal)
			case layer == "faultfs" && !isStdlib(p) && !slices.Contains(faultfsExternal, p):
				t.Errorf("faultfs imports %s: it may use only the standard library and %v", p, faultfsExternal)
			}
		}
	}
}

// TestTableIsLayered keeps the table itself honest: only cmd may reach
// node or jepsen, nothing may reach cmd, and the table has no cycles.
func TestTableIsLayered(t *testing.T) {
	for layer, deps := range allowed {
		for _, d := range deps {
			if (d == "node" || d == "jepsen") && layer != "cmd" || d == "cmd" {
				t.Errorf("%s may not depend on %s", layer, d)
			}
			if slices.Contains(allowed[d], layer) {
				t.Errorf("cycle: %s and %s allow each other", layer, d)
			}
			if _, ok := allowed[d]; !ok {
				t.Errorf("%s allows unknown layer %s", layer, d)
			}
		}
	}
}
