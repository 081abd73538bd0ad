package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// proposeTimeout bounds every proposal in these tests.
const proposeTimeout = 5 * time.Second

// metaReplica is one replica of a meta group under test, on in-memory
// stores that outlive its restarts and an in-memory transport made anew
// for each start (its address is its id).
type metaReplica struct {
	id    string
	store *raft.InmemStore // log and stable store
	snaps *raft.InmemSnapshotStore
	trans *raft.InmemTransport
	meta  *Meta // nil while stopped

	mu    sync.Mutex
	rings []*Ring // what OnRing gave, in order
}

// start starts the replica on its stores.
func (r *metaReplica) start(t *testing.T) {
	t.Helper()
	_, r.trans = raft.NewInmemTransport(raft.ServerAddress(r.id))
	m, err := StartMeta(MetaConfig{
		LocalID: r.id, Transport: r.trans, Log: r.store, Stable: r.store, Snapshots: r.snaps,
		HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond,
		OnRing: func(g *Ring) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.rings = append(r.rings, g)
		},
		RaftLogger: hclog.NewNullLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	r.meta = m
}

// stop shuts the replica down (if it runs) and closes its transport.
func (r *metaReplica) stop(t *testing.T) {
	t.Helper()
	if r.meta == nil {
		return
	}
	if err := r.meta.Shutdown(); err != nil {
		t.Error(err)
	}
	r.trans.Close()
	r.meta = nil
}

// restart stops and starts the replica again on the same stores, and
// forgets the rings OnRing gave before.
func (r *metaReplica) restart(t *testing.T) {
	t.Helper()
	r.stop(t)
	r.mu.Lock()
	r.rings = nil
	r.mu.Unlock()
	r.start(t)
}

// seen are the rings OnRing gave, in order.
func (r *metaReplica) seen() []*Ring {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rings)
}

// epochs are the epochs of the rings OnRing gave, in order.
func (r *metaReplica) epochs() []uint64 {
	var out []uint64
	for _, g := range r.seen() {
		out = append(out, g.Epoch)
	}
	return out
}

// startMetaGroup starts k connected replicas n1..nk, bootstraps them (all
// voters) from n1 and stops them at the end of the test.
func startMetaGroup(t *testing.T, k int) []*metaReplica {
	t.Helper()
	g := make([]*metaReplica, k)
	voters := make([]RingNode, k)
	for i := range g {
		id := "n" + string(rune('1'+i))
		g[i] = &metaReplica{id: id, store: raft.NewInmemStore(), snaps: raft.NewInmemSnapshotStore()}
		g[i].start(t)
		voters[i] = RingNode{ID: id, RaftAddr: id}
	}
	t.Cleanup(func() {
		for _, r := range g {
			r.stop(t)
		}
	})
	for _, a := range g {
		for _, b := range g {
			if a != b {
				a.trans.Connect(b.trans.LocalAddr(), b.trans)
			}
		}
	}
	if g[0].meta.Ring() != nil {
		t.Fatal("a new replica has a ring")
	}
	if err := g[0].meta.Bootstrap(voters); err != nil {
		t.Fatal(err)
	}
	return g
}

// startLeader starts a group of one voter and waits until it leads.
func startLeader(t *testing.T) *metaReplica {
	t.Helper()
	r := startMetaGroup(t, 1)[0]
	if !r.meta.WaitLeader(10 * time.Second) {
		t.Fatal("a single voter did not become leader within 10s")
	}
	return r
}

// waitMetaLeader waits until one of the running replicas of g leads.
func waitMetaLeader(t *testing.T, g []*metaReplica) *metaReplica {
	t.Helper()
	var leader *metaReplica
	eventually(t, "a meta leader", func() bool {
		for _, r := range g {
			if r.meta != nil && r.meta.IsLeader() {
				leader = r
				return true
			}
		}
		return false
	})
	return leader
}

