package cluster

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/norn-dev/norn/ring"
)

// testNodes returns nodes n1..nk (k at most 9, so that string order is
// numeric order) with every address set.
func testNodes(k int) []RingNode {
	nodes := make([]RingNode, k)
	for i := range nodes {
		d := string(rune('1' + i))
		nodes[i] = RingNode{ID: "n" + d, APIAddr: "127.0.0.1:100" + d, RaftAddr: "127.0.0.1:200" + d,
			GossipAddr: "127.0.0.1:300" + d}
	}
	return nodes
}

// handRing is a valid ring written out by hand: 3 nodes, P 4, N 2.
func handRing() *Ring {
	return &Ring{ClusterID: "c1", Epoch: 7, Partitions: 4, Replication: 2, Nodes: testNodes(3),
		Placement: ring.Placement{Cohorts: [][]ring.NodeID{{"n1", "n2"}, {"n2", "n3"}, {"n3", "n1"}, {"n1", "n3"}}}}
}

func TestRingValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(r *Ring)
		reason string // "" for a valid ring; else what the error must name
	}{
		{"valid", func(*Ring) {}, ""},
		{"one node without an API address", func(r *Ring) {
			r.Nodes = []RingNode{{ID: "n1", RaftAddr: "127.0.0.1:2001"}}
			r.Replication = 1
			r.Placement.Cohorts = [][]ring.NodeID{{"n1"}, {"n1"}, {"n1"}, {"n1"}}
		}, ""},
		{"no cluster id", func(r *Ring) { r.ClusterID = "" }, "no cluster id"},
		{"epoch 0", func(r *Ring) { r.Epoch = 0 }, "epoch 0"},
		{"P not a power of two", func(r *Ring) { r.Partitions = 3 }, "partition count 3"},
		{"P 0", func(r *Ring) { r.Partitions = 0 }, "partition count 0"},
		{"P above the maximum", func(r *Ring) { r.Partitions = 2 * ring.MaxPartitions }, "partition count 131072"},
		{"N 0", func(r *Ring) { r.Replication = 0 }, "replication 0 with 3 nodes"},
		{"N above the node count", func(r *Ring) { r.Replication = 4 }, "replication 4 with 3 nodes"},
		{"no nodes", func(r *Ring) { r.Nodes = nil }, "replication 2 with 0 nodes"},
		{"node without an id", func(r *Ring) { r.Nodes[0].ID = "" }, "node 0 lacks an id or an address"},
		{"node without a Raft address", func(r *Ring) { r.Nodes[1].RaftAddr = "" }, "node 1 lacks an id or an address"},
		{"node of 3 without an API address", func(r *Ring) { r.Nodes[2].APIAddr = "" }, "node 2 lacks an id or an address"},
		{"nodes unsorted", func(r *Ring) { r.Nodes[0], r.Nodes[1] = r.Nodes[1], r.Nodes[0] }, `nodes not sorted by id or repeated at "n1"`},
		{"duplicate node id", func(r *Ring) { r.Nodes[2].ID = "n2" }, `nodes not sorted by id or repeated at "n2"`},
		{"too few cohorts", func(r *Ring) { r.Placement.Cohorts = r.Placement.Cohorts[:3] }, "3 cohorts for 4 partitions"},
		{"too many cohorts", func(r *Ring) {
			r.Placement.Cohorts = append(r.Placement.Cohorts, []ring.NodeID{"n1", "n2"})
		}, "5 cohorts for 4 partitions"},
		{"cohort too small", func(r *Ring) { r.Placement.Cohorts[1] = []ring.NodeID{"n2"} }, "partition 1 has 1 members, want 2"},
		{"cohort too large", func(r *Ring) { r.Placement.Cohorts[3] = []ring.NodeID{"n1", "n2", "n3"} }, "partition 3 has 3 members, want 2"},
		{"unknown member", func(r *Ring) { r.Placement.Cohorts[2][1] = "n9" }, `partition 2: member "n9" unknown or repeated`},
		{"repeated member", func(r *Ring) { r.Placement.Cohorts[0][1] = "n1" }, `partition 0: member "n1" unknown or repeated`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := handRing()
			tc.change(r)
			err := r.Validate()
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("valid ring refused: %v", err)
			case tc.reason == "":
			case !errors.Is(err, ErrBadRing):
				t.Fatalf("got %v, want ErrBadRing", err)
			case !strings.Contains(err.Error(), tc.reason):
				t.Fatalf("error %q does not say %q", err, tc.reason)
			}
		})
	}
}

