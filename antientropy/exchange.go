package antientropy

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// Peer is the other replica of an exchange: the node reaches it over
// PeerService; tests call another Replica directly.
type Peer interface {
	TreeRoots(ctx context.Context, req *nornv1.TreeRootsRequest) (*nornv1.TreeRootsResponse, error)
	TreeNodes(ctx context.Context, req *nornv1.TreeNodesRequest) (*nornv1.TreeNodesResponse, error)
	SegmentEntries(ctx context.Context, req *nornv1.SegmentEntriesRequest) (*nornv1.SegmentEntriesResponse, error)
	// ReadStates returns the peer's states of ids of partition p, in
	// order (nil where it has none), and the bytes the answer took.
	ReadStates(ctx context.Context, p uint16, ids []uint64) ([]*crdt.Task, int, error)
	// Push merges states of partition p into the peer's replica (synced
	// before it returns), and returns the bytes the request took.
	Push(ctx context.Context, p uint16, tasks []*crdt.Task) (int, error)
}

// Options tune one exchange.
type Options struct {
	// Settle: when segments differ, wait this long and compare their
	// entries again; only tasks that differ both times are transferred,
	// so writes in flight to both replicas are not mistaken for
	// differences. 0 compares once.
	Settle time.Duration
	// Pace, if set, is called before each call to the peer with the
	// bytes about to be sent or expected (a rate limit); its error stops
	// the exchange.
	Pace func(ctx context.Context, bytes int) error
}

// Stats is what one exchange did.
type Stats struct {
	Partitions int // partitions compared
	Differing  int // partitions whose roots differed
	Leaves     int // differing leaves (segments groups) found
	Pushed     int // task states sent to the peer
	Pulled     int // task states received and merged here
	BytesSent  int // request bytes (protobuf sizes)
	BytesRecv  int // response bytes
	// Converged lists the partitions whose roots were equal at the start
	// or after the transfer.
	Converged []uint16
}

// rootsRequest is the TreeRoots request of a round over parts.
func (r *Replica) rootsRequest(parts []uint16) *nornv1.TreeRootsRequest {
	mine, version := r.horizons()
	req := &nornv1.TreeRootsRequest{DeleteHorizonMs: mine.Default, QueueDeleteHorizonsMs: mine.Queues, QueuesVersion: version, LeafBits: uint32(r.leafBits)}
	for _, p := range parts {
		req.Partitions = append(req.Partitions, uint32(p))
	}
	return req
}

// Exchange reconciles partitions parts between this replica and peer: one
// TreeRoots call for all of them, then, for each partition whose roots
// differ, a descent to the differing leaves, a comparison of their
// (id, digest) entries and the transfer of exactly the differing tasks in
// both directions (pull and merge here, then push the joined state). The
// cost grows with the difference, not with the data.
func (r *Replica) Exchange(ctx context.Context, peer Peer, parts []uint16, opt Options) (Stats, error) {
	var st Stats
	if len(parts) == 0 {
		return st, nil
	}
	req := r.rootsRequest(parts)
	version := req.QueuesVersion
	trees := make([]*Tree, len(parts))
	for i, p := range parts {
		if trees[i] = r.Tree(p); trees[i] == nil {
			return st, fmt.Errorf("partition %d: %w", p, ErrNotReplicated)
		}
	}
	resp, err := call(ctx, &st, opt, req, peer.TreeRoots)
	if err != nil {
		return st, err
	}
	if len(resp.Roots) != len(parts) {
		return st, fmt.Errorf("antientropy: TreeRoots answered %d roots for %d partitions", len(resp.Roots), len(parts))
	}
	// Both sides delete what is past the agreed horizon before comparing.
	if _, err := r.agree(parts, storage.Horizons{Default: resp.DeleteHorizonMs, Queues: resp.QueueDeleteHorizonsMs}, version); err != nil {
		return st, err
	}
	st.Partitions = len(parts)
	// First comparison of every differing partition, then one settle wait
	// for all of them (not one per partition: after a restart most of
	// them differ), then the second comparison and the transfer.
	var pending []*partitionDiff
	for i, p := range parts {
		if trees[i].Root() == resp.Roots[i] {
			st.Converged = append(st.Converged, p)
			continue
		}
		st.Differing++
		d := &partitionDiff{p: p, t: trees[i]}
		if err := r.compare(ctx, &st, peer, d, opt); err != nil {
			return st, fmt.Errorf("partition %d: %w", p, err)
		}
		pending = append(pending, d)
	}
	if opt.Settle > 0 && slices.ContainsFunc(pending, func(d *partitionDiff) bool { return len(d.ids) > 0 }) {
		select {
		case <-ctx.Done():
			return st, ctxErr(ctx)
		case <-time.After(opt.Settle):
		}
		for _, d := range pending {
			if len(d.ids) == 0 {
				continue
			}
			again, err := r.differingIDs(ctx, &st, peer, d.p, d.t, d.leaves, opt)
			if err != nil {
				return st, fmt.Errorf("partition %d: %w", d.p, err)
			}
			d.ids = intersect(d.ids, again)
		}
	}
	for _, d := range pending {
		if err := r.finish(ctx, &st, peer, d, opt); err != nil {
			return st, fmt.Errorf("partition %d: %w", d.p, err)
		}
	}
	return st, nil
}

