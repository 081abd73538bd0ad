package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// Config configures a Dispatcher. The node's Config documents the shared
// fields (units, defaults); New applies no defaults of its own.
type Config struct {
	NodeID  string
	APIAddr string // this node's API address: a claimed task names it as its leader
	// Partitions is P, the ring's partition count.
	Partitions int
	// MonitorInterval is the period of the monitor's passes (expiry,
	// promotion, retention) and the unit of a waiting claim's settle
	// looks.
	MonitorInterval time.Duration
	// ClaimRecheck is how often a long-polling claim on a cluster of
	// several nodes looks across the cluster again.
	ClaimRecheck time.Duration
	// HeadsTTL is how long a claim may rely on the heads another leader
	// reported (remote.go); 0 means DefaultHeadsTTL.
	HeadsTTL time.Duration
	// HeadsWait is how long a claim waits for the other leaders' heads
	// (remote.go); 0 means DefaultHeadsWait.
	HeadsWait time.Duration
	// LeaseGrace is the least lease a new partition leader leaves every
	// live claim; SkewBuffer is added to every lease before it expires.
	LeaseGrace, SkewBuffer time.Duration
	// Retention is how long a terminal task is kept.
	Retention time.Duration
	// QueueRetention returns the retentions of the queues that have one
	// of their own (QueueSettings.retention), and the version of the
	// queue settings they come from; nil: none has.
	QueueRetention func() (map[string]time.Duration, uint64)
	// WriteTimeout bounds the writes of the aborts the dispatcher makes.
	WriteTimeout time.Duration
	Clock        crdt.Clock
	HLC          *crdt.HLC
	Logger       *slog.Logger

	Store   *storage.Store
	Host    *replicas.Host
	Peers   *transport.Peers
	Coord   *coord.Coordinator
	Waiters *Waiters // woken by the store's ready index and by the host

	// ClockInBound reports whether this node's clock is within the
	// cluster's bound (the clock guard); the monitor does no lease work
	// while it is not. nil: always.
	ClockInBound func() bool
	// ExpiryNoSkew is the seeded bug TestBugs.ExpiryNoSkew.
	ExpiryNoSkew bool
	// ClaimLocalFirst is the seeded bug TestBugs.ClaimLocalFirst: every
	// other node is treated as one that cannot report its heads.
	ClaimLocalFirst bool
	// FairIgnoresKeys is the seeded bug TestBugs.FairIgnoresKeys: claims
	// weigh the heads of several partitions by priority and id alone, as
	// before fairness keys (each partition still serves its keys in turn).
	FairIgnoresKeys bool

	// OnExpired and OnAborted, when set, are told of the queue of each
	// claim the monitor expired and each task the dispatcher aborted
	// (max_claims reached, a dependency failed) on its own: the task
	// events the API does not see (metrics). The queue is "" when this
	// replica does not hold the task's spec. They must be cheap.
	OnExpired, OnAborted func(queue string)
	// Paused reports whether a queue is paused (its settings, as this
	// node applies them; nil: none is): its claims get nothing, here and
	// when forwarded, and long polls wait for Waiters.NotifyAll.
	Paused func(queue string) bool
	// Limits returns a queue's claim limits (nil: none has any;
	// limits.go).
	Limits func(queue string) Limits
	// CapStaleCount is the seeded bug TestBugs.CapStaleCount: a capped
	// queue's owner checks the cap against a count read at most once a
	// second, blind to the claims under way.
	CapStaleCount bool
	// UniquePhantomAfter is how old a unique key's record must be before
	// a holder no majority has is taken as gone (the node's rejoin
	// limit); nil: an hour.
	UniquePhantomAfter func() time.Duration
	// DeadlineUnfenced is the seeded bug TestBugs.DeadlineUnfenced: the
	// dispatcher does not check candidates' deadlines, and the monitor
	// cancels only the tasks past their deadline that are not claimed.
	DeadlineUnfenced bool
}

