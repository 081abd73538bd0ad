package node

import (
	"fmt"
	"slices"
	"strings"
)

// TestBugs are seeded bugs for the Jepsen harness (nornd -test-bug), there
// to show that the harness finds what they break. Test-only: production
// leaves them all off.
type TestBugs struct {
	// ClaimNoCheck ("claim-no-check"): the claim FSM grants a claim of a
	// task that already has a live claim (claims.Bugs.ClaimNoCheck).
	ClaimNoCheck bool
	// AckBeforeSync ("ack-before-sync"): task writes commit without
	// waiting for the WAL sync (storage.Config.AckBeforeSync), so a power
	// loss loses acknowledged writes.
	AckBeforeSync bool
	// ExpiryNoSkew ("expiry-no-skew"): the leader expires claims at their
	// expiry, ignoring the skew buffer.
	ExpiryNoSkew bool
	// DropReplicatedWrite ("drop-replicated-write"): every 20th incoming
	// PeerService.Replicate request is acknowledged without storing its
	// tasks.
	DropReplicatedWrite bool
	// CountDrift ("count-drift"): the task counters miss the claim FSM's
	// moves (storage.Config.CountDrift), so claimed and ended tasks are
	// counted wrong.
	CountDrift bool
	// ActNoFence ("act-no-fence"): the claim FSM takes a worker's
	// complete, abort, yield or update under any claim of the task, not
	// only the live one (claims.Bugs.ActNoFence): a superseded worker
	// completes a task another worker holds.
	ActNoFence bool
	// RetryNoBackoff ("retry-no-backoff"): the claim FSM makes a task
	// whose attempt failed claimable again at once, whatever its retry
	// policy's backoff (claims.Bugs.RetryNoBackoff).
	RetryNoBackoff bool
	// RetryCompleted ("retry-completed"): a Retry of a COMPLETED task
	// is taken, by the API and by the claim FSM
	// (claims.Bugs.ReviveCompleted): a finished task is handed out again.
	RetryCompleted bool
	// UniqueAfterWrite ("unique-after-write"): an enqueue with a unique
	// key writes its task before it has the key's partition take the
	// key, and leaves it when another task holds the key
	// (server.Config.UniqueAfterWrite): two live tasks share a key.
	UniqueAfterWrite bool
	// ScheduleRandomID ("schedule-random-id"): a schedule's tick writes
	// its task under a fresh id each time (server.Config.ScheduleRandomID),
	// not the one the schedule and the tick make: a tick a second leader
	// runs again makes a second task.
	ScheduleRandomID bool
	// ActLocal ("act-local"): a node that does not lead a task's
	// partition decides a complete, abort, yield or update under a claim
	// from its own copy of the claim state and writes it at the call's w
	// (server.Config.ActLocal), as before the fence: a replica cut off
	// from its leader takes a superseded worker's complete.
	ActLocal bool
	// EndAfterWrite ("end-after-write"): a complete or abort is decided
	// by the partition's leader from its own copy of the claim state and
	// written at the call's w as a CRDT; the claim's end follows a second
	// later as an entry of its own, dropped if the node no longer leads
	// (server.Config.EndAfterWrite), as before the fence: a replica that
	// missed the write and leads next hands the finished task out again.
	EndAfterWrite bool
	// TLSAnyClient ("tls-any-client"): the node's TLS listeners (API and
	// Raft ports) take a client certificate of any CA and believe the
	// identity it names (transport.Certs.AcceptAnyClient).
	TLSAnyClient bool
	// SkewOneOffset ("skew-one-offset"): config validation takes any skew
	// buffer above the max clock offset, the rule before issue 41,
	// instead of above 2 × max clock offset + the measurement error; so
	// two nodes whose clocks are in bound can be further apart than the
	// buffer covers.
	SkewOneOffset bool
	// ClaimLocalFirst ("claim-local-first"): a claim serves the partitions
	// its node leads first and asks the other leaders only for what is
	// left, without weighing their heads (dispatch.Config.ClaimLocalFirst),
	// as before priority was strict across the cluster.
	ClaimLocalFirst bool
	// CapStaleCount ("cap-stale-count"): a capped queue's owner checks
	// the cap against a count it reads at most once a second, blind to
	// the claims under way (dispatch.Config.CapStaleCount): concurrent
	// claims overshoot the cap.
	CapStaleCount bool
	// DeadlineUnfenced ("deadline-unfenced"): deadlines are enforced by
	// the monitor's cancel of waiting tasks alone: claims, renews and
	// acts past a deadline are taken (claims.Bugs.DeadlineUnfenced), the
	// dispatcher does not check candidates, and the monitor leaves
	// claimed tasks alone (dispatch.Config.DeadlineUnfenced): a task
	// claimed before its deadline runs past it and completes.
	DeadlineUnfenced bool
	// RetentionFromEnqueue ("retention-from-enqueue"): the retention
	// index keys a terminal task by its enqueue time instead of the time
	// it ended (storage.Config.RetentionFromEnqueue): a task that waited
	// or ran long is deleted before its retention has passed.
	RetentionFromEnqueue bool
	// FairIgnoresKeys ("fair-ignores-keys"): a claim weighs the heads of
	// several partitions by priority and id alone, blind to their
	// fairness keys (dispatch.Config.FairIgnoresKeys); each partition
	// still serves its keys in turn, but a key's new task waits behind
	// every older task of the other keys in the other partitions.
	FairIgnoresKeys bool
}

