package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
)

// foreignClusterError is a refusal of node, whose cluster is cluster, by
// this node of cluster local. It wraps ErrOtherCluster.
type foreignClusterError struct{ node, cluster, local string }

// refusingSuffix ends every foreignClusterError's text; memberlist's own
// log lines that repeat such an error are dropped (see memberlistLog).
const refusingSuffix = "; refusing it"

func (e *foreignClusterError) Error() string {
	return fmt.Sprintf("cluster: node %q belongs to cluster %s, this node to cluster %s%s", e.node, e.cluster, e.local, refusingSuffix)
}

func (e *foreignClusterError) Unwrap() error { return ErrOtherCluster }

// MembershipConfig configures a Membership.
type MembershipConfig struct {
	// Meta is this node's metadata; Meta.ID is its memberlist name and
	// must be unique in the cluster.
	Meta NodeMeta
	// SecretKey, when set (16, 24 or 32 bytes), encrypts and
	// authenticates every gossip message with memberlist's AES-GCM
	// keyring: a node without the key can neither read the cluster's
	// gossip nor be heard (docs/SECURITY.md). Nil: cleartext.
	SecretKey []byte
	// BindAddr is the gossip address, host:port (TCP and UDP); port 0
	// picks one (tests).
	BindAddr string
	// Logger receives memberlist's log lines, and one warning per peer
	// refused for belonging to another cluster (memberlist's own lines
	// about such refusals are left out). Default: discard.
	Logger hclog.Logger
	// Clock is the wall clock sent to peers in probe acks and used to
	// estimate their clock offsets (Member.ClockOffset). Default: the
	// system clock.
	Clock Clock
	// LAN picks memberlist's LAN timings (probe every second, gossip
	// every 200 ms, a dead node noticed within seconds); false picks its
	// local (loopback) timings, a little faster.
	LAN bool
	// DeadNodeReclaim is how long a member must have been dead before
	// its id may come back from another gossip address (memberlist's
	// DeadNodeReclaimTime); a member that left (Leave: a node stopped
	// cleanly) may come back from another address at once. Until then
	// memberlist refuses the id at the new address, so one id is never
	// two live members. Default DefaultDeadNodeReclaim.
	DeadNodeReclaim time.Duration

	tune func(*memberlist.Config) // tests: faster failure detection
}

// Membership is this node's view of the cluster's members.
//
// Lock order: memberlist's internal locks, then mu. Membership never calls
// memberlist while holding mu (memberlist calls the delegates, which take
// mu, with its own locks held).
type Membership struct {
	ml      *memberlist.Memberlist
	addr    string // gossip address, host:port (Addr)
	changed chan struct{}
	clock   Clock
	steps   stepMeter // this node's clock steps, to correct offsets
	logger  hclog.Logger
	joinMu  sync.Mutex // one Join at a time, so refusals go to its seeds

	updateMu sync.Mutex // serializes UpdateMeta (see there)
	mu       sync.Mutex
	meta     NodeMeta
	members  map[string]*peer // by node id, including dead and left ones
	// refused holds the nodes refused as members of another cluster
	// (logged once each; hidden from Members) until one shows this
	// node's cluster id or (re)joins; see admit.
	refused map[string]foreignClusterError
	// joinRefusals collects NotifyMerge's refusals while Join runs (nil
	// otherwise).
	joinRefusals *[]error
}

// peer is what Membership keeps about one node.
type peer struct {
	Member       // State is alive, dead or left; suspect is kept apart
	suspect bool // memberlist suspects it (meaningful while alive)
	offsets offsetWindow
}

