package antientropy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// t0 is the tests' wall clock (Unix ms).
const t0 = 1_700_000_000_000

// fixedClock is a crdt.Clock stopped at ms.
type fixedClock struct{ ms int64 }

func (c fixedClock) Now() time.Time { return time.UnixMilli(c.ms) }

// openStore opens a store on an in-memory Pebble.
func openStore(tb testing.TB) *storage.Store {
	tb.Helper()
	s, err := storage.Open(storage.Config{Dir: "db", FS: vfs.NewMem(), Clock: fixedClock{t0}, CacheBytes: 8 << 20})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// side is one replica of a test: a store, its Replica and a direct Peer
// that reaches it.
type side struct {
	store *storage.Store
	r     *Replica
	peer  *directPeer
}

// sideConfig tunes newSide; the zero value is a replica of DefaultLeafBits
// that never expires anything.
type sideConfig struct {
	leafBits int
	horizon  int64                                    // returned by Horizon
	expire   func(p uint16, h storage.Horizons) error // nil: the default (DeleteExpired)
	queues   map[string]int64                         // returned by QueueHorizons
	version  uint64                                   // returned by QueueHorizons
}

// newSide opens a store and a Replica tracking parts (none added when
// parts is empty: call r.Add).
func newSide(tb testing.TB, cfg sideConfig, parts ...uint16) *side {
	tb.Helper()
	s := openStore(tb)
	r, err := NewReplica(ReplicaConfig{Store: s, LeafBits: cfg.leafBits,
		Horizon: func() int64 { return cfg.horizon }, Expire: cfg.expire,
		QueueHorizons: func() (map[string]int64, uint64) { return cfg.queues, cfg.version }})
	if err != nil {
		tb.Fatal(err)
	}
	for _, p := range parts {
		if err := r.Add(p); err != nil {
			tb.Fatal(err)
		}
	}
	return &side{store: s, r: r, peer: newDirectPeer(r, s)}
}

// directPeer is a Peer that calls another Replica's Serve methods and its
// store in-process. Every request and response goes through
// proto.Marshal/Unmarshal, as over PeerService, so the byte counts are
// real protobuf sizes and nothing is shared between the two sides. It
// records what it was asked for.
type directPeer struct {
	r     *Replica
	store *storage.Store

	// beforeEntries and afterEntries, if set, run before and after the
	// peer answers its n-th SegmentEntries call (n from 1). The caller
	// reads its own entries after the peer's answer.
	beforeEntries, afterEntries func(n int)
	// tamper, if set, may change a response before it is returned (a
	// misbehaving peer).
	tamper func(resp proto.Message)

	mu      sync.Mutex
	entries int      // SegmentEntries calls
	entryOf []uint32 // the partition of each SegmentEntries call, in order
	read    []uint64 // ids asked for by ReadStates
	sent    []uint64 // ids ReadStates answered with a state
	pushed  []uint64 // ids of the states pushed
	// respBytes is the encoded size of every response sent.
	respBytes int
}

var _ Peer = (*directPeer)(nil)

func newDirectPeer(r *Replica, s *storage.Store) *directPeer { return &directPeer{r: r, store: s} }

// wire marshals m and unmarshals it into a new message: what the other
// side of a connection gets. It returns the encoded size.
func wire[M proto.Message](m M) (M, int, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		var zero M
		return zero, 0, err
	}
	out := m.ProtoReflect().New().Interface().(M)
	if err := proto.Unmarshal(b, out); err != nil {
		var zero M
		return zero, 0, err
	}
	return out, len(b), nil
}

// serve runs one Serve method with the request and response on the wire.
func serve[Req, Resp proto.Message](d *directPeer, req Req, fn func(Req) (Resp, error)) (Resp, error) {
	var zero Resp
	in, _, err := wire(req)
	if err != nil {
		return zero, err
	}
	resp, err := fn(in)
	if err != nil {
		return zero, err
	}
	if d.tamper != nil {
		d.tamper(resp)
	}
	out, n, err := wire(resp)
	d.mu.Lock()
	d.respBytes += n
	d.mu.Unlock()
	return out, err
}

func (d *directPeer) TreeRoots(_ context.Context, req *nornv1.TreeRootsRequest) (*nornv1.TreeRootsResponse, error) {
	return serve(d, req, d.r.ServeTreeRoots)
}

func (d *directPeer) TreeNodes(_ context.Context, req *nornv1.TreeNodesRequest) (*nornv1.TreeNodesResponse, error) {
	return serve(d, req, d.r.ServeTreeNodes)
}

func (d *directPeer) SegmentEntries(_ context.Context, req *nornv1.SegmentEntriesRequest) (*nornv1.SegmentEntriesResponse, error) {
	d.mu.Lock()
	d.entries++
	n := d.entries
	d.entryOf = append(d.entryOf, req.Partition)
	d.mu.Unlock()
	if d.beforeEntries != nil {
		d.beforeEntries(n)
	}
	resp, err := serve(d, req, d.r.ServeSegmentEntries)
	if err == nil && d.afterEntries != nil {
		d.afterEntries(n)
	}
	return resp, err
}