// firstRing is a new cluster's first ring (epoch 1) over 3 nodes.
func firstRing(t *testing.T) *Ring {
	t.Helper()
	r, err := NewRing(testNodes(3), 4, 3)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// withEpoch is a copy of r at epoch e.
func withEpoch(r *Ring, e uint64) *Ring {
	c := *r
	c.Epoch = e
	return &c
}

// propose proposes r through m and fails the test if it is refused.
func propose(t *testing.T, m *Meta, r *Ring) {
	t.Helper()
	if err := m.ProposeRing(r, proposeTimeout); err != nil {
		t.Fatalf("propose epoch %d: %v", r.Epoch, err)
	}
}

// A group of one bootstraps, leads, and applies the rings proposed to it;
// OnRing sees each one by the time ProposeRing returns.
func TestMetaSingleVoter(t *testing.T) {
	n1 := startLeader(t)
	m := n1.meta
	if !m.IsLeader() || m.Leader() != "n1" || m.Stats()["state"] != "Leader" {
		t.Fatalf("leader: IsLeader %v, Leader %q, state %q", m.IsLeader(), m.Leader(), m.Stats()["state"])
	}
	if err := m.Bootstrap([]RingNode{{ID: "n1", RaftAddr: "n1"}}); !errors.Is(err, raft.ErrCantBootstrap) {
		t.Fatalf("second bootstrap: got %v, want raft.ErrCantBootstrap", err)
	}
	if m.Ring() != nil || n1.epochs() != nil {
		t.Fatal("a ring before any was proposed")
	}

	r1 := firstRing(t)
	propose(t, m, r1)
	if got := m.Ring(); !reflect.DeepEqual(got, r1) {
		t.Fatalf("ring %+v, proposed %+v", got, r1)
	}
	if got := n1.seen(); len(got) != 1 || !reflect.DeepEqual(got[0], r1) {
		t.Fatalf("OnRing gave %v, want the first ring", got)
	}
	r2 := withEpoch(r1, 2)
	r2.Nodes = slices.Clone(r2.Nodes)
	r2.Nodes[1].APIAddr = "127.0.0.1:9999" // a node moved
	propose(t, m, r2)
	if got := m.Ring(); !reflect.DeepEqual(got, r2) {
		t.Fatalf("ring %+v, proposed %+v", got, r2)
	}
	if got := n1.epochs(); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("OnRing saw epochs %v, want [1 2]", got)
	}
}

// Every proposal that is not exactly the next ring of this cluster is
// refused, and leaves the ring as it was.
func TestMetaProposeRefused(t *testing.T) {
	n1 := startLeader(t)
	m := n1.meta
	r1 := firstRing(t)
	if err := m.ProposeRing(withEpoch(r1, 2), proposeTimeout); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("a first ring of epoch 2: got %v, want ErrStaleEpoch", err)
	}
	if m.Ring() != nil || n1.epochs() != nil {
		t.Fatal("a refused first ring was applied")
	}
	propose(t, m, r1)
	propose(t, m, withEpoch(r1, 2))

	other := firstRing(t) // another cluster's
	noPlacement := withEpoch(r1, 3)
	noPlacement.Placement.Cohorts = nil
	for _, tc := range []struct {
		name string
		ring *Ring
		want error
	}{
		{"an older epoch", r1, ErrStaleEpoch},
		{"the current epoch", withEpoch(r1, 2), ErrStaleEpoch},
		{"an epoch skipped", withEpoch(r1, 4), ErrStaleEpoch},
		{"another cluster's next epoch", withEpoch(other, 3), ErrOtherCluster},
		{"another cluster's first ring", other, ErrOtherCluster},
		{"an invalid ring", noPlacement, ErrBadRing},
	} {
		if err := m.ProposeRing(tc.ring, proposeTimeout); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	// The FSM refuses what ProposeRing would not send, too.
	invalid, err := json.Marshal(metaCommand{Ring: noPlacement})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entry string
		want  error // nil: any error
	}{{`{"ring": null}`, nil}, {`ring`, nil}, {string(invalid), ErrBadRing}} {
		fut := m.raft.Apply([]byte(tc.entry), proposeTimeout)
		if err := fut.Error(); err != nil {
			t.Fatal(err)
		}
		if err, ok := fut.Response().(error); !ok || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("entry %s: response %v, want an error (%v)", tc.entry, fut.Response(), tc.want)
		}
	}
	if got := m.Ring(); got.Epoch != 2 || got.ClusterID != r1.ClusterID {
		t.Fatalf("after refusals the ring is epoch %d of %s, want epoch 2 of %s", got.Epoch, got.ClusterID, r1.ClusterID)
	}
	if got := n1.epochs(); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("OnRing saw epochs %v, want [1 2]", got)
	}
	propose(t, m, withEpoch(r1, 3))
}

