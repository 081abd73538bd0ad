package antientropy

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

func TestNewReplicaConfig(t *testing.T) {
	s := openStore(t)
	h := func() int64 { return 0 }
	bad := []ReplicaConfig{
		{Horizon: h},
		{Store: s},
		{Store: s, Horizon: h, LeafBits: MinLeafBits - 1},
		{Store: s, Horizon: h, LeafBits: MaxLeafBits + 1},
		{Store: s, Horizon: h, LeafBits: -1},
	}
	for _, cfg := range bad {
		if _, err := NewReplica(cfg); err == nil {
			t.Errorf("NewReplica(%+v): no error", cfg)
		}
	}
	r, err := NewReplica(ReplicaConfig{Store: s, Horizon: h})
	if err != nil || r.LeafBits() != DefaultLeafBits {
		t.Fatalf("default replica: %v, leaf bits %d", err, r.LeafBits())
	}
	if n, bytes := r.Partitions(); n != 0 || bytes != 0 {
		t.Fatalf("new replica: %d partitions, %d bytes", n, bytes)
	}
	for _, p := range []uint16{0, 7, 7} {
		if err := r.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	if n, bytes := r.Partitions(); n != 2 || bytes != 2*r.Tree(0).Bytes() {
		t.Fatalf("2 partitions: Partitions() = %d, %d bytes", n, bytes)
	}
}

// TestServeBadRequests: every malformed request to a Serve method is an
// error (classified where the API says so), never a panic, and a rejected
// TreeRoots expires nothing.
func TestServeBadRequests(t *testing.T) {
	s := newSide(t, sideConfig{horizon: t0}, 0, 5)
	expired := []*crdt.Task{newTask(1), terminalOf(1, t0-1, crdt.Completed, 1)}
	mergeAll(t, s.store, 0, expired...)
	tr := s.r.Tree(0)
	leaves := uint32(tr.Width(tr.Levels() - 1))
	lb := uint32(DefaultLeafBits)
	many := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(i)
		}
		return out
	}

	roots := []struct {
		name string
		req  *nornv1.TreeRootsRequest
		is   error
	}{
		{"no partitions", &nornv1.TreeRootsRequest{LeafBits: lb}, nil},
		{"too many partitions", &nornv1.TreeRootsRequest{LeafBits: lb, Partitions: many(MaxRootsPartitions + 1)}, nil},
		{"unknown partition", &nornv1.TreeRootsRequest{LeafBits: lb, Partitions: []uint32{0, 1}}, ErrNotReplicated},
		{"partition above 65535", &nornv1.TreeRootsRequest{LeafBits: lb, Partitions: []uint32{1 << 16}}, ErrNotReplicated},
		{"partition 2^32-1", &nornv1.TreeRootsRequest{LeafBits: lb, Partitions: []uint32{1<<32 - 1}}, ErrNotReplicated},
		{"repeated partition", &nornv1.TreeRootsRequest{LeafBits: lb, Partitions: []uint32{0, 5, 0}}, nil},
		{"other leaf bits", &nornv1.TreeRootsRequest{LeafBits: lb - 1, Partitions: []uint32{0}}, ErrTreeSize},
		{"no leaf bits", &nornv1.TreeRootsRequest{Partitions: []uint32{0}}, ErrTreeSize},
	}
	for _, tc := range roots {
		tc.req.DeleteHorizonMs = t0 + 1 // would expire task 1 if applied
		resp, err := s.r.ServeTreeRoots(tc.req)
		if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("TreeRoots, %s: %v, %v; want an error (%v)", tc.name, resp, err, tc.is)
		}
	}
	if _, err := s.store.TaskState(0, 1); err != nil {
		t.Fatalf("a rejected TreeRoots expired a task: %v", err)
	}

	nodes := []struct {
		name string
		req  *nornv1.TreeNodesRequest
		is   error
	}{
		{"unknown partition", &nornv1.TreeNodesRequest{Partition: 1, Nodes: []uint32{0}}, ErrNotReplicated},
		{"partition above 65535", &nornv1.TreeNodesRequest{Partition: 1<<16 + 5, Nodes: []uint32{0}}, ErrNotReplicated},
		{"no nodes", &nornv1.TreeNodesRequest{Partition: 0}, nil},
		{"too many nodes", &nornv1.TreeNodesRequest{Partition: 0, Level: uint32(tr.Levels() - 1), Nodes: many(MaxNodesPerCall + 1)}, nil},
		{"level too deep", &nornv1.TreeNodesRequest{Partition: 0, Level: uint32(tr.Levels()), Nodes: []uint32{0}}, nil},
		{"level 2^32-1", &nornv1.TreeNodesRequest{Partition: 0, Level: 1<<32 - 1, Nodes: []uint32{0}}, nil},
		{"node past the root", &nornv1.TreeNodesRequest{Partition: 0, Level: 0, Nodes: []uint32{1}}, nil},
		{"node past the leaves", &nornv1.TreeNodesRequest{Partition: 0, Level: uint32(tr.Levels() - 1), Nodes: []uint32{0, leaves}}, nil},
		{"node 2^32-1", &nornv1.TreeNodesRequest{Partition: 0, Level: 1, Nodes: []uint32{1<<32 - 1}}, nil},
	}
	for _, tc := range nodes {
		resp, err := s.r.ServeTreeNodes(tc.req)
		if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("TreeNodes, %s: %v, %v; want an error (%v)", tc.name, resp, err, tc.is)
		}
	}

	entries := []struct {
		name string
		req  *nornv1.SegmentEntriesRequest
		is   error
	}{
		{"unknown partition", &nornv1.SegmentEntriesRequest{Partition: 2, Leaves: []uint32{0}}, ErrNotReplicated},
		{"partition above 65535", &nornv1.SegmentEntriesRequest{Partition: 1 << 20, Leaves: []uint32{0}}, ErrNotReplicated},
		{"no leaves", &nornv1.SegmentEntriesRequest{Partition: 0}, nil},
		{"too many leaves", &nornv1.SegmentEntriesRequest{Partition: 0, Leaves: many(MaxLeavesPerCall + 1)}, nil},
		{"leaf past the last", &nornv1.SegmentEntriesRequest{Partition: 0, Leaves: []uint32{0, leaves}}, nil},
		{"leaf 2^32-1", &nornv1.SegmentEntriesRequest{Partition: 0, Leaves: []uint32{1<<32 - 1}}, nil},
	}
	for _, tc := range entries {
		resp, err := s.r.ServeSegmentEntries(tc.req)
		if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("SegmentEntries, %s: %v, %v; want an error (%v)", tc.name, resp, err, tc.is)
		}
	}

	// The limits themselves are accepted.
	if _, err := s.r.ServeTreeNodes(&nornv1.TreeNodesRequest{Partition: 0, Level: uint32(tr.Levels() - 1), Nodes: many(int(leaves))}); err != nil {
		t.Errorf("TreeNodes of every leaf: %v", err)
	}
	if _, err := s.r.ServeSegmentEntries(&nornv1.SegmentEntriesRequest{Partition: 0, Leaves: many(MaxLeavesPerCall)}); err != nil {
		t.Errorf("SegmentEntries of %d leaves: %v", MaxLeavesPerCall, err)
	}
	st, err := s.store.GetTask(0, 1)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.r.ServeSegmentEntries(&nornv1.SegmentEntriesRequest{Partition: 0, Leaves: []uint32{tr.Leaf(storage.Segment(1))}})
	if err != nil || len(resp.Ids) != 1 || resp.Ids[0] != 1 || resp.Digests[0] != st.Digest {
		t.Errorf("SegmentEntries of task 1's leaf: %v, %v", resp, err)
	}
	// A valid TreeRoots applies the later horizon before answering.
	rr, err := s.r.ServeTreeRoots(&nornv1.TreeRootsRequest{LeafBits: lb, Partitions: []uint32{5, 0}, DeleteHorizonMs: t0 + 1})
	if err != nil || len(rr.Roots) != 2 || rr.Roots[0] != 0 || rr.Roots[1] != 0 || rr.DeleteHorizonMs != t0+1 {
		t.Fatalf("TreeRoots: %v, %v; want two empty roots and the caller's later horizon", rr, err)
	}
	rr, err = s.r.ServeTreeRoots(&nornv1.TreeRootsRequest{LeafBits: lb, Partitions: []uint32{0}, DeleteHorizonMs: 5})
	if err != nil || rr.DeleteHorizonMs != t0 {
		t.Fatalf("TreeRoots with an earlier horizon: %v, %v; want this replica's %d", rr, err, int64(t0))
	}
}

