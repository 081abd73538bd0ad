package claims

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"go.opentelemetry.io/otel/trace"
)

// ErrNotLeader is returned by Propose on a replica that does not lead the
// partition's group.
var ErrNotLeader = errors.New("claims: not the partition's leader")

// ErrOutcomeUnknown is wrapped, with ErrNotLeader, in Propose's error for
// a claim whose leader was deposed before the claim committed and that
// could not learn in time whether the next leader committed it: then its
// tasks may be claimed by no one until the lease ends.
var ErrOutcomeUnknown = errors.New("claims: whether the claim took effect is unknown")

// GroupConfig configures one partition's Raft group.
type GroupConfig struct {
	Partition uint16
	// LocalID is this node's id in the group. Required.
	LocalID raft.ServerID
	// KV holds the FSM's state; Log and Stable hold the Raft log and terms
	// (storage.Store.RaftStore(p) is both). Required.
	KV     KV
	Log    raft.LogStore
	Stable raft.StableStore
	// Snapshots keeps the group's snapshots. Required.
	Snapshots raft.SnapshotStore
	// Transport carries the group's traffic. Required.
	Transport raft.Transport
	// Bootstrap, when the log is empty, starts the group with Servers as its
	// configuration (this node alone when Servers is empty).
	Bootstrap bool
	Servers   []raft.Server
	// Raft timing. Defaults: heartbeat and election 1 s, leader lease 500
	// ms, commit 500 ms (tens of idle groups per node, DESIGN section 5).
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// SnapshotThreshold is how many entries trigger a snapshot (and log
	// truncation). Default 8192.
	SnapshotThreshold uint64
	// Logger receives the FSM's errors; default slog.Default().
	Logger *slog.Logger
	// RaftLogger receives hashicorp/raft's own logs; default warnings and
	// above to standard error.
	RaftLogger hclog.Logger
	// OnLeaderChange, when set, is called after this replica's view of
	// the group's leader changed: it lost its leader, learned of a new
	// one, or became the leader itself. Calls come from one goroutine of
	// the group, one at a time, until Shutdown; changes that happen while
	// a call runs are reported by one more call, not one each (so a call
	// reads IsLeader and Leader rather than count on being told each
	// change). It must not wait for Shutdown.
	OnLeaderChange func()
	// MayLead, when set, is asked before every proposal: an error refuses
	// the proposal as if this replica did not lead (ErrNotLeader wrapping
	// it). Every command carries the proposer's clock (lease starts and
	// ends, expiries), so a node whose clock is out of bound refuses them
	// all until it has handed its leaderships over.
	MayLead func() error
	// OnProposed, when set, is told how long each Propose that took
	// effect waited for its entry to commit and apply here (metrics). It
	// runs on the proposer's goroutine and must be cheap.
	OnProposed func(time.Duration)
	// Tracer, when set, traces the proposals made under a traced request
	// (ProposeContext) and their applies on every replica (SpanPropose,
	// SpanApply); nil: no spans.
	Tracer trace.Tracer
	// OnEnded, when set, is told of the tasks an applied batch made
	// terminal on this replica (an act's completion or abort, an end),
	// after the batch is stored. It runs on the FSM's goroutine and must
	// be cheap.
	OnEnded func(ids []uint64)
	// OnFatal, when set, is told that this replica's FSM stopped for good:
	// an entry it could not decode or apply, a store it could not read or
	// write. Every later entry fails; the node must stop, and a restart
	// replays from the last entry stored. It runs on the FSM's goroutine
	// and must not wait for the group.
	OnFatal func(error)
	// Bugs are seeded bugs for the Jepsen harness, test-only (see Bugs).
	// Every replica of a group must run with the same.
	Bugs Bugs
}

func (c *GroupConfig) setDefaults() {
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = time.Second
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = time.Second
	}
	if c.LeaderLeaseTimeout == 0 {
		c.LeaderLeaseTimeout = 500 * time.Millisecond
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = 500 * time.Millisecond
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 8192
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.RaftLogger == nil {
		c.RaftLogger = hclog.New(&hclog.LoggerOptions{
			Name: fmt.Sprintf("raft-p%d", c.Partition), Level: hclog.Warn, Output: os.Stderr})
	}
}

// Validate reports a missing dependency.
func (c *GroupConfig) Validate() error {
	switch {
	case c.LocalID == "":
		return errors.New("claims: GroupConfig.LocalID is required")
	case c.KV == nil || c.Log == nil || c.Stable == nil:
		return errors.New("claims: GroupConfig.KV, Log and Stable are required")
	case c.Snapshots == nil || c.Transport == nil:
		return errors.New("claims: GroupConfig.Snapshots and Transport are required")
	}
	return nil
}