// Three voters: the leader's rings reach the followers, a follower
// cannot propose, and when the leader goes a new one carries on from the
// last ring committed.
func TestMetaReplicates(t *testing.T) {
	g := startMetaGroup(t, 3)
	leader := waitMetaLeader(t, g)
	hasEpochs := func(rs []*metaReplica, want ...uint64) func() bool {
		return func() bool {
			for _, r := range rs {
				if !slices.Equal(r.epochs(), want) {
					return false
				}
			}
			return true
		}
	}

	r1 := firstRing(t)
	propose(t, leader.meta, r1)
	eventually(t, "epoch 1 on every replica", hasEpochs(g, 1))
	for _, r := range g {
		if got := r.meta.Ring(); !reflect.DeepEqual(got, r1) {
			t.Fatalf("%s has ring %+v, want %+v", r.id, got, r1)
		}
		if r == leader {
			continue
		}
		if err := r.meta.ProposeRing(withEpoch(r1, 2), proposeTimeout); !errors.Is(err, raft.ErrNotLeader) {
			t.Errorf("proposal on follower %s: got %v, want raft.ErrNotLeader", r.id, err)
		}
		eventually(t, r.id+" knows the leader", func() bool { return r.meta.Leader() == leader.id })
	}
	// Once epoch 2 is committed the leader goes, before the followers may
	// have applied it; the two others elect one of them, which applies it,
	// refuses it when proposed again and takes the next.
	propose(t, leader.meta, withEpoch(r1, 2))
	leader.stop(t)
	var rest []*metaReplica
	for _, r := range g {
		if r != leader {
			r.trans.Disconnect(raft.ServerAddress(leader.id))
			rest = append(rest, r)
		}
	}
	next := waitMetaLeader(t, rest)
	if err := next.meta.ProposeRing(withEpoch(r1, 2), proposeTimeout); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("epoch 2 again on the new leader: got %v, want ErrStaleEpoch", err)
	}
	propose(t, next.meta, withEpoch(r1, 3))
	eventually(t, "epoch 3 on the remaining replicas", hasEpochs(rest, 1, 2, 3))
}

// A restarted replica rebuilds its ring from the log: it replays every
// ring in order once it leads again.
func TestMetaRestartFromLog(t *testing.T) {
	n1 := startLeader(t)
	r1 := firstRing(t)
	propose(t, n1.meta, r1)
	propose(t, n1.meta, withEpoch(r1, 2))

	n1.restart(t)
	if err := n1.meta.Bootstrap([]RingNode{{ID: "n1", RaftAddr: "n1"}}); !errors.Is(err, raft.ErrCantBootstrap) {
		t.Fatalf("bootstrap after a restart: got %v, want raft.ErrCantBootstrap", err)
	}
	eventually(t, "the rings replayed", func() bool { return slices.Equal(n1.epochs(), []uint64{1, 2}) })
	if got := n1.meta.Ring(); !reflect.DeepEqual(got, withEpoch(r1, 2)) {
		t.Fatalf("ring after restart %+v, want epoch 2 of %+v", got, r1)
	}
	if !n1.meta.WaitLeader(10 * time.Second) {
		t.Fatal("no leader after the restart")
	}
	if err := n1.meta.ProposeRing(withEpoch(r1, 2), proposeTimeout); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("epoch 2 again after a restart: got %v, want ErrStaleEpoch", err)
	}
	propose(t, n1.meta, withEpoch(r1, 3))
}