// testBugs maps the names of -test-bug to their fields.
var testBugs = map[string]func(*TestBugs) *bool{
	"claim-no-check":         func(b *TestBugs) *bool { return &b.ClaimNoCheck },
	"ack-before-sync":        func(b *TestBugs) *bool { return &b.AckBeforeSync },
	"expiry-no-skew":         func(b *TestBugs) *bool { return &b.ExpiryNoSkew },
	"drop-replicated-write":  func(b *TestBugs) *bool { return &b.DropReplicatedWrite },
	"count-drift":            func(b *TestBugs) *bool { return &b.CountDrift },
	"tls-any-client":         func(b *TestBugs) *bool { return &b.TLSAnyClient },
	"act-no-fence":           func(b *TestBugs) *bool { return &b.ActNoFence },
	"retry-no-backoff":       func(b *TestBugs) *bool { return &b.RetryNoBackoff },
	"retry-completed":        func(b *TestBugs) *bool { return &b.RetryCompleted },
	"unique-after-write":     func(b *TestBugs) *bool { return &b.UniqueAfterWrite },
	"schedule-random-id":     func(b *TestBugs) *bool { return &b.ScheduleRandomID },
	"act-local":              func(b *TestBugs) *bool { return &b.ActLocal },
	"end-after-write":        func(b *TestBugs) *bool { return &b.EndAfterWrite },
	"skew-one-offset":        func(b *TestBugs) *bool { return &b.SkewOneOffset },
	"claim-local-first":      func(b *TestBugs) *bool { return &b.ClaimLocalFirst },
	"cap-stale-count":        func(b *TestBugs) *bool { return &b.CapStaleCount },
	"deadline-unfenced":      func(b *TestBugs) *bool { return &b.DeadlineUnfenced },
	"retention-from-enqueue": func(b *TestBugs) *bool { return &b.RetentionFromEnqueue },
	"fair-ignores-keys":      func(b *TestBugs) *bool { return &b.FairIgnoresKeys },
}

// TestBugNames returns the names ParseTestBugs accepts, sorted.
func TestBugNames() []string {
	names := make([]string, 0, len(testBugs))
	for name := range testBugs {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// ParseTestBugs parses a comma-separated list of seeded bug names (empty
// items are ignored). An unknown name is an error that lists the valid
// ones.
func ParseTestBugs(list string) (TestBugs, error) {
	var b TestBugs
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		field, ok := testBugs[name]
		if !ok {
			return TestBugs{}, fmt.Errorf("unknown test bug %q (valid: %s)", name, strings.Join(TestBugNames(), ", "))
		}
		*field(&b) = true
	}
	return b, nil
}

// Any reports whether any bug is on.
func (b TestBugs) Any() bool { return b != TestBugs{} }
