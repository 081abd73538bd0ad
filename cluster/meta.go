package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/norn-dev/norn/crdt"
)

// MetaConfig configures this node's replica of the meta Raft group.
type MetaConfig struct {
	// LocalID is this node's id. Required.
	LocalID string
	// Transport carries the group's traffic (a NetworkTransport on the
	// node's Raft mux, group transport.MetaGroup). Required.
	Transport raft.Transport
	// Log, Stable and Snapshots keep the group's state. Required.
	Log       raft.LogStore
	Stable    raft.StableStore
	Snapshots raft.SnapshotStore
	// Raft timing; defaults 1 s heartbeat and election, 500 ms lease.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	// OnRing is called with every ring the group applies (and the one a
	// snapshot restores), from the group's FSM goroutine: it must not
	// block for long. Rings come in epoch order, but a restart replays
	// old ones: compare epochs.
	OnRing func(*Ring)
	// OnQueues is called like OnRing with every queue table the group
	// applies (and the one a snapshot restores), versions in order.
	OnQueues func(*Queues)
	// RaftLogger receives hashicorp/raft's logs. Default: warnings to
	// standard error.
	RaftLogger hclog.Logger
}

// Meta is this node's replica of the meta Raft group, which holds the ring.
// Only the nodes in its configuration (the cluster's first 3 or 5) take
// part; on the others it idles with no configuration.
type Meta struct {
	raft *raft.Raft
	fsm  *metaFSM
	// readyTerm is the term in which this replica, leading, has applied
	// every entry committed before (a Barrier): from then on Ring is the
	// group's latest ring. 0 for none.
	readyTerm atomic.Uint64
}

// StartMeta starts the replica; it restores the ring from its snapshot and
// log.
func StartMeta(cfg MetaConfig) (*Meta, error) {
	if cfg.LocalID == "" || cfg.Transport == nil || cfg.Log == nil || cfg.Stable == nil || cfg.Snapshots == nil {
		return nil, errors.New("cluster: MetaConfig needs LocalID, Transport, Log, Stable and Snapshots")
	}
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.LocalID)
	rc.HeartbeatTimeout = orDuration(cfg.HeartbeatTimeout, time.Second)
	rc.ElectionTimeout = orDuration(cfg.ElectionTimeout, time.Second)
	rc.LeaderLeaseTimeout = orDuration(cfg.LeaderLeaseTimeout, 500*time.Millisecond)
	rc.CommitTimeout = 500 * time.Millisecond
	rc.SnapshotThreshold = 1024
	rc.Logger = cfg.RaftLogger
	if rc.Logger == nil {
		rc.Logger = hclog.New(&hclog.LoggerOptions{Name: "raft-meta", Level: hclog.Warn})
	}
	f := &metaFSM{onRing: cfg.OnRing, onQueues: cfg.OnQueues}
	r, err := raft.NewRaft(rc, f, cfg.Log, cfg.Stable, cfg.Snapshots, cfg.Transport)
	if err != nil {
		return nil, fmt.Errorf("cluster: start meta group: %w", err)
	}
	return &Meta{raft: r, fsm: f}, nil
}

func orDuration(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Bootstrap makes voters the group's first configuration. It is a no-op
// error (raft.ErrCantBootstrap) on a replica that has state already.
func (m *Meta) Bootstrap(voters []RingNode) error {
	var servers []raft.Server
	for _, v := range voters {
		servers = append(servers, raft.Server{ID: raft.ServerID(v.ID), Address: raft.ServerAddress(v.RaftAddr)})
	}
	return m.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
}

// metaCommand is a meta group log entry: a ring, or one queue's
// settings. A node built before queue settings refuses a queue entry (its
// Apply answers an error and changes nothing), so the leader proposes
// them only once every ring member has FeatureQueues.
type metaCommand struct {
	Ring  *Ring         `json:"ring,omitempty"`
	Queue *queueCommand `json:"queue,omitempty"`
	// Schedule changes the schedule table (schedules.go); proposed only
	// once every ring member has FeatureSchedules.
	Schedule *ScheduleCommand `json:"schedule,omitempty"`
}

type queueCommand struct {
	Name     string        `json:"name"`
	Settings QueueSettings `json:"settings"`
}

// ProposeRing replaces the ring with r, whose epoch must be the current
// epoch plus one (1 for the first ring) and whose cluster id must be the
// current one: a lost race gives ErrStaleEpoch. Only the leader can
// propose (raft.ErrNotLeader otherwise).
func (m *Meta) ProposeRing(r *Ring, timeout time.Duration) error {
	if err := r.Validate(); err != nil {
		return err
	}
	_, err := m.propose(metaCommand{Ring: r}, timeout)
	return err
}

// propose replicates c and returns its entry's index, or the error the
// FSM answered it with.
func (m *Meta) propose(c metaCommand, timeout time.Duration) (uint64, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return 0, err
	}
	fut := m.raft.Apply(b, timeout)
	if err := fut.Error(); err != nil {
		return 0, err
	}
	if err, ok := fut.Response().(error); ok {
		return 0, err
	}
	return fut.Index(), nil
}