// DefaultDeadNodeReclaim is MembershipConfig.DeadNodeReclaim's default:
// longer than memberlist takes to declare a node dead that is only slow
// (suspicion on a LAN takes seconds), far shorter than a rescheduled pod
// takes to come back.
const DefaultDeadNodeReclaim = 10 * time.Second

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
	m := &Membership{
		changed: make(chan struct{}, 1),
		clock:   cfg.Clock,
		logger:  cfg.Logger,
		meta:    cfg.Meta,
		members: map[string]*peer{},
		refused: map[string]foreignClusterError{},
	}
	if m.clock == nil {
		m.clock = systemClock{}
	}
	m.steps = newStepMeter(m.clock.Now())
	if m.logger == nil {
		m.logger = hclog.NewNullLogger()
	}
	mc := memberlist.DefaultLocalConfig()
	if cfg.LAN {
		mc = memberlist.DefaultLANConfig()
	}
	mc.Name = cfg.Meta.ID
	mc.DeadNodeReclaimTime = cfg.DeadNodeReclaim
	if mc.DeadNodeReclaimTime <= 0 {
		mc.DeadNodeReclaimTime = DefaultDeadNodeReclaim
	}
	mc.BindAddr, mc.BindPort = host, port
	if cfg.SecretKey != nil {
		mc.SecretKey = cfg.SecretKey
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	mc.AdvertiseAddr, mc.AdvertisePort = "", 0
	mc.Delegate = (*delegate)(m)
	mc.Events = (*events)(m)
	mc.Merge = (*clusterFilter)(m)
	mc.Alive = (*clusterFilter)(m)
	mc.Ping = (*pinger)(m)
	mc.Logger = log.New(&memberlistLog{m: m, out: m.logger.StandardWriter(&hclog.StandardLoggerOptions{InferLevels: true})}, "", 0)
	if cfg.tune != nil {
		cfg.tune(mc)
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("cluster: start gossip on %s: %w", cfg.BindAddr, err)
	}
	m.ml = ml
	// Read once: memberlist's LocalNode is its live record, which
	// UpdateMeta rewrites without a lock a reader could take.
	n := ml.LocalNode()
	m.addr = net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	return m, nil
}

// Addr is this node's gossip address (host:port), for others to Join.
func (m *Membership) Addr() string { return m.addr }

// Join contacts the gossip addresses in turn and returns how many answered
// and merged; an error only when none did. If seeds refused because they
// belong to another cluster, the error wraps ErrOtherCluster and names
// both cluster ids. (A node of another cluster that tries to join this one
// while Join runs may be reported among them.)
func (m *Membership) Join(addrs []string) (int, error) {
	if len(addrs) == 0 {
		return 0, errors.New("cluster: join: no gossip addresses")
	}
	m.joinMu.Lock()
	defer m.joinMu.Unlock()
	joined := 0
	var errs []error
	for _, addr := range addrs {
		var refusals []error
		m.mu.Lock()
		m.joinRefusals = &refusals
		m.mu.Unlock()
		n, err := m.ml.Join([]string{addr})
		m.mu.Lock()
		m.joinRefusals = nil
		m.mu.Unlock()
		joined += n
		switch {
		case n > 0:
		case len(refusals) > 0:
			// memberlist flattens NotifyMerge's error to text: use ours.
			errs = append(errs, fmt.Errorf("failed to join %s: %w", addr, errors.Join(refusals...)))
		default:
			errs = append(errs, flatten(err)...)
		}
	}
	if joined > 0 {
		return joined, nil
	}
	return 0, fmt.Errorf("cluster: join: %w", errors.Join(errs...))
}

// flatten unpacks memberlist's multierror (go-multierror's Error) into its
// errors, for a readable joined message.
func flatten(err error) []error {
	if me, ok := err.(interface{ WrappedErrors() []error }); ok {
		return me.WrappedErrors()
	}
	if err == nil {
		return []error{errors.New("no answer")}
	}
	return []error{err}
}

// Changed signals (coalesced) that some member changed: joined, left,
// died, came back, became suspect or stopped being suspect, or updated its
// metadata. Clock offsets change without a signal. Read Members after it.
func (m *Membership) Changed() <-chan struct{} { return m.changed }