// Dispatcher hands tasks to workers on one node: it picks the best ready
// heads of the partitions this node leads, proposes their claims through
// the partitions' Raft groups, long-polls for work, proxies claims to the
// other leaders, runs the leader's monitor (extend on a new leadership,
// expire, promote delayed tasks, retention), ends the claims of finished
// tasks, and resolves dependencies. Safe for concurrent use.
type Dispatcher struct {
	cfg   Config
	store *storage.Store
	host  *replicas.Host
	peers *transport.Peers
	coord *coord.Coordinator

	waiters  *Waiters
	inflight inflightSet  // tasks being claimed now
	ender    *ender       // coalesced claim ends of finished tasks
	deps     *depChecker  // dependencies of blocked tasks (deps.go)
	remote   *remoteHeads // the other leaders' heads (remote.go)
	limits   limiterSet   // limited queues this node owns (limits.go)
	fair     fairClocks   // the keys' virtual times per queue (fair.go)

	// monitorMu serializes monitor passes; extended[p] is the Raft term
	// of p whose leadership has extended the live claims (0: none), so a
	// leadership lost and regained between two passes extends again.
	monitorMu sync.Mutex
	extended  []uint64
	// deadPending are tasks past max_claims whose abort is not written yet
	// (their state could not be read), with their max_claims; under
	// monitorMu.
	deadPending map[uint64]uint32
	// sweepMu serializes the unique keys' sweeps; sweepAt is where each
	// partition's goes on from (unique.go).
	sweepMu sync.Mutex
	sweepAt map[uint16]uniqueCursor

	draining  chan struct{} // closed by StopWaiting
	drainOnce sync.Once
	stop      chan struct{}
	stopped   sync.WaitGroup
}

// New returns a dispatcher; Start starts its background work.
func New(cfg Config) *Dispatcher {
	d := &Dispatcher{cfg: cfg, store: cfg.Store, host: cfg.Host, peers: cfg.Peers, coord: cfg.Coord,
		waiters: cfg.Waiters, extended: make([]uint64, cfg.Partitions), deadPending: map[uint64]uint32{},
		draining: make(chan struct{}), stop: make(chan struct{})}
	if d.cfg.HeadsTTL <= 0 {
		d.cfg.HeadsTTL = DefaultHeadsTTL
	}
	if d.cfg.HeadsWait <= 0 {
		d.cfg.HeadsWait = DefaultHeadsWait
	}
	d.remote = &remoteHeads{d: d, queues: map[string]*queueHeads{}}
	d.ender = newEnder(d)
	d.deps = newDepChecker(d)
	return d
}

// Start starts the monitor, the ender and the dependency checker.
func (d *Dispatcher) Start() {
	d.stopped.Add(4)
	go d.monitor()
	go d.sweepUniques()
	go func() {
		defer d.stopped.Done()
		d.ender.run(d.stop)
	}()
	go func() {
		defer d.stopped.Done()
		d.deps.run(d.stop)
	}()
}

// StopWaiting makes waiting claims answer now (with what they have) and
// later ones not wait: the node is about to stop.
func (d *Dispatcher) StopWaiting() { d.drainOnce.Do(func() { close(d.draining) }) }

// Close stops the background work, proposing the claim ends still
// queued, and wakes every waiting claim for good.
func (d *Dispatcher) Close() {
	close(d.stop)
	d.waiters.closeAll()
	d.stopped.Wait()
}

// DepStats are the dependency checker's sizes (metrics).
type DepStats struct {
	Watched int // dependencies read from their replicas in the background
	Cached  int // dependencies known terminal, up to DepCacheSize
}

// DepStats returns the dependency checker's sizes now.
func (d *Dispatcher) DepStats() DepStats {
	return DepStats{Watched: d.deps.watched(), Cached: d.deps.cache.len()}
}

// Ended ends the claims of tasks a merge made terminal, in the
// partitions this node leads, and wakes waiting claims: dependants of
// these tasks, in any queue, may be claimable (or doomed) now. It is
// coord.Config.OnEnded.
func (d *Dispatcher) Ended(tasks []coord.Ended) {
	for _, e := range tasks {
		if g := d.host.Group(e.P); g != nil && g.IsLeader() {
			d.endClaim(e.ID, e.Event)
		}
	}
	d.waiters.NotifyAll()
}