// ProposeQueue sets queue's settings to s (the zero value removes them)
// and returns the table's new version. Only the leader can propose.
func (m *Meta) ProposeQueue(queue string, s QueueSettings, timeout time.Duration) (uint64, error) {
	if err := crdt.ValidateQueue("queue", queue); err != nil {
		return 0, err
	}
	if err := s.Validate(); err != nil {
		return 0, err
	}
	return m.propose(metaCommand{Queue: &queueCommand{Name: queue, Settings: s}}, timeout)
}

// ProposeSchedule applies c to the schedule table and returns the
// table's new version. Only the leader can propose. Errors of the
// command (ErrScheduleExists, ErrNoSchedule, ErrTooManySchedules) come
// back as they are.
func (m *Meta) ProposeSchedule(c *ScheduleCommand, timeout time.Duration) (uint64, error) {
	return m.propose(metaCommand{Schedule: c}, timeout)
}

// Schedules returns the schedule table this replica has applied (nil
// before any change). The caller must not modify it.
func (m *Meta) Schedules() *Schedules {
	m.fsm.mu.Lock()
	defer m.fsm.mu.Unlock()
	return m.fsm.schedules
}

// Queues returns the queue table this replica has applied (nil before
// any change). The caller must not modify it.
func (m *Meta) Queues() *Queues {
	m.fsm.mu.Lock()
	defer m.fsm.mu.Unlock()
	return m.fsm.queues
}

// Ring returns the ring this replica has applied, nil before the first.
// The caller must not modify it.
func (m *Meta) Ring() *Ring {
	m.fsm.mu.Lock()
	defer m.fsm.mu.Unlock()
	return m.fsm.ring
}

// IsLeader reports whether this replica leads the meta group. A new
// leader may not have applied its predecessors' entries yet: before it
// acts on Ring, it calls LeaderReady.
func (m *Meta) IsLeader() bool { return m.raft.State() == raft.Leader }

// ErrNotReady is LeaderReady's answer on a replica that does not lead the
// meta group.
var ErrNotReady = errors.New("cluster: this node does not lead the meta group")

// LeaderReady makes sure this replica leads the group and has applied
// every entry committed before its leadership, so that Ring is the
// group's latest ring: the first call of a term waits (up to timeout) for
// a Raft barrier, later ones of the same term return at once. A replica
// freshly elected after a restart leads before it has replayed its log,
// and would otherwise act on a missing or stale ring. ErrNotReady when it
// does not lead; the barrier's error when it stopped leading meanwhile or
// timed out.
func (m *Meta) LeaderReady(timeout time.Duration) error {
	if !m.IsLeader() {
		return ErrNotReady
	}
	term := m.raft.CurrentTerm()
	if m.readyTerm.Load() == term {
		return nil
	}
	if err := m.raft.Barrier(timeout).Error(); err != nil {
		return fmt.Errorf("cluster: meta leader barrier: %w", err)
	}
	// The barrier succeeded in term (a new term would have deposed this
	// leader and failed it), so everything before it is applied.
	m.readyTerm.Store(term)
	return nil
}

