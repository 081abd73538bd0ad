package antientropy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/transport"
)

// Host is what a Scheduler reads of the node's place in the cluster: the
// ring, which nodes are alive and which partition replicas are open here
// (replicas.Host, with the last over its groups).
type Host interface {
	// Ring is the ring this node works with, nil before the cluster is
	// formed. The caller must not modify it.
	Ring() *cluster.Ring
	// Up reports whether gossip sees node id alive or suspect.
	Up(id string) bool
	// Replicates reports whether partition p's replica is open on this
	// node (its group runs here).
	Replicates(p uint16) bool
}

// Config configures a Scheduler. The node's Config documents the shared
// fields (units, defaults); New applies none of its own beyond the
// Replica's.
type Config struct {
	NodeID string
	// Replica configures the node's Replica (trees and exchanges). Its
	// Merge is how pulled states enter the store: the node's merges also
	// tell the claim side (a terminal event ends a claim on the leader).
	Replica ReplicaConfig
	// Interval is the time between two rounds with a peer (a fifth of it
	// after a round that found differences), Timeout bounds one round,
	// Settle is every round's Options.Settle.
	Interval, Timeout, Settle time.Duration
	// Rate bounds the bytes per second the rounds send and ask for (all
	// peers together), FillRate the fills' of moves to this node.
	Rate, FillRate int
	// Limits validates the states read from peers.
	Limits crdt.Limits
	// Peers reaches the other nodes' PeerService.
	Peers  *transport.Peers
	Logger *slog.Logger
	// Tracer, when set, traces every round and fill (SpanRound); its
	// PeerService calls are the span's children when Peers traces them.
	// Nil: no spans.
	Tracer trace.Tracer
}

// SpanRound is one anti-entropy exchange with one peer, a round or a
// move's fill (docs/OPERATIONS.md, Tracing): a root span, as rounds are
// no request's. Attributes norn.peer, norn.partitions, norn.fill, and at
// the end norn.differing, norn.pushed, norn.pulled.
const SpanRound = "norn.antientropy.round"

// The attributes of SpanRound.
const (
	AttrPeer       = attribute.Key("norn.peer")
	AttrPartitions = attribute.Key("norn.partitions")
	AttrFill       = attribute.Key("norn.fill")
	AttrDiffering  = attribute.Key("norn.differing")
	AttrPushed     = attribute.Key("norn.pushed")
	AttrPulled     = attribute.Key("norn.pulled")
)

// Scheduler is this node's anti-entropy: its Replica (a Merkle tree per
// partition replicated here), the rounds with every peer that shares
// partitions with it, paced by one token bucket, the fills of partitions
// moving to this node, and the answers to the peers' rounds.
type Scheduler struct {
	cfg     Config
	replica *Replica
	host    Host // set by Start
	stats   roundStats
	kick    chan struct{}
	// limiter paces the rounds' bytes, fillLimiter the fills' of moves
	// to this node.
	limiter, fillLimiter *rate.Limiter
	// filling marks the partitions with a fill under way.
	fillMu  sync.Mutex
	filling map[uint16]bool

	stop     chan struct{}
	stopOnce sync.Once
	stopped  sync.WaitGroup
}

// New returns a Scheduler with no partitions; Start begins its rounds.
func New(cfg Config) (*Scheduler, error) {
	r, err := NewReplica(cfg.Replica)
	if err != nil {
		return nil, err
	}
	return &Scheduler{
		cfg:         cfg,
		replica:     r,
		kick:        make(chan struct{}, 1),
		limiter:     rate.NewLimiter(rate.Limit(cfg.Rate), max(cfg.Rate, 1<<20)),
		fillLimiter: rate.NewLimiter(rate.Limit(cfg.FillRate), max(cfg.FillRate, 1<<20)),
		filling:     map[uint16]bool{},
		stop:        make(chan struct{}),
	}, nil
}

// Start begins the rounds with the peers host shows, until Close.
func (s *Scheduler) Start(host Host) {
	s.host = host
	s.stopped.Add(1)
	go s.loop()
}

// Close stops the rounds and the fills and waits for them to end.
func (s *Scheduler) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.stopped.Wait()
}

// Add builds partition p's tree when its replica opens
// (replicas.Config.Trees).
func (s *Scheduler) Add(p uint16) error { return s.replica.Add(p) }