// TestExchangeErrors: an exchange a replica cannot run, or whose peer
// refuses it, is an error classified by identity.
func TestExchangeErrors(t *testing.T) {
	ctx := context.Background()
	a := newSide(t, sideConfig{}, 0, 1)
	b := newSide(t, sideConfig{}, 0)
	other := newSide(t, sideConfig{leafBits: DefaultLeafBits - 1}, 0, 1)
	if _, err := a.r.Exchange(ctx, b.peer, []uint16{0, 2}, Options{}); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("exchange of a partition not replicated here: %v", err)
	}
	if _, err := a.r.Exchange(ctx, b.peer, []uint16{0, 1}, Options{}); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("exchange of a partition the peer does not replicate: %v", err)
	}
	if _, err := a.r.Exchange(ctx, other.peer, []uint16{0}, Options{}); !errors.Is(err, ErrTreeSize) {
		t.Errorf("exchange with a peer of other tree size: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := a.r.Exchange(cancelled, b.peer, []uint16{0}, Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("exchange with a cancelled context: %v", err)
	}
	a.r.Remove(1)
	if a.r.Tree(1) != nil {
		t.Fatal("Remove left the tree")
	}
	if _, err := a.r.Exchange(ctx, other.peer, []uint16{1}, Options{}); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("exchange of a removed partition: %v", err)
	}
	// A removed partition's tree no longer follows writes.
	mergeAll(t, a.store, 1, newTask(9))
	if err := a.r.Add(1); err != nil {
		t.Fatal(err)
	}
	if a.r.Tree(1).Root() != Hash(9, newTask(9).Digest()) {
		t.Fatal("a tree added again did not load the partition")
	}
}