// WaitLeader waits until this replica leads the group or timeout passes.
func (m *Meta) WaitLeader(timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !m.IsLeader() {
		select {
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
	return true
}

// Leader returns the id of the group's leader as this replica knows it,
// "" when none.
func (m *Meta) Leader() string {
	_, id := m.raft.LeaderWithID()
	return string(id)
}

// Voters returns the ids of the group's voters, as this replica's latest
// configuration has them (empty on a node outside the group).
func (m *Meta) Voters() ([]string, error) {
	fut := m.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range fut.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			ids = append(ids, string(s.ID))
		}
	}
	return ids, nil
}

// AddVoter makes node a voter of the group (leader only); a no-op for a
// voter already.
func (m *Meta) AddVoter(node RingNode, timeout time.Duration) error {
	return m.raft.AddVoter(raft.ServerID(node.ID), raft.ServerAddress(node.RaftAddr), 0, timeout).Error()
}

// Servers returns the group's latest configuration as this replica knows
// it: each server's id and Raft address (empty on a node outside the
// group).
func (m *Meta) Servers() ([]raft.Server, error) {
	fut := m.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return nil, err
	}
	return fut.Configuration().Servers, nil
}

// UpdateAddress changes the Raft address of server id, already in the
// group, to addr (leader only), keeping its vote: hashicorp/raft's
// AddVoter of a voter (AddNonvoter of a non-voter) already in the
// configuration rewrites its address and nothing else.
func (m *Meta) UpdateAddress(id, addr string, timeout time.Duration) error {
	servers, err := m.Servers()
	if err != nil {
		return err
	}
	for _, s := range servers {
		if string(s.ID) != id {
			continue
		}
		if s.Suffrage == raft.Voter {
			return m.raft.AddVoter(s.ID, raft.ServerAddress(addr), 0, timeout).Error()
		}
		return m.raft.AddNonvoter(s.ID, raft.ServerAddress(addr), 0, timeout).Error()
	}
	return fmt.Errorf("cluster: %s is not in the meta group", id)
}

// RemoveServer removes node id from the group (leader only). A leader
// that removes itself steps down once the change commits.
func (m *Meta) RemoveServer(id string, timeout time.Duration) error {
	return m.raft.RemoveServer(raft.ServerID(id), 0, timeout).Error()
}

// TransferLeadership hands the group's leadership to another voter,
// the most up to date as Raft chooses, and waits until that one leads or
// the transfer failed (a node about to stop calls it).
func (m *Meta) TransferLeadership() error { return m.raft.LeadershipTransfer().Error() }

// Stats returns hashicorp/raft's statistics of the meta group.
func (m *Meta) Stats() map[string]string { return m.raft.Stats() }

// Shutdown stops the replica; the caller closes its transport afterwards.
func (m *Meta) Shutdown() error { return m.raft.Shutdown().Error() }

// metaFSM holds the ring and the queue table in memory; snapshots and
// the log rebuild them.
type metaFSM struct {
	onRing   func(*Ring)
	onQueues func(*Queues)

	mu        sync.Mutex
	ring      *Ring
	queues    *Queues
	schedules *Schedules
}

func (f *metaFSM) Apply(l *raft.Log) any {
	var cmd metaCommand
	err := json.Unmarshal(l.Data, &cmd)
	n := 0
	for _, set := range []bool{cmd.Ring != nil, cmd.Queue != nil, cmd.Schedule != nil} {
		if set {
			n++
		}
	}
	if err != nil || n != 1 {
		return fmt.Errorf("cluster: meta entry %d is not a ring, queue or schedule command", l.Index)
	}
	if cmd.Queue != nil {
		return f.applyQueue(cmd.Queue, l.Index)
	}
	if cmd.Schedule != nil {
		f.mu.Lock()
		defer f.mu.Unlock()
		next, err := applySchedule(f.schedules, cmd.Schedule, l.Index)
		if err != nil {
			return err
		}
		f.schedules = next
		return nil
	}
	r := cmd.Ring
	if err := r.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	cur := f.ring
	switch {
	case cur == nil && r.Epoch != 1:
		f.mu.Unlock()
		return fmt.Errorf("%w: first ring has epoch %d", ErrStaleEpoch, r.Epoch)
	case cur != nil && r.ClusterID != cur.ClusterID:
		f.mu.Unlock()
		return fmt.Errorf("%w: ring of cluster %s in cluster %s", ErrOtherCluster, r.ClusterID, cur.ClusterID)
	case cur != nil && r.Epoch != cur.Epoch+1:
		f.mu.Unlock()
		return fmt.Errorf("%w: proposed epoch %d, current %d", ErrStaleEpoch, r.Epoch, cur.Epoch)
	}
	f.ring = r
	f.mu.Unlock()
	if f.onRing != nil {
		f.onRing(r)
	}
	return nil
}