// Remove forgets partition p's tree and its exchange records when its
// replica closes or is dropped (replicas.Config.Trees).
func (s *Scheduler) Remove(p uint16) {
	s.replica.Remove(p)
	s.stats.forget(p)
}

// Tree returns partition p's tree, nil when not replicated here.
func (s *Scheduler) Tree(p uint16) *Tree { return s.replica.Tree(p) }

// LeafBits returns the size of the replica's trees.
func (s *Scheduler) LeafBits() int { return s.replica.LeafBits() }

// RootsRequest is the TreeRoots request of a round over parts: this
// node's horizons, queue settings version and tree size. A peer asked
// for its roots by anyone else (Status) gets the same, so that it can
// tell whether the two keep the same tasks.
func (s *Scheduler) RootsRequest(parts []uint16) *nornv1.TreeRootsRequest {
	return s.replica.rootsRequest(parts)
}

// Partitions returns the number of trees and the memory their nodes take.
func (s *Scheduler) Partitions() (n, bytes int) { return s.replica.Partitions() }

// loop exchanges, with every other node, the partitions both
// replicate: one round per peer every Interval (a fifth of it after a
// round that found differences, and right away when the node starts or
// its partitions change), jittered, until Close.
func (s *Scheduler) loop() {
	defer s.stopped.Done()
	limiter := s.limiter
	next := map[string]time.Time{} // peer id -> when its next round is due
	timer := time.NewTimer(time.Second)
	defer timer.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-s.kick:
			clear(next)
		case <-timer.C:
		}
		r := s.host.Ring()
		soonest := s.cfg.Interval
		if r != nil {
			now := time.Now()
			for _, peerID := range s.SharedPeers(r) {
				due, ok := next[peerID]
				if ok && now.Before(due) {
					soonest = min(soonest, due.Sub(now))
					continue
				}
				differed := s.exchangeWith(r, peerID, limiter)
				wait := s.cfg.Interval
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

// Kick asks for a round with every peer now (never blocks).
func (s *Scheduler) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// jitter spreads d by ±20%.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

// SharedPeers returns the other ring nodes that share a partition with
// this node (a move's target included), in id order.
func (s *Scheduler) SharedPeers(r *cluster.Ring) []string {
	seen := map[string]bool{}
	for p := range r.Partitions {
		cohort := r.Replicas(p)
		if !slices.Contains(cohort, ring.NodeID(s.cfg.NodeID)) {
			continue
		}
		for _, id := range cohort {
			if string(id) != s.cfg.NodeID {
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

// SharedPartitions returns the partitions this node and peerID both
// replicate and this node has a tree of, except a partition whose move
// fills one of them: its fill (a dedicated exchange with each source)
// copies it, and a round on top would compare and send the same tasks
// again.
func (s *Scheduler) SharedPartitions(r *cluster.Ring, peerID string) []uint16 {
	var parts []uint16
	moving := r.MovesUnderway()
	for p := range r.Partitions {
		if r.HostsReplica(p, s.cfg.NodeID) && r.HostsReplica(p, peerID) && s.replica.Tree(uint16(p)) != nil {
			if m := moving[p]; m != nil && m.State == cluster.MoveFilling && (m.To == s.cfg.NodeID || m.To == peerID) {
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
func (s *Scheduler) exchangeWith(r *cluster.Ring, peerID string, limiter *rate.Limiter) bool {
	if !s.host.Up(peerID) {
		return false
	}
	parts := s.SharedPartitions(r, peerID)
	if len(parts) == 0 {
		return false
	}
	differed, _ := s.exchange(r, peerID, parts, limiter, s.cfg.Timeout)
	return differed
}

// fillTimeout bounds one fill exchange: a fill copies a whole partition
// (a million tasks take minutes on a loaded node), and a fill cut short
// starts its comparison over.
const fillTimeout = 30 * time.Minute

// fillRetry is how long a fill waits before it tries a source again (as
// often as the node's rebalance driver polls a move).
const fillRetry = 200 * time.Millisecond

// exchange runs one anti-entropy exchange of parts with peerID, within
// timeout. It reports whether a partition differed or the peer was not
// ready, and the exchange's error.
func (s *Scheduler) exchange(r *cluster.Ring, peerID string, parts []uint16, limiter *rate.Limiter, timeout time.Duration) (differed bool, err error) {
	var st Stats
	nd, ok := r.Node(peerID)
	if !ok {
		return false, fmt.Errorf("node %s is not in the ring", peerID)
	}
	ctx := context.Background()
	if s.cfg.Tracer != nil {
		var span trace.Span
		ctx, span = s.cfg.Tracer.Start(ctx, SpanRound, trace.WithAttributes(AttrPeer.String(peerID),
			AttrPartitions.Int(len(parts)), AttrFill.Bool(limiter == s.fillLimiter)))
		defer func() {
			span.SetAttributes(AttrDiffering.Int(st.Differing), AttrPushed.Int(st.Pushed), AttrPulled.Int(st.Pulled))
			transport.EndSpan(span, err)
		}()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	opt := Options{
		Settle: s.cfg.Settle,
		Pace: func(ctx context.Context, bytes int) error {
			return limiter.WaitN(ctx, min(max(bytes, 1), limiter.Burst()))
		},
	}
	round := s.stats.rounds.Add(1)
	st, err = s.replica.Exchange(ctx, &rpcPeer{peers: s.cfg.Peers, p: s.cfg.Peers.Get(nd.APIAddr), limits: s.cfg.Limits}, parts, opt)
	s.stats.record(st, err, time.Now())
	if err == nil {
		s.stats.completed(round, peerID, parts)
	}
	switch {
	case err == nil || errors.Is(err, context.Canceled):
	case connect.CodeOf(err) == connect.CodeUnavailable, errors.Is(err, ErrNotReplicated), errors.Is(err, ErrQueuesVersion),
		connect.CodeOf(err) == connect.CodeFailedPrecondition && (strings.Contains(err.Error(), ErrNotReplicated.Error()) ||
			strings.Contains(err.Error(), ErrQueuesVersion.Error())):
		// The peer is starting, or has not adopted the ring (a
		// partition moves) or the queue settings (a queue's retention
		// changed) yet: a round soon will do.
		s.cfg.Logger.InfoContext(ctx, "anti-entropy peer not ready", "peer", peerID, "err", err)
		return true, err
	default:
		s.cfg.Logger.WarnContext(ctx, "anti-entropy exchange failed", "peer", peerID, "err", err)
	}
	if st.Pushed+st.Pulled > 0 {
		s.cfg.Logger.InfoContext(ctx, "anti-entropy repaired replicas", "peer", peerID, "partitions", st.Differing,
			"pushed", st.Pushed, "pulled", st.Pulled)
	}
	return st.Differing > 0, err
}

// Fill exchanges partition p with each of sources in a round of its own,
// retrying each until it completes, the replica is dropped or the node
// closes: a move's target is filled at once instead of waiting for its
// rounds with every peer (ReplicaProgress starts it). One fill per
// partition runs at a time.
func (s *Scheduler) Fill(p uint16, sources []string) {
	s.fillMu.Lock()
	if s.filling[p] {
		s.fillMu.Unlock()
		return
	}
	s.filling[p] = true
	s.fillMu.Unlock()
	s.stopped.Add(1)
	go func() {
		defer s.stopped.Done()
		defer func() {
			s.fillMu.Lock()
			delete(s.filling, p)
			s.fillMu.Unlock()
		}()
		for _, src := range sources {
			for {
				r := s.host.Ring()
				if !s.host.Replicates(p) || !s.host.Up(src) {
					return
				}
				round := s.stats.rounds.Add(1)
				if _, err := s.exchange(r, src, []uint16{p}, s.fillLimiter, fillTimeout); err == nil {
					s.stats.completed(round, src, []uint16{p})
					break
				}
				select {
				case <-s.stop:
					return
				case <-time.After(fillRetry):
				}
			}
		}
	}()
}

// Rounds is the number of exchanges this node has started (rounds and
// fills): a move's target is filled by exchanges numbered above the
// count when the ring named it (FilledFrom).
func (s *Scheduler) Rounds() uint64 { return s.stats.rounds.Load() }

// FilledFrom reports whether partition p was exchanged with every one of
// peers in a round numbered above after.
func (s *Scheduler) FilledFrom(p uint16, peers []string, after uint64) bool {
	return s.stats.filledFrom(p, peers, after)
}

// Counters returns the totals of this node's exchanges since it started.
func (s *Scheduler) Counters() Counters { return s.stats.counters() }

// Converged returns, per partition, when an exchange last found (or
// left) its replica equal to a peer's.
func (s *Scheduler) Converged() map[uint16]time.Time { return s.stats.convergedAt() }