// Propose runs one claim FSM command on id's partition and returns its
// outcome for id.
func (d *Dispatcher) Propose(id uint64, cmd *claims.Command) (claims.Outcome, error) {
	g := d.host.Group(d.host.Partition(id))
	if g == nil {
		return claims.Outcome{}, connect.NewError(connect.CodeUnavailable,
			fmt.Errorf("task %d's partition is not replicated on %s", id, d.cfg.NodeID))
	}
	outs, err := g.Propose(cmd, replicas.ProposeTimeout)
	if err != nil {
		return claims.Outcome{}, apierr.From(err)
	}
	for _, o := range outs {
		if o.ID == id {
			return o, apierr.From(o.Err)
		}
	}
	return claims.Outcome{}, connect.NewError(connect.CodeInternal, fmt.Errorf("no outcome for task %d", id))
}

// EndIfTerminal queues the claim FSM's end of a task whose CRDT state is
// terminal but whose FSM record does not say so yet; it returns whether the
// task is terminal.
func (d *Dispatcher) EndIfTerminal(ts *coord.TaskState) bool {
	ev, ok := ts.Task.Terminal()
	if !ok {
		return false
	}
	// A DEAD event is the claim FSM's own, written with the end of the
	// claim it records: there is nothing to end.
	if ev.Kind != crdt.Dead && (ts.Claims == nil || ts.Claims.Terminal == claims.EndNone) {
		d.endClaim(ts.Task.ID, ev)
	}
	return true
}

// EndNow ends the claim FSM's record of task id, which ev (a cancel, an
// abort by this node) made terminal, through the partition's group before
// it returns when this node leads the partition: a cancel the leader
// acknowledges is then known to the group, which grants the task to no
// one again whichever replica leads next. Elsewhere, or when the proposal
// fails, the end is queued for the leader (endClaim).
func (d *Dispatcher) EndNow(id uint64, ev crdt.Terminal) {
	p := d.host.Partition(id)
	if g := d.host.Group(p); g != nil && g.IsLeader() {
		cmd := &claims.Command{Op: claims.OpEnd, NowMs: d.cfg.Clock.Now().UnixMilli(),
			Ends: []claims.End{{ID: id, Token: ev.Claim, Reason: coord.EndReason(ev.Kind), Life: ev.Life}}}
		if _, err := g.Propose(cmd, replicas.ProposeTimeout); err == nil {
			return
		}
	}
	d.endClaim(id, ev)
}

// endClaim queues the claim FSM's end of a task that just became terminal
// (ev is its deciding terminal event). The ender proposes it in the
// background: the outcome is decided and durable already, and every path
// that could act on the claim (renew, yield, expiry, the task view) checks
// the terminal event first. If the proposal fails (or the node dies
// first), the monitor ends the claim when its lease runs out.
func (d *Dispatcher) endClaim(id uint64, ev crdt.Terminal) {
	d.ender.add(d.host.Partition(id), claims.End{ID: id, Token: ev.Claim, Reason: coord.EndReason(ev.Kind), Life: ev.Life})
}

// LoadClaimed loads task id for a Renew under claim claimID (the other
// calls under a claim are decided by the group: Acts), where a refusal
// must rest on the
// partition's authoritative claim state, not on a replica that is behind.
// The local replica is believed when it shows claimID live or the task
// terminal for it (TerminalSettles). Otherwise, on the partition's leader, it waits until the claim
// FSM has applied every committed entry (a new leader may not have applied
// its predecessor's yet) and, when the task's state has not reached this
// replica (a write with W < N skipped it, or a power loss took it), reads
// it from a majority of replicas. A replica that is not the leader (the
// call could not reach one) cannot refute the claim: UNAVAILABLE, which
// the caller may retry.
func (d *Dispatcher) LoadClaimed(ctx context.Context, id, claimID uint64) (*coord.TaskState, error) {
	ts, err := d.coord.Load(id)
	if err == nil && claimDecided(ts, claimID) {
		return ts, nil
	}
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		return nil, err
	}
	p := d.host.Partition(id)
	g := d.host.Group(p)
	if g == nil {
		return ts, err
	}
	if !g.IsLeader() {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"claim %d of task %d cannot be checked: partition %d has no reachable leader", claimID, id, p))
	}
	if err := g.Barrier(replicas.ProposeTimeout); err != nil {
		return nil, apierr.From(err)
	}
	ts, err = d.coord.Load(id)
	if errors.Is(err, storage.ErrNotFound) {
		// The read merges a majority's states with this leader's record
		// and repairs this replica in the background.
		return d.coord.Read(ctx, id, 0)
	}
	return ts, err
}

