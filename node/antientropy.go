package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/time/rate"

	"github.com/norn-dev/norn/antientropy"
	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/rebalance"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/transport"
)

// aeStats are the node's anti-entropy counters (metrics.go).
type aeStats struct {
	exchanges, failures  atomic.Uint64
	differing, leaves    atomic.Uint64
	pushed, pulled       atomic.Uint64
	bytesSent, bytesRecv atomic.Uint64

	mu        sync.Mutex
	converged map[uint16]time.Time // last exchange that found (or left) a partition's replicas equal

	// rounds numbers the exchanges this node starts; exchanged[p][peer]
	// is the number of the last one with peer that covered partition p
	// and completed (a move's target is filled once it exchanged with
	// the move's sources in a round that started after the ring named
	// it: ReplicaProgress).
	rounds    atomic.Uint64
	exchanged map[uint16]map[string]uint64
}

// completed records that round (with peer, over parts) completed.
func (s *aeStats) completed(round uint64, peer string, parts []uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exchanged == nil {
		s.exchanged = map[uint16]map[string]uint64{}
	}
	for _, p := range parts {
		m := s.exchanged[p]
		if m == nil {
			m = map[string]uint64{}
			s.exchanged[p] = m
		}
		m[peer] = max(m[peer], round)
	}
}

// filledFrom reports whether partition p was exchanged with every one of
// peers in a round numbered above after.
func (s *aeStats) filledFrom(p uint16, peers []string, after uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, peer := range peers {
		if s.exchanged[p][peer] <= after {
			return false
		}
	}
	return true
}

// forget drops partition p's exchange records (its replica is dropped).
func (s *aeStats) forget(p uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.exchanged, p)
}

func (s *aeStats) record(st antientropy.Stats, err error, now time.Time) {
	s.exchanges.Add(1)
	if err != nil {
		s.failures.Add(1)
	}
	s.differing.Add(uint64(st.Differing))
	s.leaves.Add(uint64(st.Leaves))
	s.pushed.Add(uint64(st.Pushed))
	s.pulled.Add(uint64(st.Pulled))
	s.bytesSent.Add(uint64(st.BytesSent))
	s.bytesRecv.Add(uint64(st.BytesRecv))
	s.mu.Lock()
	if s.converged == nil {
		s.converged = map[uint16]time.Time{}
	}
	for _, p := range st.Converged {
		s.converged[p] = now
	}
	s.mu.Unlock()
}

// newAntiEntropy builds the node's anti-entropy replica (trees are added
// with the partition groups).
func (n *Node) newAntiEntropy() (*antientropy.Replica, error) {
	return antientropy.NewReplica(antientropy.ReplicaConfig{
		Store:    n.store,
		LeafBits: n.cfg.TreeLeafBits,
		Horizon:  n.retentionHorizon,
		Expire:   n.expireBefore,
		Merge: func(_ uint16, tasks []*crdt.Task) error {
			return n.coord.MergeLocal(tasks)
		},
	})
}

// retentionHorizon is now minus the retention (Unix ms): terminal tasks
// older than that are deleted.
func (n *Node) retentionHorizon() int64 {
	return n.cfg.Clock.Now().Add(-n.cfg.Retention).UnixMilli()
}

// expireBefore deletes partition p's terminal tasks older than ms. On the
// partition's leader the claim FSM forgets their records first, through
// Raft; other replicas delete their task states alone.
func (n *Node) expireBefore(p uint16, ms int64) error {
	var forget func([]uint64) error
	if g := n.host.Group(p); g != nil && g.IsLeader() {
		forget = func(ids []uint64) error {
			cmd := &claims.Command{Op: claims.OpForget, NowMs: n.cfg.Clock.Now().UnixMilli(), IDs: ids}
			if _, err := g.Propose(cmd, replicas.ProposeTimeout); err != nil {
				return fmt.Errorf("forgetting expired tasks: %w", err)
			}
			return nil
		}
	}
	_, err := n.store.DeleteTerminalBefore(p, ms, monitorBatch, forget)
	return err
}