// TestExchangeBadPeer: answers that do not fit the request are errors,
// not panics, and nothing wrong is merged.
func TestExchangeBadPeer(t *testing.T) {
	tests := []struct {
		name   string
		tamper func(proto.Message)
	}{
		{"roots missing", func(m proto.Message) {
			if r, ok := m.(*nornv1.TreeRootsResponse); ok {
				r.Roots = nil
			}
		}},
		{"roots extra", func(m proto.Message) {
			if r, ok := m.(*nornv1.TreeRootsResponse); ok {
				r.Roots = append(r.Roots, 1)
			}
		}},
		{"hashes short", func(m proto.Message) {
			if r, ok := m.(*nornv1.TreeNodesResponse); ok && len(r.Hashes) > 1 {
				r.Hashes = r.Hashes[:1]
			}
		}},
		{"digests short", func(m proto.Message) {
			if r, ok := m.(*nornv1.SegmentEntriesResponse); ok {
				r.Digests = r.Digests[:len(r.Digests)-1]
			}
		}},
		{"read short", func(m proto.Message) {
			if r, ok := m.(*nornv1.ReadResponse); ok {
				r.Tasks = r.Tasks[:len(r.Tasks)-1]
			}
		}},
		{"read other id", func(m proto.Message) {
			if r, ok := m.(*nornv1.ReadResponse); ok {
				for _, rt := range r.Tasks {
					if len(rt.State) > 0 {
						rt.State = newTask(777).Encode()
					}
				}
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newSide(t, sideConfig{}, 0), newSide(t, sideConfig{}, 0)
			mergeAll(t, a.store, 0, newTask(1))
			mergeAll(t, b.store, 0, newTask(2))
			b.peer.tamper = tc.tamper
			if _, err := a.r.Exchange(context.Background(), b.peer, []uint16{0}, Options{}); err == nil {
				t.Fatal("no error")
			}
			if got := stored(t, a.store, 0); len(got) != 1 {
				t.Fatalf("A holds %d tasks after a bad answer", len(got))
			}
		})
	}
}
