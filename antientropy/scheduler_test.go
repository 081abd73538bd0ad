package antientropy

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/ring"
)

// newScheduler returns a Scheduler of node "a" with trees of parts (not
// started: no rounds run).
func newScheduler(t *testing.T, parts ...uint16) *Scheduler {
	t.Helper()
	s, err := New(Config{NodeID: "a", Replica: ReplicaConfig{Store: openStore(t), Horizon: func() int64 { return t0 }}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if err := s.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// TestSharedPeersAndPartitions: a round with a peer covers the partitions
// both replicate (a move's target included) that have a tree here, except
// one whose move fills either side.
func TestSharedPeersAndPartitions(t *testing.T) {
	r := &cluster.Ring{ClusterID: "c", Epoch: 2, Partitions: 4, Replication: 2,
		Nodes: []cluster.RingNode{{ID: "a"}, {ID: "b"}, {ID: "c"}, {ID: "d"}},
		Placement: ring.Placement{Cohorts: [][]ring.NodeID{
			{"a", "b"}, // shared with b
			{"b", "c"}, // moving b -> a, filling a
			{"c", "d"}, // moving c -> a, catching up: a hosts it
			{"a", "c"}, // shared with c, no tree here
		}},
		Moves: []cluster.Move{
			{Partition: 1, From: "b", To: "a", State: cluster.MoveFilling},
			{Partition: 2, From: "c", To: "a", State: cluster.MoveCatchingUp},
		},
	}
	s := newScheduler(t, 0, 1, 2)
	if got, want := s.SharedPeers(r), []string{"b", "c", "d"}; !slices.Equal(got, want) {
		t.Fatalf("SharedPeers = %v, want %v", got, want)
	}
	for peer, want := range map[string][]uint16{"b": {0}, "c": {2}, "d": {2}, "e": nil} {
		if got := s.SharedPartitions(r, peer); !slices.Equal(got, want) {
			t.Errorf("SharedPartitions(%s) = %v, want %v", peer, got, want)
		}
	}
}

// TestFilledFrom: a partition is filled from its sources once a round
// numbered above the given one completed with each; dropping its tree
// forgets the rounds.
func TestFilledFrom(t *testing.T) {
	s := newScheduler(t, 3)
	s.stats.completed(s.stats.rounds.Add(1), "b", []uint16{3})
	after := s.Rounds()
	s.stats.completed(s.stats.rounds.Add(1), "b", []uint16{3})
	if !s.FilledFrom(3, []string{"b"}, after) {
		t.Fatal("not filled from b after round 2")
	}
	if s.FilledFrom(3, []string{"b", "c"}, after) || s.FilledFrom(3, []string{"b"}, after+1) {
		t.Fatal("filled without a round with c, or before the round")
	}
	s.Remove(3)
	if s.FilledFrom(3, []string{"b"}, after) || s.Tree(3) != nil {
		t.Fatal("a removed partition is still filled or has a tree")
	}
}

// TestServeCodes: the Serve methods answer a partition not replicated
// here or trees of another size with FAILED_PRECONDITION, other refusals
// with INVALID_ARGUMENT.
func TestServeCodes(t *testing.T) {
	s := newScheduler(t, 0)
	lb := uint32(s.LeafBits())
	for _, tc := range []struct {
		name string
		call func() error
		code connect.Code
	}{
		{"roots of an unknown partition", func() error {
			_, err := s.ServeTreeRoots(&nornv1.TreeRootsRequest{LeafBits: lb, Partitions: []uint32{1}})
			return err
		}, connect.CodeFailedPrecondition},
		{"roots of another size", func() error {
			_, err := s.ServeTreeRoots(&nornv1.TreeRootsRequest{LeafBits: lb - 1, Partitions: []uint32{0}})
			return err
		}, connect.CodeFailedPrecondition},
		{"no partitions", func() error {
			_, err := s.ServeTreeRoots(&nornv1.TreeRootsRequest{LeafBits: lb})
			return err
		}, connect.CodeInvalidArgument},
		{"nodes of an unknown partition", func() error {
			_, err := s.ServeTreeNodes(&nornv1.TreeNodesRequest{Partition: 1, Nodes: []uint32{0}})
			return err
		}, connect.CodeFailedPrecondition},
		{"no nodes", func() error {
			_, err := s.ServeTreeNodes(&nornv1.TreeNodesRequest{Partition: 0})
			return err
		}, connect.CodeInvalidArgument},
		{"no leaves", func() error {
			_, err := s.ServeSegmentEntries(&nornv1.SegmentEntriesRequest{Partition: 0})
			return err
		}, connect.CodeInvalidArgument},
	} {
		if err := tc.call(); connect.CodeOf(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
	}
	if _, err := s.ServeTreeRoots(&nornv1.TreeRootsRequest{LeafBits: lb, Partitions: []uint32{0}}); err != nil {
		t.Fatalf("roots of partition 0: %v", err)
	}
	// A connect error passes as it is.
	ce := connect.NewError(connect.CodeUnavailable, errors.New("not formed"))
	if _, err := answer(&nornv1.TreeRootsRequest{}, func(*nornv1.TreeRootsRequest) (*nornv1.TreeRootsResponse, error) {
		return nil, fmt.Errorf("wrapped: %w", ce)
	}); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("connect error: %v", err)
	}
}