// antiEntropyLoop exchanges, with every other node, the partitions both
// replicate: one round per peer every AntiEntropyInterval (a fifth of it
// after a round that found differences, and right away when the node
// starts or its partitions change), jittered, until Close.
func (n *Node) antiEntropyLoop() {
	defer n.stopped.Done()
	limiter := n.aeLimiter
	next := map[string]time.Time{} // peer id -> when its next round is due
	timer := time.NewTimer(time.Second)
	defer timer.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-n.aeKick:
			clear(next)
		case <-timer.C:
		}
		r := n.host.Ring()
		soonest := n.cfg.AntiEntropyInterval
		if r != nil {
			now := time.Now()
			for _, peerID := range n.aePeers(r) {
				due, ok := next[peerID]
				if ok && now.Before(due) {
					soonest = min(soonest, due.Sub(now))
					continue
				}
				differed := n.exchangeWith(r, peerID, limiter)
				wait := n.cfg.AntiEntropyInterval
				if differed {
					wait /= 5
				}
				wait = jitter(wait)
				next[peerID] = time.Now().Add(wait)
				soonest = min(soonest, wait)
			}
		}
		timer.Reset(max(soonest, 10*time.Millisecond))
	}
}

// kickAntiEntropy asks for a round with every peer now (never blocks).
func (n *Node) kickAntiEntropy() {
	select {
	case n.aeKick <- struct{}{}:
	default:
	}
}

// jitter spreads d by ±20%.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