// claimDecided reports whether ts settles a call under claimID without
// looking further: the claim is live, or the task's terminal state
// settles it (TerminalSettles).
func claimDecided(ts *coord.TaskState, claimID uint64) bool {
	if TerminalSettles(ts, claimID) {
		return true
	}
	if ts.Claims != nil {
		if c, ok := ts.Claims.Live(); ok && c.Token == claimID {
			return true
		}
	}
	return false
}

// TerminalSettles reports whether ts, a replica's state of a task, shows
// the task terminal for a call under claimID: the claim has ended for
// good, and the call is refused. Since Retry, terminal is not for ever: a
// revival begins a new life, whose claims come after it. A replica that
// has not applied the revival (cut off from its group, or behind) holds
// a terminal copy while the task is claimed again, and must not refuse
// the new claim from it. So the copy settles only a claim its claim
// record knows (granted at or before the last claim the replica applied:
// tokens are Raft indexes of the partition's group, which grow), and only
// when the record is not a life ahead of the copy's terminal event. Any
// other claim is for the partition's leader to judge (after a barrier).
func TerminalSettles(ts *coord.TaskState, claimID uint64) bool {
	ev, terminal := ts.Task.Terminal()
	if !terminal || ts.Claims == nil {
		return false
	}
	r := ts.Claims
	n := len(r.History)
	return n > 0 && claimID <= r.History[n-1].Token && r.Life <= ev.Life
}

// Waiters wakes long-polling claims when a queue may have work. Safe for
// concurrent use.
type Waiters struct {
	mu     sync.Mutex
	chans  map[string]chan struct{}
	closed bool
}

// NewWaiters returns a set with no waiting claim.
func NewWaiters() *Waiters { return &Waiters{chans: map[string]chan struct{}{}} }

// wait returns a channel closed at the next notify of queue.
func (w *Waiters) wait(queue string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.chans[queue]
	if !ok {
		ch = make(chan struct{})
		if w.closed {
			close(ch)
		} else {
			w.chans[queue] = ch
		}
	}
	return ch
}

// Waiting reports whether a claim waits on queue now.
func (w *Waiters) Waiting(queue string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.chans[queue]
	return ok
}

// Notify wakes every claim waiting on queue.
func (w *Waiters) Notify(queue string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ch, ok := w.chans[queue]; ok {
		close(ch)
		delete(w.chans, queue)
	}
}

// NotifyAll wakes every waiting claim (they re-check their queues).
func (w *Waiters) NotifyAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for q, ch := range w.chans {
		close(ch)
		delete(w.chans, q)
	}
}

func (w *Waiters) closeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for q, ch := range w.chans {
		close(ch)
		delete(w.chans, q)
	}
}

// inflightSet holds the ids this node's claims are proposing right now, so
// that concurrent claims pick different tasks instead of racing for the
// same heads (the FSM would refuse all but one).
type inflightSet struct {
	mu  sync.Mutex
	ids map[uint64]struct{}
}

func (s *inflightSet) reserve(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = map[uint64]struct{}{}
	}
	if _, busy := s.ids[id]; busy {
		return false
	}
	s.ids[id] = struct{}{}
	return true
}

func (s *inflightSet) release(ids []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		delete(s.ids, id)
	}
}