// partitionDiff is one differing partition during an exchange.
type partitionDiff struct {
	p      uint16
	t      *Tree
	leaves []uint32 // differing leaves
	ids    []uint64 // ids whose entries differ, sorted
}

// compare finds d's differing leaves and the ids under them that differ.
func (r *Replica) compare(ctx context.Context, st *Stats, peer Peer, d *partitionDiff, opt Options) error {
	leaves, err := r.differingLeaves(ctx, st, peer, d.p, d.t, opt)
	if err != nil || len(leaves) == 0 {
		return err
	}
	d.leaves = leaves
	st.Leaves += len(leaves)
	d.ids, err = r.differingIDs(ctx, st, peer, d.p, d.t, leaves, opt)
	return err
}

// finish transfers d's differing tasks and checks whether the roots now
// agree.
func (r *Replica) finish(ctx context.Context, st *Stats, peer Peer, d *partitionDiff, opt Options) error {
	if err := r.transfer(ctx, st, peer, d.p, d.ids, opt); err != nil {
		return err
	}
	if d.t.Root() != 0 || len(d.ids) > 0 {
		// A cheap check: one more TreeNodes for the root.
		resp, err := call(ctx, st, opt, &nornv1.TreeNodesRequest{Partition: uint32(d.p), Level: 0, Nodes: []uint32{0}}, peer.TreeNodes)
		if err == nil && len(resp.Hashes) == 1 && resp.Hashes[0] == d.t.Root() {
			st.Converged = append(st.Converged, d.p)
		}
	}
	return nil
}

// differingLeaves descends from the root, one TreeNodes call per level,
// to the leaves whose hashes differ.
func (r *Replica) differingLeaves(ctx context.Context, st *Stats, peer Peer, p uint16, t *Tree, opt Options) ([]uint32, error) {
	diff := []uint32{0} // level 0: the root differed
	for l := 0; l < t.Levels()-1 && len(diff) > 0; l++ {
		var idx []uint32
		for _, i := range diff {
			lo, hi := t.Children(l, i)
			for c := lo; c < hi; c++ {
				idx = append(idx, c)
			}
		}
		var next []uint32
		for chunk := range slices.Chunk(idx, MaxNodesPerCall) {
			resp, err := call(ctx, st, opt, &nornv1.TreeNodesRequest{Partition: uint32(p), Level: uint32(l + 1), Nodes: chunk}, peer.TreeNodes)
			if err != nil {
				return nil, err
			}
			mine, err := t.Nodes(l+1, chunk)
			if err != nil {
				return nil, err
			}
			if len(resp.Hashes) != len(chunk) {
				return nil, fmt.Errorf("antientropy: TreeNodes answered %d hashes for %d nodes", len(resp.Hashes), len(chunk))
			}
			for k, h := range resp.Hashes {
				if h != mine[k] {
					next = append(next, chunk[k])
				}
			}
		}
		diff = next
	}
	return diff, nil
}

