package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
	"github.com/norn-dev/norn/transport"
)

func TestParseTestBugs(t *testing.T) {
	b, err := ParseTestBugs(" claim-no-check,ack-before-sync,,expiry-no-skew,drop-replicated-write ")
	if err != nil {
		t.Fatal(err)
	}
	if b != (TestBugs{ClaimNoCheck: true, AckBeforeSync: true, ExpiryNoSkew: true, DropReplicatedWrite: true}) {
		t.Fatalf("all four: %+v", b)
	}
	if b, err := ParseTestBugs(""); err != nil || b.Any() {
		t.Fatalf("empty list: %+v, %v", b, err)
	}
	_, err = ParseTestBugs("claim-no-check,nope")
	if err == nil || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), "drop-replicated-write") {
		t.Fatalf("unknown name: %v, want it named and the valid names listed", err)
	}
}

// TestSeededBugExpiryNoSkew: a claim past its expiry but within the skew
// buffer is expired by the monitor only with the seeded bug.
func TestSeededBugExpiryNoSkew(t *testing.T) {
	for _, bug := range testhooks.BugCases() {
		t.Run(fmt.Sprint("bug=", bug), func(t *testing.T) {
			h := newHarnessWith(t, t.TempDir(), nil, func(c *Config) { c.TestBugs.ExpiryNoSkew = bug })
			id := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
			h.claim("q", 1, 10*time.Second)
			h.clock.advance(10*time.Second + time.Millisecond) // past the expiry, within the skew buffer
			h.node.dispatch.MonitorOnce()
			want := nornv1.TaskStatus_TASK_STATUS_CLAIMED
			if bug {
				want = nornv1.TaskStatus_TASK_STATUS_READY
			}
			if got := h.get(id).Status; got != want {
				t.Fatalf("status just past the expiry: %v, want %v", got, want)
			}
		})
	}
}

// TestSeededBugDropReplicatedWrite: with the seeded bug every 20th
// Replicate is acknowledged and its task not stored; without it all are.
func TestSeededBugDropReplicatedWrite(t *testing.T) {
	for _, bug := range testhooks.BugCases() {
		t.Run(fmt.Sprint("bug=", bug), func(t *testing.T) {
			ms := testClusterWith(t, 1, func(_ int, c *Config) { c.TestBugs.DropReplicatedWrite = bug })
			n := ms[0].node
			var missing []int
			for i := range 2 * coord.DropReplicateEvery {
				id := uint64(1000 + i)
				state := (&crdt.Task{ID: id, Spec: &crdt.Spec{Queue: "q", CreatedAt: crdt.Timestamp{WallMs: 1, Node: 1}}}).Encode()
				req := transport.Request(n.peers, &nornv1.ReplicateRequest{Tasks: [][]byte{state}})
				if _, err := ms[0].peer.Replicate(context.Background(), req); err != nil {
					t.Fatalf("replicate %d: %v", i+1, err)
				}
				_, err := n.store.TaskState(n.host.Partition(id), id)
				switch {
				case errors.Is(err, storage.ErrNotFound):
					missing = append(missing, i+1)
				case err != nil:
					t.Fatal(err)
				}
			}
			want := fmt.Sprint([]int{})
			if bug {
				want = fmt.Sprint([]int{coord.DropReplicateEvery, 2 * coord.DropReplicateEvery})
			}
			if got := fmt.Sprint(missing); got != want {
				t.Fatalf("acked but not stored: %v, want %v", got, want)
			}
		})
	}
}

// TestSeededBugClaimNoCheck: the node's claim groups run with the seeded
// bug: a claim proposed for a task with a live claim is granted only with
// it.
func TestSeededBugClaimNoCheck(t *testing.T) {
	for _, bug := range testhooks.BugCases() {
		t.Run(fmt.Sprint("bug=", bug), func(t *testing.T) {
			h := newHarnessWith(t, t.TempDir(), nil, func(c *Config) { c.TestBugs.ClaimNoCheck = bug })
			id := h.enqueue(&nornv1.TaskSpec{Queue: "q"})
			if c := h.claim("q", 1, 10*time.Second); len(c) != 1 {
				t.Fatalf("first claim: %v", c)
			}
			o, err := h.node.dispatch.Propose(id, &claims.Command{Op: claims.OpClaim, NowMs: h.clock.Now().UnixMilli(),
				Worker: "w2", LeaseMs: 10_000, Candidates: []claims.Candidate{{ID: id}}})
			if err == nil {
				err = o.Err
			}
			if bug != (err == nil) || !bug && !errors.Is(err, claims.ErrAlreadyClaimed) {
				t.Fatalf("second claim of a claimed task: %v", err)
			}
		})
	}
}