// Members returns every node gossip has seen, this one included, dead and
// left ones too, sorted by id. Nodes refused as members of another cluster
// are left out.
//
// A member is suspect when this node's memberlist has suspected it after
// one of its own probes failed, and no later probe has reached it.
// memberlist v0.7.0 does not expose its suspicion (Node.State is never
// set; see the events type), so suspicion that reaches this node only by
// gossip from other nodes' probes is not seen: such a member reads alive
// until it is declared dead or this node's own probe of it fails too.
func (m *Membership) Members() []Member {
	step := m.steps.step(m.clock.Now())
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Member, 0, len(m.members))
	for id, p := range m.members {
		if _, ok := m.refused[id]; ok {
			continue
		}
		mb := p.Member
		if mb.State == StateAlive && p.suspect {
			mb.State = StateSuspect
		}
		if id == m.meta.ID {
			mb.ClockOffset, mb.OffsetKnown = 0, true
		} else {
			mb.ClockOffset, mb.OffsetKnown = p.offsets.estimate(step)
			if b, ok := p.offsets.best(); ok {
				mb.OffsetError = b.rtt / 2
			}
			mb.OffsetAt = p.offsets.at
		}
		out = append(out, mb)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// UpdateMeta changes this node's metadata (for example its ring epoch, or
// its cluster id once the cluster is formed) and gossips it, waiting up to
// timeout for the broadcast to reach a member. The id cannot change.
func (m *Membership) UpdateMeta(update func(*NodeMeta), timeout time.Duration) error {
	// memberlist's UpdateNode is not safe to call concurrently (the race
	// detector caught the leader balancer's and the reconcile loop's
	// calls racing inside it): one update at a time.
	m.updateMu.Lock()
	defer m.updateMu.Unlock()
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
//
// A goodbye that no member took in time is not an error of the node's
// stop: none may be left to take it (a whole cluster stopping at once,
// where it made nornd exit 1) or gossip is slow; the others then find
// the node dead instead of left. It is logged.
func (m *Membership) Leave(timeout time.Duration) error {
	if err := m.UpdateMeta(func(meta *NodeMeta) { meta.Leaving = true }, timeout); err != nil {
		m.logger.Warn("the leaving mark reached no member in time", "err", err)
	}
	if err := m.ml.Leave(timeout); err != nil {
		m.logger.Warn("the goodbye reached no member in time; the others will see this node dead, not left", "err", err)
	}
	return m.ml.Shutdown()
}

// Shutdown stops gossip without a goodbye (the others will see it dead).
func (m *Membership) Shutdown() error { return m.ml.Shutdown() }

// signal tells Changed's reader that something changed; it never blocks.
func (m *Membership) signal() {
	select {
	case m.changed <- struct{}{}:
	default: // a signal is pending already
	}
}

// note records n as alive (it joined, came back or updated its metadata),
// or as gone (dead, or left when its last metadata said it was leaving),
// and signals a change. A node that joins (again) starts with no suspicion
// and no clock samples (it may have restarted on another clock), and is
// no longer refused (memberlist accepted it: admit let it through).
func (m *Membership) note(n *memberlist.Node, joined, gone bool) {
	mb := Member{GossipAddr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))}
	mb.NodeMeta = decodeMeta(n)
	switch {
	case !gone:
		mb.State = StateAlive
	case mb.Leaving:
		mb.State = StateLeft
	default:
		mb.State = StateDead
	}
	m.mu.Lock()
	p := m.members[mb.ID]
	if p == nil || joined {
		p = &peer{}
		m.members[mb.ID] = p
	}
	if joined {
		delete(m.refused, mb.ID) // memberlist admitted it afresh
	}
	p.Member = mb
	p.suspect = false // alive again (newer alive message), or gone
	m.mu.Unlock()
	m.signal()
}

// decodeMeta is n's NodeMeta; a node that is not one of ours, or sends
// corrupt metadata, keeps its name and shows nothing else.
func decodeMeta(n *memberlist.Node) NodeMeta {
	var meta NodeMeta
	if err := json.Unmarshal(n.Meta, &meta); err != nil || meta.ID != n.Name {
		return NodeMeta{ID: n.Name}
	}
	return meta
}

// noteSuspect records that memberlist suspects the node named name.
func (m *Membership) noteSuspect(name string) {
	m.mu.Lock()
	p := m.members[name]
	changed := p != nil && p.State == StateAlive && !p.suspect
	if changed {
		p.suspect = true
	}
	m.mu.Unlock()
	if changed {
		m.signal()
	}
}

