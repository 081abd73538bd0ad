package claims

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/norn-dev/norn/storage"
)

// TestGroupSnapshotRestore takes snapshots (a low threshold makes Raft
// snapshot and truncate its log) and restores one into a fresh node: the
// restored FSM equals the original.
func TestGroupSnapshotRestore(t *testing.T) {
	dir := t.TempDir()
	n := startTestNode(t, dir, 16)
	var ids []uint64
	for i := range 40 {
		ids = append(ids, uint64(i+1))
	}
	enqueue(t, n.store, ids...)
	for _, id := range ids {
		o := n.propose(t, claimCmd(time.Now().UnixMilli(), 60_000, id))
		if id%2 == 0 {
			n.propose(t, Command{Op: OpYield, NowMs: time.Now().UnixMilli(), ID: id, Token: o[0].Claim.Token})
		}
	}
	fresh := restoreSnapshot(t, n, dir, func(st *storage.Store) { enqueue(t, st, ids...) })
	for _, id := range ids {
		a, _ := n.store.ClaimFSMRecord(3, id)
		b, _ := fresh.ClaimFSMRecord(3, id)
		if string(a) != string(b) {
			t.Fatalf("task %d: restored record differs", id)
		}
	}
	wantClaimed, _ := n.store.ClaimsExpiring(3, 1<<62, 100)
	gotClaimed, _ := fresh.ClaimsExpiring(3, 1<<62, 100)
	if len(wantClaimed) != 20 || fmt.Sprint(gotClaimed) != fmt.Sprint(wantClaimed) {
		t.Fatalf("claimed index after restore: %d vs %d entries", len(gotClaimed), len(wantClaimed))
	}
	a1, _ := n.store.ClaimFSMApplied(3)
	a2, _ := fresh.ClaimFSMApplied(3)
	if a2 == 0 || a2 > a1 {
		t.Fatalf("restored applied index %d (source %d)", a2, a1)
	}
	n.stop(t)
}

// restoreSnapshot has n's group take a snapshot and restores it into the
// FSM of partition 3 on a fresh store (prepared by prepare first), which
// it returns (closed at the test's end).
func restoreSnapshot(t *testing.T, n *testNode, dir string, prepare func(*storage.Store)) *storage.Store {
	t.Helper()
	if err := n.group.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	snaps, err := raft.NewFileSnapshotStore(dir+"/snap", 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	list, err := snaps.List()
	if err != nil || len(list) == 0 {
		t.Fatalf("no snapshot: %v", err)
	}
	_, rc, err := snaps.Open(list[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := storage.Open(storage.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fresh.Close() })
	prepare(fresh)
	f := &fsm{p: 3, kv: fresh, logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := f.Restore(rc); err != nil {
		t.Fatal(err)
	}
	return fresh
}
