package rebalance

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/transport"
)

// movePoll is how often a move that waits (for a fill, a catch-up) looks
// again; a move's target retries a failed fill exchange as often.
// moveStepTimeout bounds one step's calls.
const (
	movePoll        = 200 * time.Millisecond
	moveStepTimeout = 10 * time.Second
	driverInterval  = 500 * time.Millisecond
	autoInterval    = 2 * time.Second
)

// Config configures a Driver. The node's Config documents the shared
// fields too; New applies no defaults of its own.
type Config struct {
	// NodeID is this node's id in the ring, the meta group and the
	// partition groups.
	NodeID string
	// Peers reaches other nodes' APIs: PeerService.ChangeGroup and
	// ReplicaProgress for a move's steps, AdminService for a placement
	// call passed on to the meta leader.
	Peers *transport.Peers
	// Logger receives the driver's moves, steps and failures.
	Logger *slog.Logger

	// MaxMovesPerNode bounds the moves under way that involve one node
	// (as source or target); more wait queued. The meta leader's setting
	// counts. Must be positive (the node's default is 2).
	MaxMovesPerNode int
	// MoveTargetTimeout is how long a move's target may be down (as
	// gossip sees it, since this node leads the meta group) before a move
	// not yet promoted is rolled back and a queued one fails; a promoted
	// move always finishes. The node's default is 2 min.
	MoveTargetTimeout time.Duration
	// AutoRebalance lets the meta leader plan and apply a placement
	// change by itself (see autoRebalance): when a member has been dead
	// for AutoDeadAfter, or a live member holds nothing. Off: placement
	// changes only on an admin's call.
	AutoRebalance bool
	// AutoDeadAfter is how long a member must be down, as the driver has
	// seen since it leads, before AutoRebalance removes it. The node's
	// default is 10 min.
	AutoDeadAfter time.Duration

	// Fills is this node's anti-entropy as a move's target reports it
	// (ReplicaProgress).
	Fills Fills
}

// Driver is the rebalance driver and the placement calls of one node.
// Every node has one: it answers the steps of moves (ChangeGroup on a
// partition's leader, ReplicaProgress on a move's target), and while the
// node leads the meta group it plans, starts and drives the moves and
// fits the meta group to the ring. Safe for concurrent use once Start
// has run.
type Driver struct {
	cfg   Config
	host  *replicas.Host // set by Start
	peers *transport.Peers

	editMu    sync.Mutex // one ring proposal at a time on the meta leader
	metaFitMu sync.Mutex // one meta group membership change at a time

	mu       sync.Mutex
	running  map[int]bool   // partitions whose move has a goroutine
	fillFrom map[int]uint64 // B's anti-entropy round once every replica had the move's ring, by partition
	// catchUpTo is, by partition, the leader's last index at the previous
	// catch-up poll.
	catchUpTo map[int]uint64
	// down is, by ring node, since when it is down (gossip), as the
	// driver's passes saw it.
	down map[string]time.Time
	// autoAt is when autoRebalance last looked, autoErr its last error
	// (logged once); only the driver loop uses them.
	autoAt  time.Time
	autoErr string
	kick    chan struct{}

	stop      chan struct{}
	stopped   sync.WaitGroup
	closeOnce sync.Once
}

// New returns a driver that does nothing until Start but take kicks: the
// node creates it before its replicas.Host, whose OnMetaRing calls Kick
// while it starts.
func New(cfg Config) *Driver {
	return &Driver{cfg: cfg, peers: cfg.Peers,
		running: map[int]bool{}, fillFrom: map[int]uint64{}, catchUpTo: map[int]uint64{},
		down: map[string]time.Time{}, kick: make(chan struct{}, 1), stop: make(chan struct{})}
}

// Start gives the driver the node's replicas and starts its loop. It
// runs once, before any call but Kick.
func (d *Driver) Start(h *replicas.Host) {
	d.host = h
	d.stopped.Add(1)
	go d.driveLoop()
}

// Close stops the loop and the moves' goroutines and waits for them. The
// node closes the driver before its replicas.Host.
func (d *Driver) Close() {
	d.closeOnce.Do(func() { close(d.stop) })
	d.stopped.Wait()
}

// Kick asks the driver for a pass now (never blocks).
func (d *Driver) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// driveLoop runs the driver's passes while this node leads the meta group,
// until Close.
func (d *Driver) driveLoop() {
	defer d.stopped.Done()
	t := time.NewTicker(driverInterval)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		case <-d.kick:
		}
		if d.host.Meta().IsLeader() {
			d.drivePass()
		} else {
			d.mu.Lock()
			clear(d.down) // a leader again starts counting afresh
			d.mu.Unlock()
		}
	}
}

