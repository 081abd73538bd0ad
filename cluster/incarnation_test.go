package cluster

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// incRing is addrRing with incarnations i1..i3 recorded for n1..n3.
func incRing() *Ring {
	r := addrRing()
	for i := range r.Nodes {
		r.Nodes[i].Incarnation = "i" + r.Nodes[i].ID[1:]
	}
	return r
}

func TestCheckIncarnation(t *testing.T) {
	tests := []struct {
		name        string
		ring        func() *Ring
		id, here    string
		refused     bool
		fixContains []string // what the refusal must say
	}{
		{name: "no ring", ring: func() *Ring { return nil }, id: "n3", here: "x"},
		{name: "same incarnation", ring: incRing, id: "n3", here: "i3"},
		{name: "not in the ring (a new node, or removed)", ring: incRing, id: "n9", here: "x"},
		{name: "a ring from before incarnations", ring: addrRing, id: "n3", here: "x"},
		{name: "this node's record has none", ring: func() *Ring {
			r := incRing()
			r.Nodes[2].Incarnation = ""
			return r
		}, id: "n3", here: "x"},
		{name: "another incarnation (a wiped data dir)", ring: incRing, id: "n3", here: "x", refused: true,
			fixContains: []string{"node n3: its data dir is not the one the cluster knows as n3 (incarnation x here, i3 in the cluster's ring of epoch 1)",
				"the data of n3 was lost or replaced", "`nornctl remove n3 --dead`", "empty data dir", "`nornctl join n3`", "new -node-id"}},
		{name: "a data dir without incarnation against a ring with one", ring: incRing, id: "n3", here: "", refused: true,
			fixContains: []string{"incarnation  here, i3"}},
		{name: "being removed already", ring: func() *Ring {
			r := incRing()
			r.Nodes[2].Role = RoleDead
			return r
		}, id: "n3", here: "x", refused: true,
			fixContains: []string{"n3 is being removed from the cluster (role dead)", "not a member", "`nornctl join n3`"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckIncarnation(tc.ring(), tc.id, tc.here)
			if !tc.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var re *ReplacedDataDirError
			if !errors.Is(err, ErrDataDirReplaced) || !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *ReplacedDataDirError wrapping ErrDataDirReplaced", err)
			}
			if re.Node != tc.id || re.Here != tc.here || re.Known != "i3" {
				t.Errorf("refusal %+v", re)
			}
			for _, s := range tc.fixContains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the refusal does not say %q: %v", s, err)
				}
			}
		})
	}
}

func TestNewIncarnation(t *testing.T) {
	a, err := NewIncarnation()
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewIncarnation()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hex.DecodeString(a); err != nil || len(a) != 16 || a == b {
		t.Fatalf("incarnations %q and %q: want two different 16-digit hex strings", a, b)
	}
}

func TestIncarnationsToRecord(t *testing.T) {
	withInc := func(ms []Member) []Member {
		for i := range ms {
			ms[i].Incarnation = "g" + ms[i].ID[1:]
		}
		return ms
	}
	tests := []struct {
		name   string
		ring   *Ring
		change func(ms []Member)
		want   map[string]string
	}{
		{name: "every node recorded already", ring: incRing(), change: func([]Member) {}},
		{name: "a ring from before incarnations", ring: addrRing(), change: func([]Member) {},
			want: map[string]string{"n1": "g1", "n2": "g2", "n3": "g3"}},
		{name: "only the nodes without one", ring: func() *Ring {
			r := incRing()
			r.Nodes[1].Incarnation = ""
			return r
		}(), change: func([]Member) {}, want: map[string]string{"n2": "g2"}},
		{name: "not alive, other cluster, none gossiped", ring: addrRing(), change: func(ms []Member) {
			ms[0].State = StateSuspect
			ms[1].ClusterID = ""
			ms[2].Incarnation = ""
		}},
		{name: "dead and left", ring: addrRing(), change: func(ms []Member) {
			ms[0].State, ms[1].State = StateDead, StateLeft
		}, want: map[string]string{"n3": "g3"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ms := withInc(asMembers(addrRing()))
			tc.change(ms)
			got := IncarnationsToRecord(tc.ring, ms)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for id, inc := range tc.want {
				if got[id] != inc {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
	stranger := Member{NodeMeta: NodeMeta{ID: "n9", ClusterID: "c1", Incarnation: "g9"}, State: StateAlive}
	if got := IncarnationsToRecord(incRing(), []Member{stranger}); got != nil {
		t.Fatalf("a node the ring does not list: %v", got)
	}
	if got := IncarnationsToRecord(nil, []Member{stranger}); got != nil {
		t.Fatalf("no ring: %v", got)
	}
}

func TestRingWithIncarnations(t *testing.T) {
	r := incRing()
	r.Nodes[1].Incarnation = ""
	next := r.WithIncarnations(map[string]string{"n2": "g2", "n3": "g3"})
	if next.Epoch != r.Epoch+1 {
		t.Fatalf("epoch %d after %d", next.Epoch, r.Epoch)
	}
	for id, want := range map[string]string{"n1": "i1", "n2": "g2", "n3": "i3"} {
		if nd, _ := next.Node(id); nd.Incarnation != want {
			t.Errorf("%s's incarnation %q, want %q (a recorded one never changes)", id, nd.Incarnation, want)
		}
	}
	if old, _ := r.Node("n2"); old.Incarnation != "" {
		t.Fatalf("the old ring changed: %+v", old)
	}
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestRingIncarnationJSON: a node's incarnation is absent from the JSON
// when empty, so rings and ring.json files from before incarnations read
// as rings whose nodes have none, and write back the same.
func TestRingIncarnationJSON(t *testing.T) {
	old := addrRing()
	b, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "incarnation") {
		t.Fatalf("a ring without incarnations encodes one: %s", b)
	}
	r := incRing()
	if b, err = json.Marshal(r); err != nil {
		t.Fatal(err)
	}
	var back Ring
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if nd, _ := back.Node("n2"); nd.Incarnation != "i2" {
		t.Fatalf("n2 after a round trip: %+v", nd)
	}
}
