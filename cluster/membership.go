package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
)

// NodeMeta is what a node tells the others about itself through gossip.
// Encoded, it must fit memberlist's metadata limit (512 bytes).
type NodeMeta struct {
	ID        string `json:"id"`
	APIAddr   string `json:"api"`
	RaftAddr  string `json:"raft"`
	RingEpoch uint64 `json:"epoch"`
	Version   string `json:"version"`
	ClusterID string `json:"cluster,omitempty"`
	// Leaving is set by Leave just before the goodbye, so that the others
	// tell a node that left from one that died (memberlist's events do
	// not say which).
	Leaving bool `json:"leaving,omitempty"`
}

// MemberState is a member's liveness as gossip sees it.
type MemberState int

// Member states. (Suspect, between alive and dead, is not reported yet:
// memberlist's events do not expose it.)
const (
	StateAlive MemberState = iota
	StateDead
	StateLeft // left on purpose (Leave)
)

func (s MemberState) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateDead:
		return "dead"
	}
	return "left"
}

// Member is one node as gossip last saw it.
type Member struct {
	NodeMeta
	GossipAddr string // host:port of its memberlist
	State      MemberState
}

// MembershipConfig configures a Membership.
type MembershipConfig struct {
	// Meta is this node's metadata; Meta.ID is its memberlist name and
	// must be unique in the cluster.
	Meta NodeMeta
	// BindAddr is the gossip address, host:port (TCP and UDP); port 0
	// picks one (tests).
	BindAddr string
	// Logger receives memberlist's log lines. Default: discard.
	Logger hclog.Logger
	// LAN picks memberlist's LAN timings (probe every second, gossip
	// every 200 ms, a dead node noticed within seconds); false picks its
	// local (loopback) timings, a little faster.
	LAN bool

	tune func(*memberlist.Config) // tests: faster failure detection
}

// Membership is this node's view of the cluster's members.
type Membership struct {
	ml      *memberlist.Memberlist
	changed chan struct{}

	mu      sync.Mutex
	meta    NodeMeta
	members map[string]Member // by node id, including dead and left ones
}

// maxMetaBytes is memberlist's metadata limit.
const maxMetaBytes = memberlist.MetaMaxSize