// differingIDs compares the entries under leaves and returns the ids whose
// digests differ or that one side lacks, in id order.
func (r *Replica) differingIDs(ctx context.Context, st *Stats, peer Peer, p uint16, t *Tree, leaves []uint32, opt Options) ([]uint64, error) {
	theirs := map[uint64]uint64{}
	for chunk := range slices.Chunk(leaves, MaxLeavesPerCall) {
		resp, err := call(ctx, st, opt, &nornv1.SegmentEntriesRequest{Partition: uint32(p), Leaves: chunk}, peer.SegmentEntries)
		if err != nil {
			return nil, err
		}
		if len(resp.Ids) != len(resp.Digests) {
			return nil, fmt.Errorf("antientropy: SegmentEntries answered %d ids and %d digests", len(resp.Ids), len(resp.Digests))
		}
		for i, id := range resp.Ids {
			theirs[id] = resp.Digests[i]
		}
	}
	mine, err := r.localEntries(p, t, leaves)
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for id, d := range mine {
		if od, ok := theirs[id]; !ok || od != d {
			ids = append(ids, id)
		}
	}
	for id := range theirs {
		if _, ok := mine[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// transfer pulls the peer's states of ids and merges them here, then
// pushes this replica's (joined) states of ids to the peer, except those
// equal to the state the peer sent.
func (r *Replica) transfer(ctx context.Context, st *Stats, peer Peer, p uint16, ids []uint64, opt Options) error {
	for chunk := range slices.Chunk(ids, MaxStatesPerCall) {
		if err := pace(ctx, opt, 8*len(chunk)); err != nil {
			return err
		}
		theirs, n, err := peer.ReadStates(ctx, p, chunk)
		st.BytesSent += 8 * len(chunk)
		st.BytesRecv += n
		if err != nil {
			return err
		}
		// The states' size is known only now: charge it (the next call
		// waits it out).
		if err := pace(ctx, opt, n); err != nil {
			return err
		}
		if len(theirs) != len(chunk) {
			return fmt.Errorf("antientropy: read %d states for %d ids", len(theirs), len(chunk))
		}
		var got []*crdt.Task
		peerHas := make(map[uint64]uint64, len(chunk)) // id -> digest of the peer's state
		for i, t := range theirs {
			if t == nil {
				continue
			}
			if t.ID != chunk[i] {
				return fmt.Errorf("antientropy: read state of id %d for id %d", t.ID, chunk[i])
			}
			got = append(got, t)
			peerHas[t.ID] = t.Digest()
		}
		if len(got) > 0 {
			if err := r.merge(p, got); err != nil {
				return err
			}
			st.Pulled += len(got)
		}
		states, err := r.states(p, chunk)
		if err != nil {
			return err
		}
		// Push only what the peer lacks: a joined state equal to the one
		// it sent (its state held ours) would change nothing there.
		var mine []*crdt.Task
		for _, t := range states {
			if d, ok := peerHas[t.ID]; !ok || d != t.Digest() {
				mine = append(mine, t)
			}
		}
		if len(mine) == 0 {
			continue
		}
		n, err = peer.Push(ctx, p, mine)
		st.BytesSent += n
		if err != nil {
			return err
		}
		st.Pushed += len(mine)
		if err := pace(ctx, opt, n); err != nil {
			return err
		}
	}
	return nil
}

// call sends one request to the peer, pacing and counting the bytes of
// the request (before) and of the answer (after).
func call[Req, Resp proto.Message](ctx context.Context, st *Stats, opt Options, req Req, fn func(context.Context, Req) (Resp, error)) (Resp, error) {
	n := proto.Size(req)
	if err := pace(ctx, opt, n); err != nil {
		var zero Resp
		return zero, err
	}
	st.BytesSent += n
	resp, err := fn(ctx, req)
	if err != nil {
		return resp, err
	}
	m := proto.Size(resp)
	st.BytesRecv += m
	// The answer's size is known only now: charge it too.
	return resp, pace(ctx, opt, m)
}

func pace(ctx context.Context, opt Options, n int) error {
	if opt.Pace == nil {
		return ctxErr(ctx)
	}
	return opt.Pace(ctx, n)
}

// intersect returns the ids in both sorted lists.
func intersect(a, b []uint64) []uint64 {
	var out []uint64
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch {
		case a[i] == b[j]:
			out = append(out, a[i])
			i++
			j++
		case a[i] < b[j]:
			i++
		default:
			j++
		}
	}
	return out
}