// applyQueue applies one queue's settings at log index.
func (f *metaFSM) applyQueue(c *queueCommand, index uint64) any {
	if err := crdt.ValidateQueue("queue", c.Name); err != nil {
		return err
	}
	if err := c.Settings.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	if f.ring == nil {
		f.mu.Unlock()
		return errors.New("cluster: queue settings before the first ring")
	}
	if _, ok := f.queues.ByNameOK(c.Name); !ok && !c.Settings.IsZero() && len(f.queues.Names()) >= MaxQueues {
		f.mu.Unlock()
		return fmt.Errorf("%w: %d queues have settings already, at most %d", ErrBadSettings, MaxQueues, MaxQueues)
	}
	q := f.queues.with(f.ring.ClusterID, c.Name, c.Settings, index)
	f.queues = q
	f.mu.Unlock()
	if f.onQueues != nil {
		f.onQueues(q)
	}
	return nil
}

func (f *metaFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return metaSnapshot{ring: f.ring, queues: f.queues, schedules: f.schedules}, nil
}

// metaSnapshotV2 is a snapshot with a queue table. A snapshot without one
// is the ring alone, as before queue settings, so that a node of an
// older build can still restore what a group that never had settings
// sends it.
type metaSnapshotV2 struct {
	Format int     `json:"meta_snapshot_format"`
	Ring   *Ring   `json:"ring"`
	Queues *Queues `json:"queues"`
	// Schedules (format 3) is the schedule table; a snapshot without one
	// is written as format 2, which a node from before schedules reads.
	Schedules *Schedules `json:"schedules,omitempty"`
}

func (f *metaFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var raw json.RawMessage
	if err := json.NewDecoder(rc).Decode(&raw); err != nil {
		return fmt.Errorf("cluster: meta snapshot: %w", err)
	}
	var v2 metaSnapshotV2
	if err := json.Unmarshal(raw, &v2); err != nil {
		return fmt.Errorf("cluster: meta snapshot: %w", err)
	}
	r, q, sc := v2.Ring, v2.Queues, v2.Schedules
	if v2.Format == 0 {
		r, q, sc = nil, nil, nil
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("cluster: meta snapshot: %w", err)
		}
	}
	if r != nil {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("cluster: meta snapshot: %w", err)
		}
	}
	if q != nil {
		if err := q.Validate(); err != nil {
			return fmt.Errorf("cluster: meta snapshot: %w", err)
		}
	}
	if sc != nil {
		if err := sc.Validate(); err != nil {
			return fmt.Errorf("cluster: meta snapshot: %w", err)
		}
	}
	f.mu.Lock()
	f.ring, f.queues, f.schedules = r, q, sc
	f.mu.Unlock()
	if r != nil && f.onRing != nil {
		f.onRing(r)
	}
	if q != nil && f.onQueues != nil {
		f.onQueues(q)
	}
	return nil
}

type metaSnapshot struct {
	ring      *Ring
	queues    *Queues
	schedules *Schedules
}

func (s metaSnapshot) Persist(sink raft.SnapshotSink) error {
	var v any = s.ring
	switch {
	case s.schedules != nil:
		v = metaSnapshotV2{Format: 3, Ring: s.ring, Queues: s.queues, Schedules: s.schedules}
	case s.queues != nil:
		v = metaSnapshotV2{Format: 2, Ring: s.ring, Queues: s.queues}
	}
	if err := json.NewEncoder(sink).Encode(v); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (metaSnapshot) Release() {}