// A restarted replica rebuilds its ring from its snapshot, before any
// leader is there, and then from the log entries after the snapshot.
func TestMetaRestartFromSnapshot(t *testing.T) {
	n1 := startLeader(t)
	r1 := firstRing(t)
	propose(t, n1.meta, r1)
	propose(t, n1.meta, withEpoch(r1, 2))
	if err := n1.meta.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	propose(t, n1.meta, withEpoch(r1, 3))
	n1.stop(t)

	// Compact the log up to the snapshot, as raft does once enough entries
	// follow it: the rings of epochs 1 and 2 are then only in the snapshot.
	snaps, err := n1.snaps.List()
	if err != nil || len(snaps) != 1 {
		t.Fatalf("snapshots %v, %v; want one", snaps, err)
	}
	first, err := n1.store.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	if err := n1.store.DeleteRange(first, snaps[0].Index); err != nil {
		t.Fatal(err)
	}

	n1.restart(t)
	// StartMeta restores the snapshot before it returns.
	if got := n1.meta.Ring(); !reflect.DeepEqual(got, withEpoch(r1, 2)) {
		t.Fatalf("ring right after the restart %+v, want the snapshot's (epoch 2)", got)
	}
	eventually(t, "the ring after the snapshot replayed", func() bool { return slices.Equal(n1.epochs(), []uint64{2, 3}) })
	if !n1.meta.WaitLeader(10 * time.Second) {
		t.Fatal("no leader after the restart")
	}
	propose(t, n1.meta, withEpoch(r1, 4))
}

// bufferSink is a raft.SnapshotSink in memory.
type bufferSink struct{ bytes.Buffer }

func (*bufferSink) ID() string    { return "test" }
func (*bufferSink) Close() error  { return nil }
func (*bufferSink) Cancel() error { return nil }

// persist returns f's snapshot as it is written.
func persist(t *testing.T, f *metaFSM) string {
	t.Helper()
	s, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink bufferSink
	if err := s.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	return sink.String()
}

// Restore takes a snapshot's ring, or none, and refuses a broken one.
func TestMetaFSMRestore(t *testing.T) {
	r1 := firstRing(t)
	snapshot := func(f *metaFSM) string { return persist(t, f) }
	var got []*Ring
	f := &metaFSM{onRing: func(r *Ring) { got = append(got, r) }}
	full, empty := snapshot(&metaFSM{ring: r1}), snapshot(&metaFSM{})

	if err := f.Restore(io.NopCloser(strings.NewReader(full))); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.ring, r1) || len(got) != 1 || !reflect.DeepEqual(got[0], r1) {
		t.Fatalf("restored %+v, OnRing %v; want %+v once", f.ring, got, r1)
	}
	if err := f.Restore(io.NopCloser(strings.NewReader(empty))); err != nil {
		t.Fatal(err)
	}
	if f.ring != nil || len(got) != 1 {
		t.Fatalf("a snapshot without a ring restored %+v (OnRing %d times)", f.ring, len(got))
	}
	for _, tc := range []struct {
		name, snap string
		want       error // nil: any error
	}{
		{"empty", "", nil},
		{"not JSON", "{ring", nil},
		{"invalid ring", strings.Replace(full, `"epoch":1`, `"epoch":0`, 1), ErrBadRing},
	} {
		err := f.Restore(io.NopCloser(strings.NewReader(tc.snap)))
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: got %v, want an error (%v)", tc.name, err, tc.want)
		}
	}
	if f.ring != nil || len(got) != 1 {
		t.Fatalf("a refused snapshot changed the ring to %+v (OnRing %d times)", f.ring, len(got))
	}
}

func TestStartMetaConfigErrors(t *testing.T) {
	_, trans := raft.NewInmemTransport("")
	store := raft.NewInmemStore()
	full := MetaConfig{LocalID: "n1", Transport: trans, Log: store, Stable: store, Snapshots: raft.NewInmemSnapshotStore()}
	for name, change := range map[string]func(*MetaConfig){
		"no id":        func(c *MetaConfig) { c.LocalID = "" },
		"no transport": func(c *MetaConfig) { c.Transport = nil },
		"no log":       func(c *MetaConfig) { c.Log = nil },
		"no stable":    func(c *MetaConfig) { c.Stable = nil },
		"no snapshots": func(c *MetaConfig) { c.Snapshots = nil },
		"lease above heartbeat": func(c *MetaConfig) {
			c.HeartbeatTimeout, c.LeaderLeaseTimeout = 100*time.Millisecond, time.Second
		},
	} {
		cfg := full
		change(&cfg)
		if m, err := StartMeta(cfg); err == nil {
			m.Shutdown()
			t.Errorf("%s: StartMeta succeeded", name)
		}
	}
}