// Group is one partition's Raft group and claim FSM on this node.
type Group struct {
	p    uint16
	raft *raft.Raft
	fsm  *fsm
	logs raft.LogStore

	onProposed func(time.Duration) // GroupConfig.OnProposed
	tracer     trace.Tracer        // GroupConfig.Tracer

	mayLead  func() error   // GroupConfig.MayLead
	observer *raft.Observer // nil without OnLeaderChange
	stop     chan struct{}  // closed by Shutdown: the observer's goroutine ends
	stopOnce sync.Once
	watching sync.WaitGroup // the observer's goroutine

	caughtMu   sync.Mutex
	caughtTerm uint64 // the term caughtIdx is for
	caughtIdx  uint64 // the log's last index when this leader first looked in caughtTerm
}

// StartGroup starts the partition's Raft group. With Bootstrap and an empty
// log it bootstraps the configuration first.
func StartGroup(cfg GroupConfig) (*Group, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	rc := raft.DefaultConfig()
	rc.LocalID = cfg.LocalID
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.NoSnapshotRestoreOnStart = true // the FSM's state is on disk already
	rc.Logger = cfg.RaftLogger
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("claims: partition %d: %w", cfg.Partition, err)
	}
	if cfg.Bootstrap {
		has, err := raft.HasExistingState(cfg.Log, cfg.Stable, cfg.Snapshots)
		if err != nil {
			return nil, fmt.Errorf("claims: partition %d: %w", cfg.Partition, err)
		}
		if !has {
			servers := cfg.Servers
			if len(servers) == 0 {
				servers = []raft.Server{{ID: cfg.LocalID, Address: cfg.Transport.LocalAddr()}}
			}
			err := raft.BootstrapCluster(rc, cfg.Log, cfg.Stable, cfg.Snapshots, cfg.Transport,
				raft.Configuration{Servers: servers})
			if err != nil {
				return nil, fmt.Errorf("claims: bootstrap partition %d: %w", cfg.Partition, err)
			}
		}
	}
	f := &fsm{p: cfg.Partition, kv: cfg.KV, logger: cfg.Logger, bugs: cfg.Bugs, tracer: cfg.Tracer,
		onEnded: cfg.OnEnded, onFatal: cfg.OnFatal}
	r, err := raft.NewRaft(rc, f, cfg.Log, cfg.Stable, cfg.Snapshots, cfg.Transport)
	if err != nil {
		return nil, fmt.Errorf("claims: start partition %d: %w", cfg.Partition, err)
	}
	g := &Group{p: cfg.Partition, raft: r, fsm: f, logs: cfg.Log, mayLead: cfg.MayLead, onProposed: cfg.OnProposed, tracer: cfg.Tracer, stop: make(chan struct{})}
	if cfg.OnLeaderChange != nil {
		g.watchLeader(cfg.OnLeaderChange)
	}
	return g, nil
}

// watchLeader calls fn after each change of the leader this replica knows
// (see GroupConfig.OnLeaderChange) until Shutdown.
func (g *Group) watchLeader(fn func()) {
	// One pending observation is enough: raft drops what does not fit,
	// and the pending one makes fn run after the dropped change.
	ch := make(chan raft.Observation, 1)
	g.observer = raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	g.raft.RegisterObserver(g.observer)
	g.watching.Go(func() {
		for {
			select {
			case <-ch:
				select {
				case <-g.stop:
					return
				default:
					fn()
				}
			case <-g.stop:
				return
			}
		}
	})
}

// Propose replicates cmd through the group and returns its outcomes once
// the entry is committed and applied, waiting at most timeout. It fails
// with ErrNotLeader on a follower, and on a leader deposed before the
// entry committed: then the entry is in its log and perhaps in others',
// and the next leader may still commit it.
//
// For OpClaim Propose then waits, within timeout, for this replica to
// learn the entry's fate from the next leader, and returns its outcomes
// when it took effect: a claim the FSM granted must reach the caller, or
// its tasks stay claimed by no one until the lease ends. It fails with
// ErrNotLeader when the claim did not take effect, and also with
// ErrOutcomeUnknown when its fate is still unknown at the timeout. (Other
// commands are safe to repeat, or the next leader's monitor does them
// again.)
func (g *Group) Propose(cmd *Command, timeout time.Duration) ([]Outcome, error) {
	return g.propose(nil, cmd, timeout)
}