// ReadStates answers as PeerService.Read: one ReplicaTask per id, empty
// where the store has none. The bytes are the response's encoded size.
func (d *directPeer) ReadStates(_ context.Context, p uint16, ids []uint64) ([]*crdt.Task, int, error) {
	req, _, err := wire(&nornv1.ReadRequest{Ids: ids})
	if err != nil {
		return nil, 0, err
	}
	resp := &nornv1.ReadResponse{Tasks: make([]*nornv1.ReplicaTask, len(req.Ids))}
	var sent []uint64
	for i, id := range req.Ids {
		resp.Tasks[i] = &nornv1.ReplicaTask{}
		t, err := d.store.TaskState(p, id)
		switch {
		case errors.Is(err, storage.ErrNotFound):
			continue
		case err != nil:
			return nil, 0, err
		}
		resp.Tasks[i].State = t.Encode()
		sent = append(sent, id)
	}
	if d.tamper != nil {
		d.tamper(resp)
	}
	got, n, err := wire(resp)
	if err != nil {
		return nil, 0, err
	}
	out := make([]*crdt.Task, len(got.Tasks))
	for i, rt := range got.Tasks {
		if len(rt.State) == 0 {
			continue
		}
		if out[i], err = crdt.Decode(rt.State); err != nil {
			return nil, n, err
		}
	}
	d.mu.Lock()
	d.read = append(d.read, ids...)
	d.sent = append(d.sent, sent...)
	d.respBytes += n
	d.mu.Unlock()
	return out, n, nil
}

// Push merges the states as PeerService.Replicate does, in one synced
// MergeTasks. The bytes are the request's encoded size.
func (d *directPeer) Push(_ context.Context, p uint16, tasks []*crdt.Task) (int, error) {
	req := &nornv1.ReplicateRequest{Tasks: make([][]byte, len(tasks))}
	for i, t := range tasks {
		req.Tasks[i] = t.Encode()
	}
	in, n, err := wire(req)
	if err != nil {
		return 0, err
	}
	items := make([]storage.MergeItem, len(in.Tasks))
	var ids []uint64
	for i, enc := range in.Tasks {
		t, err := crdt.Decode(enc)
		if err != nil {
			return n, err
		}
		items[i] = storage.MergeItem{Partition: p, Task: t}
		ids = append(ids, t.ID)
	}
	if _, err := d.store.MergeTasks(items); err != nil {
		return n, err
	}
	d.mu.Lock()
	d.pushed = append(d.pushed, ids...)
	d.mu.Unlock()
	return n, nil
}

// reset forgets what the peer recorded.
func (d *directPeer) reset() {
	d.mu.Lock()
	d.entries, d.read, d.sent, d.pushed, d.respBytes = 0, nil, nil, nil, 0
	d.mu.Unlock()
}

// --- task builders and store helpers ---

// newTask is a fresh task with a spec (ready, not terminal).
func newTask(id uint64) *crdt.Task {
	return &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: "q", Payload: fmt.Appendf(nil, "payload-%d", id),
		CreatedAt: crdt.Timestamp{WallMs: t0, Node: 1}}}
}

// terminalOf is a state of id holding only a terminal event at wall time
// at (merging it ends the task).
func terminalOf(id uint64, at int64, kind crdt.TerminalKind, claim uint64) *crdt.Task {
	return &crdt.Task{ID: id, Terminals: []crdt.Terminal{{At: crdt.Timestamp{WallMs: at, Node: 1}, Kind: kind, Claim: claim}}}
}

// updateOf is a state of id holding only a progress update.
func updateOf(id, claim, seq uint64) *crdt.Task {
	return &crdt.Task{ID: id, Updates: []crdt.Update{{Claim: claim, Seq: seq,
		At: crdt.Timestamp{WallMs: t0 + int64(seq), Node: 2}, Progress: 0.5, Message: "working"}}}
}

// mergeAll merges the states into partition p in batches of 500.
func mergeAll(tb testing.TB, s *storage.Store, p uint16, tasks ...*crdt.Task) {
	tb.Helper()
	for chunk := range slices.Chunk(tasks, 500) {
		items := make([]storage.MergeItem, len(chunk))
		for i, t := range chunk {
			items[i] = storage.MergeItem{Partition: p, Task: t}
		}
		if _, err := s.MergeTasks(items); err != nil {
			tb.Fatal(err)
		}
	}
}

// stored returns every task state of partition p as id -> encoding.
func stored(tb testing.TB, s *storage.Store, p uint16) map[uint64]string {
	tb.Helper()
	out := map[uint64]string{}
	start := uint64(0)
	for {
		tasks, next, more, err := s.ScanTasks(p, start, 1000)
		if err != nil {
			tb.Fatal(err)
		}
		for _, t := range tasks {
			out[t.Task.ID] = string(t.Task.Encode())
		}
		if !more {
			return out
		}
		start = next
	}
}

// bruteRoot is the root a tree must have over the states: the XOR of
// Hash(id, digest) over all of them.
func bruteRoot(states map[uint64]string) uint64 {
	var h uint64
	for id, enc := range states {
		h ^= Hash(id, crdt.Digest([]byte(enc)))
	}
	return h
}

// joinAll is the state every replica must hold after a full exchange: the
// join of a's and b's state per id.
func joinAll(tb testing.TB, a, b map[uint64]string) map[uint64]string {
	tb.Helper()
	out := maps.Clone(a)
	for id, eb := range b {
		ea, ok := out[id]
		if !ok {
			out[id] = eb
			continue
		}
		j, _, err := crdt.Join(decode(tb, ea), decode(tb, eb))
		if err != nil {
			tb.Fatal(err)
		}
		out[id] = string(j.Encode())
	}
	return out
}

func decode(tb testing.TB, enc string) *crdt.Task {
	tb.Helper()
	t, err := crdt.Decode([]byte(enc))
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// sortedIDs returns the keys of m in order.
func sortedIDs[V any](m map[uint64]V) []uint64 { return slices.Sorted(maps.Keys(m)) }

// sorted returns a sorted copy of ids.
func sorted(ids []uint64) []uint64 {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}
