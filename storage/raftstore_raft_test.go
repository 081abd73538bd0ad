package storage

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// raftStoreTestFSM counts applied commands.
type raftStoreTestFSM struct {
	mu      sync.Mutex
	applied [][]byte
}

func (f *raftStoreTestFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = append(f.applied, bytes.Clone(l.Data))
	return len(f.applied)
}

func (f *raftStoreTestFSM) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.applied)
}

func (f *raftStoreTestFSM) Snapshot() (raft.FSMSnapshot, error) { return raftStoreTestSnapshot{}, nil }

func (f *raftStoreTestFSM) Restore(rc io.ReadCloser) error { return rc.Close() }

type raftStoreTestSnapshot struct{}

func (raftStoreTestSnapshot) Persist(sink raft.SnapshotSink) error { return sink.Close() }
func (raftStoreTestSnapshot) Release()                             {}

// waitRaftStore polls cond until it holds or the deadline passes.
func waitRaftStore(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestRaftStoreWithRaft runs a real single-voter Raft group on RaftStore,
// restarts it on the reopened DB, and checks that nothing applied is lost.
func TestRaftStoreWithRaft(t *testing.T) {
	dir := t.TempDir()
	const partition, entries = 7, 25
	conf := raft.DefaultConfig()
	conf.LocalID = "n1"
	conf.HeartbeatTimeout = 50 * time.Millisecond
	conf.ElectionTimeout = 50 * time.Millisecond
	conf.LeaderLeaseTimeout = 50 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond
	conf.Logger = hclog.New(&hclog.LoggerOptions{Name: "raft", Output: t.Output(), Level: hclog.Warn})
	snaps := raft.NewInmemSnapshotStore()

	// First life: bootstrap, elect, apply.
	db := openRaftTestDB(t, vfs.Default, dir)
	store := NewRaftStore(db, partition)
	addr, trans := raft.NewInmemTransport("")
	mustRaft(t, raft.BootstrapCluster(conf, store, store, snaps, trans, raft.Configuration{
		Servers: []raft.Server{{ID: conf.LocalID, Address: addr}},
	}))
	fsm := &raftStoreTestFSM{}
	r, err := raft.NewRaft(conf, fsm, store, store, snaps, trans)
	mustRaft(t, err)
	waitRaftStore(t, "leadership", func() bool { return r.State() == raft.Leader })
	var lastApplied uint64
	for i := range entries {
		f := r.Apply([]byte(fmt.Sprintf("cmd-%d", i)), time.Second)
		mustRaft(t, f.Error())
		lastApplied = f.Index()
	}
	if fsm.count() != entries {
		t.Fatalf("FSM applied %d entries, want %d", fsm.count(), entries)
	}
	mustRaft(t, r.Shutdown().Error())
	mustRaft(t, trans.Close())
	mustRaft(t, db.Close())

	// Second life: same directory, fresh DB handle, store, FSM and Raft.
	db = openRaftTestDBCleanup(t, vfs.Default, dir)
	store = NewRaftStore(db, partition)
	if last, err := store.LastIndex(); err != nil || last < lastApplied {
		t.Fatalf("LastIndex after reopen = %d, %v; want >= %d", last, err, lastApplied)
	}
	var l raft.Log
	mustRaft(t, store.GetLog(lastApplied, &l))
	if l.Type != raft.LogCommand || string(l.Data) != fmt.Sprintf("cmd-%d", entries-1) || l.AppendedAt.IsZero() {
		t.Errorf("last applied entry = %+v", l)
	}
	if term, err := store.GetUint64([]byte("CurrentTerm")); err != nil || term == 0 {
		t.Errorf("CurrentTerm after reopen = %d, %v", term, err)
	}

	_, trans = raft.NewInmemTransport(addr)
	defer trans.Close()
	fsm = &raftStoreTestFSM{}
	r, err = raft.NewRaft(conf, fsm, store, store, snaps, trans)
	mustRaft(t, err)
	defer func() { mustRaft(t, r.Shutdown().Error()) }()
	if r.LastIndex() < lastApplied {
		t.Fatalf("restarted raft LastIndex = %d, want >= %d", r.LastIndex(), lastApplied)
	}
	waitRaftStore(t, "re-election", func() bool { return r.State() == raft.Leader })
	mustRaft(t, r.Barrier(time.Second).Error())
	if fsm.count() != entries {
		t.Errorf("restarted FSM replayed %d entries, want %d", fsm.count(), entries)
	}
	f := r.Apply([]byte("after-restart"), time.Second)
	mustRaft(t, f.Error())
	if f.Index() <= lastApplied {
		t.Errorf("new entry index %d, want > %d", f.Index(), lastApplied)
	}
}