// propose is Propose with the entry's Extensions (nil: none).
func (g *Group) propose(ext []byte, cmd *Command, timeout time.Duration) ([]Outcome, error) {
	if g.mayLead != nil {
		if err := g.mayLead(); err != nil {
			return nil, fmt.Errorf("%w (partition %d): %w", ErrNotLeader, g.p, err)
		}
	}
	deadline := time.Now().Add(timeout)
	term := g.raft.CurrentTerm()
	data := cmd.Encode()
	var fut raft.ApplyFuture
	if ext == nil {
		fut = g.raft.Apply(data, timeout)
	} else {
		fut = g.raft.ApplyLog(raft.Log{Data: data, Extensions: ext}, timeout)
	}
	err := fut.Error()
	if errors.Is(err, raft.ErrLeadershipLost) && cmd.Op == OpClaim {
		fate := g.fate(fut.Index(), term, data, time.Until(deadline))
		switch {
		case fate.applied:
			return fate.res.Outcomes, fate.res.Err
		case fate.known:
			return nil, fmt.Errorf("%w (partition %d): %v; the claim did not take effect", ErrNotLeader, g.p, err)
		default:
			return nil, fmt.Errorf("%w (partition %d): %v; %w", ErrNotLeader, g.p, err, ErrOutcomeUnknown)
		}
	}
	if err != nil {
		// A leader handing its leadership over refuses new entries
		// (none is appended): the caller retries on the next leader.
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) ||
			errors.Is(err, raft.ErrLeadershipTransferInProgress) {
			return nil, fmt.Errorf("%w (partition %d): %v", ErrNotLeader, g.p, err)
		}
		return nil, fmt.Errorf("claims: partition %d: %w", g.p, err)
	}
	res, ok := fut.Response().(*Result)
	if !ok || res == nil {
		return nil, fmt.Errorf("claims: partition %d: entry %d applied before (replay)", g.p, fut.Index())
	}
	if g.onProposed != nil {
		g.onProposed(timeout - time.Until(deadline))
	}
	return res.Outcomes, res.Err
}

// fate waits up to wait for what becomes of the entry this replica
// appended at idx as the leader of term, with data, before it lost the
// leadership. The entry is the one of idx and term in this replica's log
// when its data is data (a term has one leader); else it cannot be told
// apart and its fate is unknown. Once idx is committed (Raft's applied
// index reaches it) the entry there is final: when it is another one,
// ours did not take effect; when it is ours, the FSM reports its result.
func (g *Group) fate(idx, term uint64, data []byte, wait time.Duration) entryFate {
	ours := func() (bool, error) {
		var l raft.Log
		if err := g.logs.GetLog(idx, &l); err != nil {
			return false, err
		}
		return l.Term == term && l.Type == raft.LogCommand && bytes.Equal(l.Data, data), nil
	}
	if idx == 0 || wait <= 0 {
		return entryFate{}
	}
	if ok, err := ours(); err != nil || !ok {
		return entryFate{}
	}
	ch, ok := g.fsm.watch(idx, term)
	if !ok {
		return entryFate{} // applied already: too late to learn its result
	}
	defer g.fsm.unwatch(idx, ch)
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	poll := time.NewTicker(fatePoll)
	defer poll.Stop()
	for {
		select {
		case f := <-ch:
			return f
		case <-poll.C:
			if g.raft.AppliedIndex() >= idx {
				if ok, err := ours(); err == nil && !ok {
					return entryFate{known: true}
				}
			}
		case <-timeout.C:
			return entryFate{}
		case <-g.stop:
			return entryFate{}
		}
	}
}

// fatePoll is how often fate looks whether the entry's index is
// committed.
const fatePoll = 10 * time.Millisecond

// Term is the Raft term this replica is in: a leadership is one term, so
// a leader that lost and regained its leadership is in a newer one.
func (g *Group) Term() uint64 { return g.raft.CurrentTerm() }

// LeaderCaughtUp reports whether this replica leads the group and its
// claim state holds everything the group decided before: its FSM has
// applied every entry its log held when it first looked in its term (a
// new leader applies the previous terms' entries only once its own first
// entry commits, so for a moment after an election its records may miss
// what the old leader decided). Reads take the claim state of a leader
// only once it is caught up.
func (g *Group) LeaderCaughtUp() bool {
	if !g.IsLeader() {
		return false
	}
	term := g.raft.CurrentTerm()
	g.caughtMu.Lock()
	if g.caughtTerm != term {
		// The log's last index now is at least what it was at the
		// election, and holds every committed entry (a leader has them
		// all): waiting for it is enough, if a little more than needed.
		g.caughtTerm, g.caughtIdx = term, g.raft.LastIndex()
	}
	idx := g.caughtIdx
	g.caughtMu.Unlock()
	return g.raft.AppliedIndex() >= idx
}

// IsLeader reports whether this replica leads the group now.
func (g *Group) IsLeader() bool { return g.raft.State() == raft.Leader }