// events is memberlist's EventDelegate; it never blocks. memberlist calls
// it for joins (first seen, or back from dead or left), metadata updates
// and deaths or leaves, never for suspicion; and the Node.State it passes
// (like the one Memberlist.Members returns) is never set in v0.7.0: the
// state lives in an unexported nodeState.State that shadows it
// (hashicorp/memberlist issue 266). Suspicion comes from memberlistLog.
type events Membership

func (e *events) NotifyJoin(n *memberlist.Node)   { (*Membership)(e).note(n, true, false) }
func (e *events) NotifyLeave(n *memberlist.Node)  { (*Membership)(e).note(n, false, true) }
func (e *events) NotifyUpdate(n *memberlist.Node) { (*Membership)(e).note(n, false, false) }

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

// clusterFilter is memberlist's MergeDelegate and AliveDelegate: it keeps
// nodes of another cluster out. NotifyMerge runs when a join's push/pull
// would merge a peer's member list (on both sides of the join; an error
// fails the join); NotifyAlive on every alive message about a node, which
// covers the periodic push/pull that NotifyMerge does not see. A node
// memberlist admitted before the ids differed stays in memberlist (it
// cannot evict), but its later updates are refused and Members hides it.
type clusterFilter Membership

func (f *clusterFilter) NotifyMerge(peers []*memberlist.Node) error {
	m := (*Membership)(f)
	var first error
	for _, n := range peers {
		if err := m.admit(n); err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		m.mu.Lock()
		if m.joinRefusals != nil {
			*m.joinRefusals = append(*m.joinRefusals, first)
		}
		m.mu.Unlock()
	}
	return first
}

func (f *clusterFilter) NotifyAlive(n *memberlist.Node) error { return (*Membership)(f).admit(n) }

// admit returns a *foreignClusterError if n's cluster id and this node's
// are both non-empty and differ, logging it the first time for n (and
// again only if either id changes or n was cleared in between).
//
// A refused node stays refused when a message without a cluster id is
// accepted for it: that may be stale news from before it took the other
// id (memberlist would drop it by incarnation after admit, and nodes that
// refused the node's update keep gossiping its old metadata). It is
// cleared when it shows this node's cluster id, when this node has none,
// or when it (re)joins (note).
func (m *Membership) admit(n *memberlist.Node) error {
	cluster := decodeMeta(n).ClusterID
	m.mu.Lock()
	local := m.meta.ClusterID
	if cluster == "" || local == "" || cluster == local {
		_, wasRefused := m.refused[n.Name]
		unrefuse := wasRefused && (local == "" || cluster == local)
		if unrefuse {
			delete(m.refused, n.Name)
		}
		m.mu.Unlock()
		if unrefuse {
			m.signal() // Members shows it again
		}
		return nil
	}
	refusal := foreignClusterError{node: n.Name, cluster: cluster, local: local}
	prev, seen := m.refused[n.Name]
	m.refused[n.Name] = refusal
	_, member := m.members[n.Name]
	m.mu.Unlock()
	if !seen || prev != refusal {
		m.logger.Warn("refusing a node of another cluster", "node", n.Name, "cluster", cluster, "local_cluster", local)
		if member {
			m.signal() // Members hides it now
		}
	}
	return &refusal
}

// memberlistLog is the writer behind memberlist's logger. It passes each
// line on to the hclog logger, except memberlist's repetitions of a
// refusal (admit logs each once), and it watches for the line that is
// memberlist's only report of suspecting a node: probeNode (state.go, v0.7.0)
// logs "Suspect <name> has failed, no acks received" right before marking
// it suspect. TestMembershipSuspect fails if a memberlist upgrade changes
// that line.
type memberlistLog struct {
	m   *Membership
	out io.Writer
}

var (
	suspectPrefix = []byte("[INFO] memberlist: Suspect ")
	suspectSuffix = []byte(" has failed, no acks received")
)

func (w *memberlistLog) Write(line []byte) (int, error) {
	text := bytes.TrimSuffix(line, []byte("\n"))
	if name, ok := bytes.CutPrefix(text, suspectPrefix); ok {
		if name, ok := bytes.CutSuffix(name, suspectSuffix); ok {
			w.m.noteSuspect(string(name))
		}
	}
	if bytes.Contains(text, []byte(refusingSuffix)) {
		return len(line), nil
	}
	return w.out.Write(line)
}