func TestRingLookups(t *testing.T) {
	r := handRing()
	for _, nd := range r.Nodes {
		got, ok := r.Node(nd.ID)
		if !ok || got != nd {
			t.Errorf("Node(%q) = %+v, %v; want %+v", nd.ID, got, ok, nd)
		}
	}
	for _, id := range []string{"", "n0", "n10", "n4", "m1"} {
		if got, ok := r.Node(id); ok || got != (RingNode{}) {
			t.Errorf("Node(%q) = %+v, %v; want nothing", id, got, ok)
		}
	}
	for p, want := range r.Placement.Cohorts {
		if got := r.Cohort(p); !slices.Equal(got, want) {
			t.Errorf("Cohort(%d) = %v, want %v", p, got, want)
		}
		for _, nd := range r.Nodes {
			if got, want := r.Hosts(p, nd.ID), slices.Contains(want, ring.NodeID(nd.ID)); got != want {
				t.Errorf("Hosts(%d, %q) = %v, want %v", p, nd.ID, got, want)
			}
		}
		if r.Hosts(p, "n9") {
			t.Errorf("Hosts(%d, an unknown node)", p)
		}
	}
}

func TestNewRing(t *testing.T) {
	sorted := testNodes(5)
	given := []RingNode{sorted[3], sorted[0], sorted[4], sorted[2], sorted[1]}
	givenCopy := slices.Clone(given)
	r, err := NewRing(given, 16, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(given, givenCopy) {
		t.Error("NewRing reordered the caller's slice")
	}
	if !slices.Equal(r.Nodes, sorted) {
		t.Errorf("nodes %v, want them sorted by id: %v", r.Nodes, sorted)
	}
	if r.Epoch != 1 || r.Partitions != 16 || r.Replication != 3 {
		t.Errorf("epoch %d, P %d, N %d; want 1, 16, 3", r.Epoch, r.Partitions, r.Replication)
	}
	if len(r.ClusterID) != 32 || strings.Trim(r.ClusterID, "0123456789abcdef") != "" {
		t.Errorf("cluster id %q is not 16 bytes in hex", r.ClusterID)
	}
	plan, err := ring.Plan(ring.Placement{}, []ring.Node{{ID: "n1"}, {ID: "n2"}, {ID: "n3"}, {ID: "n4"}, {ID: "n5"}}, 16, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r.Placement, plan) {
		t.Errorf("placement %v, want ring.Plan's %v", r.Placement, plan)
	}
	if err := r.Validate(); err != nil {
		t.Error(err)
	}
	again, err := NewRing(given, 16, 3)
	if err != nil {
		t.Fatal(err)
	}
	if again.ClusterID == r.ClusterID {
		t.Errorf("a second new ring has the first one's cluster id %q: want a fresh one", r.ClusterID)
	}

	// N may be as large as the node count (the caller caps it there) and a
	// cluster of one needs no API address.
	if r, err := NewRing(sorted[:3], 4, 3); err != nil || r.Replication != 3 {
		t.Errorf("N 3 over 3 nodes: %v", err)
	}
	alone := []RingNode{{ID: "n1", RaftAddr: "127.0.0.1:2001"}}
	if r, err := NewRing(alone, 64, 1); err != nil || len(r.Nodes) != 1 {
		t.Errorf("a cluster of one: %v", err)
	}

	for _, tc := range []struct {
		name  string
		nodes []RingNode
		p, n  int
		want  error
	}{
		{"N above the node count", sorted[:2], 4, 3, ring.ErrTooFewNodes},
		{"N 0", sorted, 4, 0, ring.ErrBadReplication},
		{"bad P", sorted, 12, 3, ring.ErrBadPartitionCount},
		{"no nodes", nil, 4, 1, ring.ErrTooFewNodes},
		{"duplicate id", []RingNode{sorted[0], sorted[1], sorted[1]}, 4, 2, ring.ErrDuplicateNode},
		{"empty id", []RingNode{sorted[0], {RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2"}}, 4, 1, ring.ErrBadNode},
		{"no API address in a cluster of 2", []RingNode{sorted[0], {ID: "n2", RaftAddr: "127.0.0.1:2002"}}, 4, 2, ErrBadRing},
	} {
		if _, err := NewRing(tc.nodes, tc.p, tc.n); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestMetaVoters(t *testing.T) {
	for nodes, want := range []int{0, 1, 2, 3, 3, 5, 5, 5, 5, 5, 5} {
		if got := MetaVoters(nodes); got != want {
			t.Errorf("MetaVoters(%d) = %d, want %d", nodes, got, want)
		}
	}
	if got := MetaVoters(100); got != 5 {
		t.Errorf("MetaVoters(100) = %d, want 5", got)
	}
}

// member is a free, alive member id with both addresses.
func member(id string) Member {
	return Member{NodeMeta: NodeMeta{ID: id, APIAddr: "127.0.0.1:1" + id[1:], RaftAddr: "127.0.0.1:2" + id[1:]},
		GossipAddr: "127.0.0.1:3" + id[1:]}
}

func ids(ms []Member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

func TestDecideFormation(t *testing.T) {
	with := func(id string, change func(*Member)) Member {
		m := member(id)
		change(&m)
		return m
	}
	for _, tc := range []struct {
		name    string
		members []Member
		expect  int
		want    []string // the cluster's first nodes; nil: not ready
	}{
		{"nobody", nil, 3, nil},
		{"fewer than expected", []Member{member("n1"), member("n2")}, 3, nil},
		{"as many as expected", []Member{member("n3"), member("n1"), member("n2")}, 3, []string{"n1", "n2", "n3"}},
		{"more than expected: the lowest ids", []Member{member("n5"), member("n2"), member("n4"), member("n3"), member("n1")}, 3,
			[]string{"n1", "n2", "n3"}},
		{"expect 1", []Member{member("n2"), member("n1")}, 1, []string{"n1"}},
		{"expect 0", []Member{member("n1")}, 0, nil},
		{"expect negative", []Member{member("n1")}, -1, nil},
		// New nodes that see a running cluster wait to be joined rather
		// than form a second one beside it.
		{"an up member of a cluster stops a formation", []Member{
			with("n1", func(m *Member) { m.ClusterID = "c1" }), member("n2"), member("n3"), member("n4"),
		}, 3, nil},
		{"a suspect member of a cluster stops it too", []Member{
			member("n1"), member("n2"), member("n3"), with("n4", func(m *Member) { m.ClusterID = "c1"; m.State = StateSuspect }),
		}, 3, nil},
		{"a dead member of a cluster does not", []Member{
			member("n1"), member("n2"), member("n3"), with("n4", func(m *Member) { m.ClusterID = "c1"; m.State = StateDead }),
		}, 3, []string{"n1", "n2", "n3"}},
		{"dead and left members do not count", []Member{
			with("n1", func(m *Member) { m.State = StateDead }), member("n2"),
			with("n3", func(m *Member) { m.State = StateLeft }), member("n4"), member("n5"),
		}, 3, []string{"n2", "n4", "n5"}},
		{"not enough without the dead", []Member{
			member("n1"), member("n2"), with("n3", func(m *Member) { m.State = StateDead }),
		}, 3, nil},
		// Suspect is still up (a missed probe is not a death,
		// ARCHITECTURE "States"): it counts.
		{"a suspect member counts", []Member{
			with("n1", func(m *Member) { m.State = StateSuspect }), member("n2"), member("n3"),
		}, 3, []string{"n1", "n2", "n3"}},
		{"members without an API or Raft address do not count", []Member{
			with("n1", func(m *Member) { m.APIAddr = "" }), with("n2", func(m *Member) { m.RaftAddr = "" }),
			member("n3"), member("n4"), member("n5"),
		}, 3, []string{"n3", "n4", "n5"}},
		{"a gossip address is not needed", []Member{
			with("n1", func(m *Member) { m.GossipAddr = "" }), member("n2"),
		}, 2, []string{"n1", "n2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := DecideFormation(tc.members, tc.expect, "n1")
			if tc.want == nil {
				if !reflect.DeepEqual(f, Formation{}) {
					t.Fatalf("got %+v, want not ready", f)
				}
				return
			}
			if !f.Ready || !slices.Equal(ids(f.Members), tc.want) {
				t.Fatalf("ready %v with %v, want ready with %v", f.Ready, ids(f.Members), tc.want)
			}
			for _, m := range f.Members {
				if i := slices.IndexFunc(tc.members, func(x Member) bool { return x.ID == m.ID }); !reflect.DeepEqual(m, tc.members[i]) {
					t.Errorf("member %+v, given %+v", m, tc.members[i])
				}
			}
			if f.Bootstrap != (tc.want[0] == "n1") {
				t.Errorf("n1 bootstraps: %v, want %v", f.Bootstrap, tc.want[0] == "n1")
			}
		})
	}
}

// Every waiting node sees the members in its own order and is itself
// someone else; all must reach the same formation, and exactly the lowest
// free id bootstraps.
func TestDecideFormationSameEverywhere(t *testing.T) {
	members := []Member{member("n4"), member("n2"), member("n6"), member("n3"), member("n5"), member("n1")}
	members[5].RaftAddr = ""           // n1 has no Raft address yet
	members[3].State = StateDead       // n3 died
	members[0].State = StateSuspect    // n4 is suspected by this node
	want := []string{"n2", "n4", "n5"} // n6 waits in vain
	for view := range len(members) {
		// This view's member order: the list rotated, reversed on odd views.
		seen := append(slices.Clone(members[view:]), members[:view]...)
		if view%2 == 1 {
			slices.Reverse(seen)
		}
		before := slices.Clone(seen)
		for _, self := range ids(members) {
			f := DecideFormation(seen, 3, self)
			if !f.Ready || !slices.Equal(ids(f.Members), want) {
				t.Fatalf("view %d of %s: ready %v with %v, want %v", view, self, f.Ready, ids(f.Members), want)
			}
			if f.Bootstrap != (self == "n2") {
				t.Errorf("view %d of %s: bootstrap %v", view, self, f.Bootstrap)
			}
		}
		if !reflect.DeepEqual(seen, before) {
			t.Fatalf("DecideFormation reordered its input")
		}
	}
}

func TestSaveLoadRing(t *testing.T) {
	dir := t.TempDir()
	if r, err := LoadRing(dir); r != nil || err != nil {
		t.Fatalf("no ring kept yet: got %v, %v; want nil, nil", r, err)
	}
	r, err := NewRing(testNodes(3), 8, 2)
	if err != nil {
		t.Fatal(err)
	}
	for epoch := uint64(1); epoch <= 2; epoch++ {
		r.Epoch = epoch
		if err := SaveRing(dir, r); err != nil {
			t.Fatal(err)
		}
		got, err := LoadRing(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("loaded %+v, saved %+v", got, r)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != "ring.json" {
			t.Fatalf("dir holds %v, want only ring.json", entries)
		}
	}

	if err := SaveRing(filepath.Join(dir, "missing"), r); err == nil {
		t.Error("SaveRing into a missing dir succeeded")
	}
	// A save that fails after writing its temporary file (here the rename:
	// ring.json is a directory) leaves nothing half-written behind.
	blocked := t.TempDir()
	if err := os.Mkdir(filepath.Join(blocked, "ring.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := SaveRing(blocked, r); err == nil {
		t.Fatal("SaveRing over a directory succeeded")
	}
	if _, err := os.Stat(filepath.Join(blocked, "ring.json.tmp")); !os.IsNotExist(err) {
		t.Fatalf("a failed SaveRing left ring.json.tmp behind (stat: %v)", err)
	}
}

func TestLoadRingCorrupt(t *testing.T) {
	broken := handRing()
	broken.Placement.Cohorts[3] = []ring.NodeID{"n1", "n9"}
	brokenJSON, err := json.Marshal(broken)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		content string
		want    error // nil: any error
	}{
		{"empty", "", nil},
		{"not JSON", "{ring", nil},
		{"cut short", `{"cluster_id": "c1", "epoch": 3`, nil},
		{"wrong type", `{"cluster_id": 5}`, nil},
		{"not a valid ring", `{"cluster_id": "c1", "epoch": 0}`, ErrBadRing},
		{"unknown node in the placement", string(brokenJSON), ErrBadRing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "ring.json")
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := LoadRing(dir)
			if err == nil || r != nil {
				t.Fatalf("got %v, %v; want an error", r, err)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}