// drivePass starts the queued moves the throttle allows, a goroutine for
// each move under way that has none, and removes leaving and dead nodes
// that hold nothing.
func (d *Driver) drivePass() {
	// A leader elected after a restart leads before it has replayed the
	// group's log: act only on the ring its predecessors committed.
	if err := d.host.Meta().LeaderReady(replicas.ProposeTimeout); err != nil {
		d.cfg.Logger.Debug("the meta leader is not ready yet", "err", err)
		return
	}
	r := d.host.Meta().Ring()
	if r == nil {
		return
	}
	d.mu.Lock()
	now := time.Now()
	for _, nd := range r.Nodes {
		switch _, seen := d.down[nd.ID]; {
		case d.host.Up(nd.ID):
			delete(d.down, nd.ID)
		case !seen:
			d.down[nd.ID] = now
		}
	}
	d.mu.Unlock()
	if d.cfg.AutoRebalance {
		d.autoRebalance(r)
	}
	if err := d.startQueued(); err != nil {
		d.cfg.Logger.Warn("starting queued moves failed", "err", err)
	}
	r = d.host.Meta().Ring()
	for p := range r.MovesUnderway() {
		d.mu.Lock()
		if d.running[p] {
			d.mu.Unlock()
			continue
		}
		d.running[p] = true
		d.mu.Unlock()
		d.stopped.Add(1)
		go d.driveMove(p)
	}
	if err := d.removeEmptied(); err != nil {
		d.cfg.Logger.Warn("removing emptied nodes failed", "err", err)
	}
}

// downFor returns how long node id has been down as the driver saw it
// (0 while it is up, or since this node leads the meta group).
func (d *Driver) downFor(id string) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if since, ok := d.down[id]; ok {
		return time.Since(since)
	}
	return 0
}

// editRing applies edit to a copy of the meta group's current ring with
// the next epoch and proposes it; edit returns false to propose nothing.
// It retries when another proposal won the epoch.
func (d *Driver) editRing(edit func(r *cluster.Ring) (bool, error)) (*cluster.Ring, error) {
	d.editMu.Lock()
	defer d.editMu.Unlock()
	for attempt := 0; ; attempt++ {
		cur := d.host.Meta().Ring()
		if cur == nil {
			return nil, apierr.NotFormed
		}
		next := cur.Next()
		ok, err := edit(next)
		if err != nil || !ok {
			return cur, err
		}
		err = d.host.Meta().ProposeRing(next, replicas.ProposeTimeout)
		if err == nil {
			d.host.KickReconcile()
			return next, nil
		}
		if !errors.Is(err, cluster.ErrStaleEpoch) || attempt == 3 {
			return cur, err
		}
	}
}

// startQueued starts queued moves, in plan order, while neither end has
// MaxMovesPerNode moves under way, the partition has none, and the target
// is up. A queued move that no longer matches its partition's cohort
// fails.
func (d *Driver) startQueued() error {
	var started []cluster.Move
	_, err := d.editRing(func(r *cluster.Ring) (bool, error) {
		started = started[:0]
		busy := map[string]int{}
		for _, m := range r.Moves {
			if m.State.Active() {
				busy[m.From]++
				busy[m.To]++
			}
		}
		changed := false
		for i := range r.Moves {
			m := &r.Moves[i]
			if m.State != cluster.MoveQueued {
				continue
			}
			if !r.Hosts(m.Partition, m.From) || r.Hosts(m.Partition, m.To) {
				m.State, m.Error, changed = cluster.MoveFailed, "the partition's cohort changed since the plan", true
				continue
			}
			if _, ok := r.Node(m.To); !ok {
				m.State, m.Error, changed = cluster.MoveFailed, "the target left the ring", true
				continue
			}
			if down := d.downFor(m.To); down >= d.cfg.MoveTargetTimeout {
				m.State, m.Error, changed = cluster.MoveFailed, targetDownMsg(m.To, down, d.cfg.MoveTargetTimeout), true
				continue
			}
			if r.ActiveMove(m.Partition) != nil || busy[m.From] >= d.cfg.MaxMovesPerNode ||
				busy[m.To] >= d.cfg.MaxMovesPerNode || !d.host.Up(m.To) {
				continue
			}
			m.State, m.Epoch, m.Error, changed = cluster.MoveFilling, r.Epoch, "", true
			started = append(started, *m)
			busy[m.From]++
			busy[m.To]++
		}
		return changed, nil
	})
	if err == nil {
		for _, m := range started {
			d.cfg.Logger.Info("partition move started", "partition", m.Partition, "from", m.From, "to", m.To)
		}
	}
	return err
}
