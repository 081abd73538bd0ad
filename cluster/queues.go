package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/norn-dev/norn/crdt"
)

// Queue settings (issue 43, docs/JOBQUEUE.md "Queues"): what an operator
// sets on a queue (paused, limits, defaults) lives in the meta Raft
// group next to the ring, one entry per change. Every node keeps the
// table it last learned in its data dir and gossips its version
// (NodeMeta.QueuesVersion); a node that sees a newer one pulls it (the
// meta group's voters apply it themselves), and the change's caller
// pushes it to every live node before it answers.

// QueueSettings are one queue's settings. The zero value is a queue as it
// is without any: not paused, no cap, no rate limit, the node's defaults.
type QueueSettings struct {
	// Paused: claims of the queue get nothing (long polls wait) until
	// it is resumed; enqueues and the ends of live claims go on.
	Paused bool `json:"paused,omitempty"`
	// MaxClaimed caps the tasks of the queue claimed at once, cluster
	// wide; 0 is no cap.
	MaxClaimed uint32 `json:"max_claimed,omitempty"`
	// ClaimRate caps the claims granted per second, cluster wide; 0 is
	// no limit.
	ClaimRate float64 `json:"claim_rate,omitempty"`
	// DefaultRetry is the retry policy of an enqueue that names none;
	// nil is the node's default.
	DefaultRetry *crdt.RetryPolicy `json:"default_retry,omitempty"`
	// DefaultLeaseMs is the lease of a claim that names none; 0 is the
	// node's default.
	DefaultLeaseMs int64 `json:"default_lease_ms,omitempty"`
	// RetentionMs is how long a terminal task of the queue is kept; 0
	// is the node's retention.
	RetentionMs int64 `json:"retention_ms,omitempty"`
}

// IsZero reports whether s sets nothing.
func (s QueueSettings) IsZero() bool {
	return !s.Paused && s.MaxClaimed == 0 && s.ClaimRate == 0 && s.DefaultRetry == nil && s.DefaultLeaseMs == 0 && s.RetentionMs == 0
}

// Settings bounds.
const (
	// MaxClaimRate bounds QueueSettings.ClaimRate (claims per second).
	MaxClaimRate = 1e6
	// MaxQueueDurationMs bounds the default lease and the retention: a
	// year.
	MaxQueueDurationMs = 366 * 24 * 3600 * 1000
	// MinQueueRetentionMs is the shortest retention a queue may have: an
	// hour (the API edge checks it; only the Jepsen harness's test hooks
	// lower it). A node out of the cluster longer than three quarters of
	// the shortest retention in force must be rebuilt (it could bring
	// back tasks deleted meanwhile; docs/OPERATIONS.md), and it gossips
	// its presence once a minute: a shorter retention would leave no
	// margin.
	MinQueueRetentionMs = 3600 * 1000
	// MaxQueues bounds how many queues have settings: the table is one
	// Raft entry's worth, and every node keeps it in memory.
	MaxQueues = 10_000
)

// ErrBadSettings is wrapped by QueueSettings.Validate's errors.
var ErrBadSettings = errors.New("cluster: invalid queue settings")

// Validate checks s's fields, naming the field.
func (s QueueSettings) Validate() error {
	switch {
	case s.ClaimRate < 0 || s.ClaimRate > MaxClaimRate || s.ClaimRate != s.ClaimRate:
		return fmt.Errorf("%w: claim_rate %v is outside (0, %v] (clear it for no limit)", ErrBadSettings, s.ClaimRate, float64(MaxClaimRate))
	case s.DefaultLeaseMs < 0 || s.DefaultLeaseMs > MaxQueueDurationMs:
		return fmt.Errorf("%w: default_lease %d ms is outside (0, %d] ms", ErrBadSettings, s.DefaultLeaseMs, int64(MaxQueueDurationMs))
	case s.RetentionMs < 0 || s.RetentionMs > MaxQueueDurationMs:
		return fmt.Errorf("%w: retention %d ms is outside (0, %d] ms", ErrBadSettings, s.RetentionMs, int64(MaxQueueDurationMs))
	}
	if s.DefaultRetry != nil {
		if err := s.DefaultRetry.Validate(); err != nil {
			return fmt.Errorf("%w: default_retry: %w", ErrBadSettings, err)
		}
	}
	return nil
}

// Queues is the table of queue settings at one version: the meta group's
// index of the entry that made it. A Queues is never modified once
// published; changes make a new one.
type Queues struct {
	// ClusterID is the cluster the table belongs to.
	ClusterID string `json:"cluster"`
	// Version is the meta group's log index of the last change; 0 for
	// the empty table.
	Version uint64 `json:"version"`
	// ByName holds the queues that have settings; a queue missing here
	// has the zero settings.
	ByName map[string]QueueSettings `json:"queues,omitempty"`
}

// Get returns queue's settings (the zero value when it has none). A nil
// Queues has none.
func (q *Queues) Get(queue string) QueueSettings {
	if q == nil {
		return QueueSettings{}
	}
	return q.ByName[queue]
}

// ByNameOK returns queue's settings and whether it has any.
func (q *Queues) ByNameOK(queue string) (QueueSettings, bool) {
	if q == nil {
		return QueueSettings{}, false
	}
	s, ok := q.ByName[queue]
	return s, ok
}

// VersionOf returns q's version, 0 for nil.
func (q *Queues) VersionOf() uint64 {
	if q == nil {
		return 0
	}
	return q.Version
}

// Names returns the queues that have settings, sorted.
func (q *Queues) Names() []string {
	if q == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(q.ByName))
}

// with returns a copy of q with queue's settings s at version v (a zero s
// removes the queue).
func (q *Queues) with(clusterID, queue string, s QueueSettings, v uint64) *Queues {
	out := &Queues{ClusterID: clusterID, Version: v, ByName: map[string]QueueSettings{}}
	if q != nil {
		maps.Copy(out.ByName, q.ByName)
	}
	if s.IsZero() {
		delete(out.ByName, queue)
	} else {
		out.ByName[queue] = s
	}
	return out
}

// Validate checks a table read from a peer or a file.
func (q *Queues) Validate() error {
	if len(q.ByName) > MaxQueues {
		return fmt.Errorf("%w: %d queues, at most %d", ErrBadSettings, len(q.ByName), MaxQueues)
	}
	for name, s := range q.ByName {
		if err := crdt.ValidateQueue("queue", name); err != nil {
			return fmt.Errorf("%w: %w", ErrBadSettings, err)
		}
		if err := s.Validate(); err != nil {
			return fmt.Errorf("queue %q: %w", name, err)
		}
	}
	return nil
}

// queuesFile is where a node keeps the last table it learned, in its data
// dir, so that a restarted node applies a pause before it has heard from
// anyone.
const queuesFile = "queues.json"

// LoadQueues reads the table kept in dir (nil when there is none).
func LoadQueues(dir string) (*Queues, error) {
	b, err := os.ReadFile(filepath.Join(dir, queuesFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var q Queues
	if err := json.Unmarshal(b, &q); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", filepath.Join(dir, queuesFile), err)
	}
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", filepath.Join(dir, queuesFile), err)
	}
	return &q, nil
}

// SaveQueues writes q to dir atomically and durably.
func SaveQueues(dir string, q *Queues) error {
	b, err := json.MarshalIndent(q, "", " ")
	if err != nil {
		return err
	}
	return writeDurably(dir, queuesFile, b)
}