// aePeers returns the other ring nodes that share a partition with this
// node (a move's target included), in id order.
func (n *Node) aePeers(r *cluster.Ring) []string {
	seen := map[string]bool{}
	for p := range r.Partitions {
		cohort := r.Replicas(p)
		if !slices.Contains(cohort, ring.NodeID(n.cfg.NodeID)) {
			continue
		}
		for _, id := range cohort {
			if string(id) != n.cfg.NodeID {
				seen[string(id)] = true
			}
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// sharedPartitions returns the partitions this node and peerID both
// replicate and this node has a tree of, except a partition whose move
// fills one of them: its fill (a dedicated exchange with each source)
// copies it, and a round on top would compare and send the same tasks
// again.
func (n *Node) sharedPartitions(r *cluster.Ring, peerID string) []uint16 {
	var parts []uint16
	moving := r.MovesUnderway()
	for p := range r.Partitions {
		if r.HostsReplica(p, n.cfg.NodeID) && r.HostsReplica(p, peerID) && n.ae.Tree(uint16(p)) != nil {
			if m := moving[p]; m != nil && m.State == cluster.MoveFilling && (m.To == n.cfg.NodeID || m.To == peerID) {
				continue
			}
			parts = append(parts, uint16(p))
		}
	}
	return parts
}

// exchangeWith runs one anti-entropy round with peerID, if it is up. It
// reports whether any partition differed, or the peer was not ready (the
// next round comes sooner either way).
func (n *Node) exchangeWith(r *cluster.Ring, peerID string, limiter *rate.Limiter) bool {
	if !n.host.Up(peerID) {
		return false
	}
	parts := n.sharedPartitions(r, peerID)
	if len(parts) == 0 {
		return false
	}
	differed, _ := n.exchange(r, peerID, parts, limiter, n.cfg.AntiEntropyTimeout)
	return differed
}

// fillTimeout bounds one fill exchange: a fill copies a whole partition
// (a million tasks take minutes on a loaded node), and a fill cut short
// starts its comparison over.
const fillTimeout = 30 * time.Minute

// exchange runs one anti-entropy exchange of parts with peerID, within
// timeout. It reports whether a partition differed or the peer was not
// ready, and the exchange's error.
func (n *Node) exchange(r *cluster.Ring, peerID string, parts []uint16, limiter *rate.Limiter, timeout time.Duration) (bool, error) {
	nd, ok := r.Node(peerID)
	if !ok {
		return false, fmt.Errorf("node %s is not in the ring", peerID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	go func() {
		select {
		case <-n.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	opt := antientropy.Options{
		Settle: n.cfg.AntiEntropySettle,
		Pace: func(ctx context.Context, bytes int) error {
			return limiter.WaitN(ctx, min(max(bytes, 1), limiter.Burst()))
		},
	}
	round := n.aeStats.rounds.Add(1)
	st, err := n.ae.Exchange(ctx, &aePeer{n: n, p: n.peers.Get(nd.APIAddr)}, parts, opt)
	n.aeStats.record(st, err, time.Now())
	if err == nil {
		n.aeStats.completed(round, peerID, parts)
	}
	switch {
	case err == nil || errors.Is(err, context.Canceled):
	case connect.CodeOf(err) == connect.CodeUnavailable, errors.Is(err, antientropy.ErrNotReplicated),
		connect.CodeOf(err) == connect.CodeFailedPrecondition && strings.Contains(err.Error(), antientropy.ErrNotReplicated.Error()):
		// The peer is starting, or has not adopted the ring yet (a
		// partition moves): a round soon will do.
		n.cfg.Logger.Info("anti-entropy peer not ready", "peer", peerID, "err", err)
		return true, err
	default:
		n.cfg.Logger.Warn("anti-entropy exchange failed", "peer", peerID, "err", err)
	}
	if st.Pushed+st.Pulled > 0 {
		n.cfg.Logger.Info("anti-entropy repaired replicas", "peer", peerID, "partitions", st.Differing,
			"pushed", st.Pushed, "pulled", st.Pulled)
	}
	return st.Differing > 0, err
}

// fill exchanges partition p with each of sources in a round of its own,
// retrying each until it completes, the replica is dropped or the node
// closes: a move's target is filled at once instead of waiting for its
// rounds with every peer (ReplicaProgress starts it). One fill per
// partition runs at a time.
func (n *Node) fill(p uint16, sources []string) {
	n.fillMu.Lock()
	if n.filling[p] {
		n.fillMu.Unlock()
		return
	}
	n.filling[p] = true
	n.fillMu.Unlock()
	n.stopped.Add(1)
	go func() {
		defer n.stopped.Done()
		defer func() {
			n.fillMu.Lock()
			delete(n.filling, p)
			n.fillMu.Unlock()
		}()
		for _, src := range sources {
			for {
				r := n.host.Ring()
				if n.host.Group(p) == nil || !n.host.Up(src) {
					return
				}
				round := n.aeStats.rounds.Add(1)
				if _, err := n.exchange(r, src, []uint16{p}, n.fillLimiter, fillTimeout); err == nil {
					n.aeStats.completed(round, src, []uint16{p})
					break
				}
				select {
				case <-n.stop:
					return
				case <-time.After(rebalance.MovePoll):
				}
			}
		}
	}()
}

// aePeer is antientropy.Peer over PeerService.
type aePeer struct {
	n *Node
	p *transport.Peer
}

func (a *aePeer) TreeRoots(ctx context.Context, req *nornv1.TreeRootsRequest) (*nornv1.TreeRootsResponse, error) {
	return transport.Unary(ctx, a.n.peers, req, a.p.Peer.TreeRoots)
}

func (a *aePeer) TreeNodes(ctx context.Context, req *nornv1.TreeNodesRequest) (*nornv1.TreeNodesResponse, error) {
	return transport.Unary(ctx, a.n.peers, req, a.p.Peer.TreeNodes)
}

func (a *aePeer) SegmentEntries(ctx context.Context, req *nornv1.SegmentEntriesRequest) (*nornv1.SegmentEntriesResponse, error) {
	return transport.Unary(ctx, a.n.peers, req, a.p.Peer.SegmentEntries)
}

func (a *aePeer) ReadStates(ctx context.Context, _ uint16, ids []uint64) ([]*crdt.Task, int, error) {
	resp, err := a.p.Peer.Read(ctx, transport.Request(a.n.peers, &nornv1.ReadRequest{Ids: ids}))
	if err != nil {
		return nil, 0, err
	}
	if len(resp.Msg.Tasks) != len(ids) {
		return nil, 0, fmt.Errorf("read %d answers for %d ids", len(resp.Msg.Tasks), len(ids))
	}
	out := make([]*crdt.Task, len(ids))
	bytes := 0
	for i, rt := range resp.Msg.Tasks {
		bytes += len(rt.State)
		if len(rt.State) == 0 {
			continue
		}
		t, err := crdt.Decode(rt.State)
		if err == nil {
			err = t.Validate(a.n.cfg.Limits)
		}
		if err != nil {
			return nil, bytes, fmt.Errorf("state of %d from %s: %w", ids[i], a.p.Addr, err)
		}
		out[i] = t
	}
	return out, bytes, nil
}

func (a *aePeer) Push(ctx context.Context, _ uint16, tasks []*crdt.Task) (int, error) {
	req := &nornv1.ReplicateRequest{Tasks: make([][]byte, len(tasks))}
	bytes := 0
	for i, t := range tasks {
		req.Tasks[i] = t.Encode()
		bytes += len(req.Tasks[i])
	}
	_, err := a.p.Peer.Replicate(ctx, transport.Request(a.n.peers, req))
	return bytes, err
}

// serveAE answers one anti-entropy call of a peer with serve, mapping its
// errors: a partition not replicated here or trees of another size are
// FAILED_PRECONDITION, other refusals INVALID_ARGUMENT; connect errors
// pass as they are.
func serveAE[Req, Resp any](n *Node, req *connect.Request[Req], serve func(*Req) (*Resp, error)) (*connect.Response[Resp], error) {
	if err := n.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	resp, err := serve(req.Msg)
	var ce *connect.Error
	switch {
	case err == nil:
		return connect.NewResponse(resp), nil
	case errors.As(err, &ce):
		return nil, err
	case errors.Is(err, antientropy.ErrNotReplicated), errors.Is(err, antientropy.ErrTreeSize):
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
}

func (s peerService) TreeRoots(_ context.Context, req *connect.Request[nornv1.TreeRootsRequest]) (*connect.Response[nornv1.TreeRootsResponse], error) {
	return serveAE(s.n, req, func(m *nornv1.TreeRootsRequest) (*nornv1.TreeRootsResponse, error) {
		if s.n.host.Ring() == nil {
			return nil, apierr.NotFormed
		}
		return s.n.ae.ServeTreeRoots(m)
	})
}

func (s peerService) TreeNodes(_ context.Context, req *connect.Request[nornv1.TreeNodesRequest]) (*connect.Response[nornv1.TreeNodesResponse], error) {
	return serveAE(s.n, req, s.n.ae.ServeTreeNodes)
}

func (s peerService) SegmentEntries(_ context.Context, req *connect.Request[nornv1.SegmentEntriesRequest]) (*connect.Response[nornv1.SegmentEntriesResponse], error) {
	return serveAE(s.n, req, s.n.ae.ServeSegmentEntries)
}

// aeTrees is replicas.Trees over the node's anti-entropy replica.
type aeTrees struct{ n *Node }

func (t aeTrees) Add(p uint16) error { return t.n.ae.Add(p) }

func (t aeTrees) Remove(p uint16) {
	t.n.ae.Remove(p)
	t.n.aeStats.forget(p)
}

// aeFills is rebalance.Fills over the node's anti-entropy: a move's
// target reports its fill (ReplicaProgress).
type aeFills struct{ n *Node }

func (f aeFills) Round() uint64 { return f.n.aeStats.rounds.Load() }

func (f aeFills) FilledFrom(p uint16, sources []string, after uint64) bool {
	return f.n.aeStats.filledFrom(p, sources, after)
}

func (f aeFills) Fill(p uint16, sources []string) { f.n.fill(p, sources) }
