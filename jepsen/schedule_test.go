package jepsen

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func testNodes(k int) []*Node {
	var ns []*Node
	for i := 1; i <= k; i++ {
		ns = append(ns, &Node{Index: i, ID: fmt.Sprintf("n%d", i)})
	}
	return ns
}

// reach returns, for each node, the nodes it still talks to (itself
// included) once the links are cut.
func reach(ns []*Node, cut [][2]*Node) map[*Node]map[*Node]bool {
	out := map[*Node]map[*Node]bool{}
	for _, a := range ns {
		out[a] = map[*Node]bool{}
		for _, b := range ns {
			out[a][b] = true
		}
	}
	for _, l := range cut {
		delete(out[l[0]], l[1])
		delete(out[l[1]], l[0])
	}
	return out
}

func key(m map[*Node]bool, ns []*Node) string {
	s := ""
	for _, n := range ns {
		if m[n] {
			s += n.ID + ","
		}
	}
	return s
}

// TestMajoritiesRing: with 5 nodes every node sees a majority (itself and
// its two neighbours), and no two nodes see the same one.
func TestMajoritiesRing(t *testing.T) {
	ns := testNodes(5)
	r := reach(ns, ringLinks(ns))
	seen := map[string]bool{}
	for _, n := range ns {
		if len(r[n]) != 3 {
			t.Fatalf("%s sees %d nodes, want 3 (a majority)", n.ID, len(r[n]))
		}
		k := key(r[n], ns)
		if seen[k] {
			t.Fatalf("two nodes see the same majority %s", k)
		}
		seen[k] = true
	}
}

// TestBridge: the two halves talk only through the middle node.
func TestBridge(t *testing.T) {
	ns := testNodes(5)
	r := reach(ns, bridgeLinks(ns))
	mid := ns[2]
	if len(r[mid]) != 5 {
		t.Fatalf("the bridge sees %d nodes, want 5", len(r[mid]))
	}
	for _, a := range ns[:2] {
		for _, b := range ns[3:] {
			if r[a][b] || r[b][a] {
				t.Fatalf("%s and %s talk across the bridge", a.ID, b.ID)
			}
		}
		if len(r[a]) != 3 {
			t.Fatalf("%s sees %d nodes, want 3 (its half and the bridge)", a.ID, len(r[a]))
		}
	}
}

// TestPruneResults keeps the newest run directories and their data dirs,
// removes the others with theirs, and leaves anything else alone.
func TestPruneResults(t *testing.T) {
	parent := t.TempDir()
	dataParent := t.TempDir()
	var runs, datas []string
	for i := range 4 {
		run := filepath.Join(parent, fmt.Sprintf("run%d", i))
		data := filepath.Join(dataParent, fmt.Sprintf("norn-jepsen-data-%d", i))
		for _, d := range []string{run, data} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(run, "seed"), []byte("1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		mod := time.Now().Add(time.Duration(i-10) * time.Minute)
		os.Chtimes(filepath.Join(run, "seed"), mod, mod)
		if err := os.Symlink(data, filepath.Join(run, "data")); err != nil {
			t.Fatal(err)
		}
		runs, datas = append(runs, run), append(datas, data)
	}
	other := filepath.Join(parent, "notes")
	os.MkdirAll(other, 0o755)
	if err := PruneResults(parent, 2); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		_, errRun := os.Stat(runs[i])
		_, errData := os.Stat(datas[i])
		if kept := i >= 2; kept != (errRun == nil) || kept != (errData == nil) {
			t.Errorf("run%d (kept: %v): run dir %v, data dir %v", i, kept, errRun, errData)
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a directory that is not a run was removed: %v", err)
	}
}