// TransferLeadership hands the leadership to another voter, chosen by
// Raft as the most up to date, and waits until that one leads or the
// transfer fails (hashicorp/raft's LeadershipTransfer).
func (g *Group) TransferLeadership() error { return g.raft.LeadershipTransfer().Error() }

// TransferLeadershipTo hands the leadership to the voter id (at Raft
// address addr) and waits until this replica has stepped down, or the
// transfer failed: id did not catch up or win within the election
// timeout, or this replica does not lead (hashicorp/raft's
// LeadershipTransferToServer). While it runs the group refuses new
// proposals (ErrNotLeader).
func (g *Group) TransferLeadershipTo(id, addr string) error {
	return g.raft.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(addr)).Error()
}

// LeaderCh delivers true when this replica gains leadership and false when
// it loses it (see raft.Raft.LeaderCh).
func (g *Group) LeaderCh() <-chan bool { return g.raft.LeaderCh() }

// Barrier waits until every entry committed before it is applied (a new
// leader calls it before it reads the FSM's state).
func (g *Group) Barrier(timeout time.Duration) error { return g.raft.Barrier(timeout).Error() }

// Stats returns hashicorp/raft's statistics of the group.
func (g *Group) Stats() map[string]string { return g.raft.Stats() }

// Server is one server of the group's configuration.
type Server struct {
	ID, Address string
	Voter       bool
}

// Servers returns the group's latest configuration as this replica
// knows it.
func (g *Group) Servers() ([]Server, error) {
	fut := g.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return nil, err
	}
	var out []Server
	for _, s := range fut.Configuration().Servers {
		out = append(out, Server{ID: string(s.ID), Address: string(s.Address), Voter: s.Suffrage == raft.Voter})
	}
	return out, nil
}

// AddNonvoter adds id as a non-voter that receives the log (leader only).
// A server already in the configuration is left as it is (a voter is
// never demoted).
func (g *Group) AddNonvoter(id, addr string, timeout time.Duration) error {
	servers, err := g.Servers()
	if err != nil {
		return err
	}
	for _, s := range servers {
		if s.ID == id {
			return nil
		}
	}
	return g.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout).Error()
}

// AddVoter makes id a voter (leader only): a non-voter is promoted.
func (g *Group) AddVoter(id, addr string, timeout time.Duration) error {
	return g.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout).Error()
}

// ErrNotInGroup is UpdateAddress's answer for a server that is not in
// the group's configuration.
var ErrNotInGroup = errors.New("claims: no such server in the group")

// UpdateAddress changes the Raft address of id, already in the
// configuration, to addr (leader only) and nothing else: hashicorp/raft's
// AddVoter of a voter (AddNonvoter of a non-voter) already in the
// configuration rewrites its address and keeps its suffrage, and the
// leader's replication to it goes to the new address from then on.
func (g *Group) UpdateAddress(id, addr string, timeout time.Duration) error {
	fut := g.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return err
	}
	for _, s := range fut.Configuration().Servers {
		if string(s.ID) != id {
			continue
		}
		if s.Suffrage == raft.Voter {
			return g.raft.AddVoter(s.ID, raft.ServerAddress(addr), 0, timeout).Error()
		}
		return g.raft.AddNonvoter(s.ID, raft.ServerAddress(addr), 0, timeout).Error()
	}
	return fmt.Errorf("%w: %s", ErrNotInGroup, id)
}

// RemoveServer removes id from the configuration (leader only); a no-op
// for a server not in it.
func (g *Group) RemoveServer(id string, timeout time.Duration) error {
	return g.raft.RemoveServer(raft.ServerID(id), 0, timeout).Error()
}

// LastIndex is the index of the last entry of this replica's log.
func (g *Group) LastIndex() uint64 { return g.raft.LastIndex() }

// AppliedIndex is the index of the last entry applied to this replica's
// claim state.
func (g *Group) AppliedIndex() uint64 { return g.raft.AppliedIndex() }

// Raft returns the underlying group, for membership changes and tests.
func (g *Group) Raft() *raft.Raft { return g.raft }

// Shutdown stops the group; no OnLeaderChange call runs once it returns.
// The caller closes the transport and the store afterwards.
func (g *Group) Shutdown() error {
	g.stopOnce.Do(func() {
		if g.observer != nil {
			g.raft.DeregisterObserver(g.observer)
		}
		close(g.stop)
	})
	g.watching.Wait()
	return g.raft.Shutdown().Error()
}

// Leader returns the id of the group's leader as this replica knows it,
// "" when there is none (an election is under way).
func (g *Group) Leader() raft.ServerID {
	_, id := g.raft.LeaderWithID()
	return id
}