// StartMembership starts gossiping on cfg.BindAddr. It joins nobody: call
// Join.
func StartMembership(cfg MembershipConfig) (*Membership, error) {
	if cfg.Meta.ID == "" {
		return nil, errors.New("cluster: membership needs a node id")
	}
	if b, err := json.Marshal(cfg.Meta); err != nil || len(b) > maxMetaBytes {
		return nil, fmt.Errorf("cluster: node metadata must encode to at most %d bytes (%d, %v)", maxMetaBytes, len(b), err)
	}
	host, portStr, err := net.SplitHostPort(cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("cluster: gossip address %q: %w", cfg.BindAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("cluster: gossip address %q: bad port", cfg.BindAddr)
	}
	m := &Membership{changed: make(chan struct{}, 1), meta: cfg.Meta, members: map[string]Member{}}
	mc := memberlist.DefaultLocalConfig()
	if cfg.LAN {
		mc = memberlist.DefaultLANConfig()
	}
	mc.Name = cfg.Meta.ID
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertiseAddr, mc.AdvertisePort = "", 0
	mc.Delegate = (*delegate)(m)
	mc.Events = (*events)(m)
	logger := cfg.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	mc.Logger = logger.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	if cfg.tune != nil {
		cfg.tune(mc)
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("cluster: start gossip on %s: %w", cfg.BindAddr, err)
	}
	m.ml = ml
	return m, nil
}

// Addr is this node's gossip address (host:port), for others to Join.
func (m *Membership) Addr() string {
	n := m.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Join contacts the gossip addresses and returns how many answered; an
// error only when none did.
func (m *Membership) Join(addrs []string) (int, error) {
	n, err := m.ml.Join(addrs)
	if n > 0 {
		return n, nil
	}
	return 0, fmt.Errorf("cluster: join %v: %w", addrs, err)
}

// Changed signals (coalesced) that some member changed: joined, left,
// died, came back, or updated its metadata. Read Members after it.
func (m *Membership) Changed() <-chan struct{} { return m.changed }

// Members returns every node gossip has seen, this one included, dead and
// left ones too, sorted by id.
func (m *Membership) Members() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Member, 0, len(m.members)+1)
	for _, mb := range m.members {
		out = append(out, mb)
	}
	slices.SortFunc(out, func(a, b Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// UpdateMeta changes this node's metadata (for example its ring epoch) and
// gossips it, waiting up to timeout for the broadcast to reach a member.
// The id cannot change.
func (m *Membership) UpdateMeta(update func(*NodeMeta), timeout time.Duration) error {
	m.mu.Lock()
	next := m.meta
	update(&next)
	if next.ID != m.meta.ID {
		m.mu.Unlock()
		return errors.New("cluster: a node's id cannot change")
	}
	if b, err := json.Marshal(next); err != nil || len(b) > maxMetaBytes {
		m.mu.Unlock()
		return fmt.Errorf("cluster: node metadata must encode to at most %d bytes", maxMetaBytes)
	}
	m.meta = next
	m.mu.Unlock()
	return m.ml.UpdateNode(timeout)
}

// Leave tells the others this node is leaving on purpose (they will see
// it as left, not dead), waiting up to timeout for each of the two
// broadcasts, then stops gossip.
func (m *Membership) Leave(timeout time.Duration) error {
	err := m.UpdateMeta(func(meta *NodeMeta) { meta.Leaving = true }, timeout)
	err = errors.Join(err, m.ml.Leave(timeout))
	return errors.Join(err, m.ml.Shutdown())
}

// Shutdown stops gossip without a goodbye (the others will see it dead).
func (m *Membership) Shutdown() error { return m.ml.Shutdown() }

// note records n as alive (it joined or updated its metadata), or as gone
// (dead, or left when its last metadata said it was leaving), and signals a
// change.
func (m *Membership) note(n *memberlist.Node, gone bool) {
	mb := Member{GossipAddr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))}
	if err := json.Unmarshal(n.Meta, &mb.NodeMeta); err != nil || mb.ID != n.Name {
		// Not one of ours, or corrupt: keep its name, show no addresses.
		mb.NodeMeta = NodeMeta{ID: n.Name}
	}
	switch {
	case !gone:
		mb.State = StateAlive
	case mb.Leaving:
		mb.State = StateLeft
	default:
		mb.State = StateDead
	}
	m.mu.Lock()
	m.members[mb.ID] = mb
	m.mu.Unlock()
	select {
	case m.changed <- struct{}{}:
	default: // a signal is pending already
	}
}

// events is memberlist's EventDelegate; it never blocks.
type events Membership

func (e *events) NotifyJoin(n *memberlist.Node)   { (*Membership)(e).note(n, false) }
func (e *events) NotifyLeave(n *memberlist.Node)  { (*Membership)(e).note(n, true) }
func (e *events) NotifyUpdate(n *memberlist.Node) { (*Membership)(e).note(n, false) }

// delegate is memberlist's Delegate: it supplies this node's metadata.
// User messages and push/pull state are not used.
type delegate Membership

func (d *delegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	meta := d.meta
	d.mu.Unlock()
	b, err := json.Marshal(meta)
	if err != nil || len(b) > limit {
		return nil // checked in StartMembership and UpdateMeta
	}
	return b
}
func (d *delegate) NotifyMsg([]byte)                {}
func (d *delegate) GetBroadcasts(int, int) [][]byte { return nil }
func (d *delegate) LocalState(bool) []byte          { return nil }
func (d *delegate) MergeRemoteState([]byte, bool)   {}
