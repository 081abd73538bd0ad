package cluster

// What gossip carries and reports of each node: its metadata and its
// liveness.

import (
	"strconv"
	"time"
)

// NodeMeta is what a node tells the others about itself through gossip.
// Encoded, it must fit memberlist's metadata limit (512 bytes).
type NodeMeta struct {
	ID        string `json:"id"`
	APIAddr   string `json:"api"`
	RaftAddr  string `json:"raft"`
	RingEpoch uint64 `json:"epoch"`
	Version   string `json:"version"`
	// ClusterID names the cluster the node belongs to; empty until the
	// cluster is formed (set it then with UpdateMeta). Two nodes whose
	// cluster ids are both non-empty and differ refuse each other.
	ClusterID string `json:"cluster,omitempty"`
	// Leaving is set by Leave just before the goodbye, so that the others
	// tell a node that left from one that died (memberlist's events do
	// not say which).
	Leaving bool `json:"leaving,omitempty"`
	// Leaders is the node's last word on the partition groups it leads
	// (the leader balancer's input, replicas.LeaderBalancer); zero before
	// it has said any, and from a node that predates leader balancing.
	Leaders LeaderMeta `json:"leaders,omitzero"`
	// InClusterMs is the last time (Unix ms, the node's clock) the node
	// was in the cluster, as it keeps it in its data dir; 0 before it
	// has one, and from a node that predates it. A node whose mark is far
	// behind its peers' was out longer than the retention allows (the
	// node package's rejoin rule).
	InClusterMs int64 `json:"icm,omitempty"`
	// SkewBufferMs is the node's skew buffer (node.Config.SkewBuffer), so
	// that a leader expiring a lease waits the largest buffer in the
	// cluster, not only its own, while settings differ (a rolling
	// change). Zero from a node that predates it.
	SkewBufferMs int64 `json:"skew_ms,omitempty"`
	// Incarnation names the node's data dir (incarnation.go), for the
	// ring's record of it at formation and join. Empty from a node that
	// predates it.
	Incarnation string `json:"inc,omitempty"`
	// Security is how the node's ports are secured and whether it
	// enforces an access file (and which), for every node's Status: a
	// node started without the settings the others have shows. Zero from
	// a node that predates it.
	Security SecurityMeta `json:"sec,omitzero"`
	// Features are the Feature bits of what the node's build can apply
	// (Raft entries, records and task encodings of a newer kind). A
	// leader uses a feature only once every ring member says it has it,
	// so that a rolling upgrade never feeds a node what it cannot read.
	// Zero from a node that predates them all.
	Features uint64 `json:"feat,omitempty"`
	// QueuesVersion is the version of the queue settings table the node
	// applies (Queues.Version): a node that sees a newer one pulls it.
	// Zero before any queue has settings.
	QueuesVersion uint64 `json:"qv,omitempty"`
}

// Features (NodeMeta.Features).
const (
	// FeatureRetries: retry policies, retryable aborts and DEAD tasks
	// (claim FSM entries and records of version 2, the task encoding's
	// retry policy, failures and DEAD kind; issue 43).
	FeatureRetries uint64 = 1 << 0
	// FeatureQueues: queue settings in the meta group (meta entries and
	// snapshots with a queue table; queues.go).
	FeatureQueues uint64 = 1 << 1
	// FeatureDeadlines: task deadlines (the task encoding's deadline,
	// claim FSM entries of version 3: candidates with deadlines and
	// OpDeadline).
	FeatureDeadlines uint64 = 1 << 2
	// FeatureRetention: per-queue retention (QueueSettings.RetentionMs
	// deletes a queue's terminal tasks at its own horizon; anti-entropy
	// rounds agree on per-queue horizons).
	FeatureRetention uint64 = 1 << 3
	// FeatureUnique: unique keys (the task encoding's unique key, the
	// claim FSM's OpUnique and its records, PeerService.UniqueKeys).
	FeatureUnique uint64 = 1 << 4
	// FeatureSchedules: schedules (the meta group's schedule commands and
	// snapshot format 3, AdminService's schedule calls).
	FeatureSchedules uint64 = 1 << 5
	// FeatureFairness: fairness keys (the task encoding's fairness key
	// and weight, ReadyHead's key and weight).
	FeatureFairness uint64 = 1 << 6
	// FeaturesBuilt are the features this build has.
	FeaturesBuilt = FeatureRetries | FeatureQueues | FeatureDeadlines | FeatureRetention | FeatureUnique | FeatureSchedules | FeatureFairness
)

// SecurityMeta is what a node gossips about its security settings.
type SecurityMeta struct {
	TLS             bool `json:"tls,omitempty"`
	GossipEncrypted bool `json:"ge,omitempty"`
	// Access is the digest of the access file the node enforces
	// (access.Rules.Digest); "" without one.
	Access string `json:"acl,omitempty"`
	// Known is set by every node that gossips its settings, so that a
	// node without TLS or an access file tells from one that says
	// nothing.
	Known bool `json:"k,omitempty"`
}

// LeaderMeta is what a node gossips about its partition leaderships.
type LeaderMeta struct {
	// Count is how many partition groups the node leads.
	Count int `json:"n"`
	// NoLead is set while the node may not lead (its clock guard
	// refuses), and from when it starts handing its leaderships over to
	// stop (replicas.LeaderBalancer.HandOver): no one hands it a
	// leadership.
	NoLead bool `json:"no,omitempty"`
	// Seq grows by one with every change the node gossips (from 1 at
	// every start), so a reader tells a newer word from one it has seen.
	Seq uint64 `json:"seq"`
}

// MemberState is a member's liveness as gossip sees it.
type MemberState int

// Member states.
const (
	StateAlive MemberState = iota
	// StateSuspect: this node's memberlist probed the member, got no
	// answer (direct, indirect or TCP) and suspects it; it turns dead
	// when the suspicion times out, back to alive when the member answers
	// a probe again. See Members for what is and is not seen.
	StateSuspect
	StateDead
	StateLeft // left on purpose (Leave)
)

// Up reports whether gossip holds the member to be running: alive, or
// suspect (a missed probe is not yet a death; requests and Raft traffic
// still go to it).
func (s MemberState) Up() bool { return s == StateAlive || s == StateSuspect }

func (s MemberState) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateSuspect:
		return "suspect"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	}
	return "MemberState(" + strconv.Itoa(int(s)) + ")"
}

// Member is one node as gossip last saw it.
type Member struct {
	NodeMeta
	GossipAddr string // host:port of its memberlist
	State      MemberState
	// ClockOffset is the member's wall clock minus this node's, estimated
	// from probe round trips (positive: its clock is ahead). Valid only if
	// OffsetKnown; this node's own member has 0, known. The error of an
	// estimate is at most half the round trip it came from (see
	// offsetWindow): OffsetError.
	ClockOffset time.Duration
	OffsetKnown bool
	// OffsetError bounds the error of ClockOffset: half the round trip of
	// the probe the estimate came from. 0 for this node's own member.
	OffsetError time.Duration
	// OffsetAt is when the newest clock sample of the member was taken
	// (monotonic); zero for this node's own member.
	OffsetAt time.Time
}
