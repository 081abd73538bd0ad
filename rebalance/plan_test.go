package rebalance

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/ring"
)

// The meta leader's refusals reach the caller with the code that tells
// whether to retry: the caller's mistakes FAILED_PRECONDITION, the rest
// UNAVAILABLE; an error with a code keeps it.
func TestPlacementError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want connect.Code
	}{
		{fmt.Errorf("plan: %w", cluster.ErrMovesUnderway), connect.CodeFailedPrecondition},
		{fmt.Errorf("%w: n9", cluster.ErrUnknownNode), connect.CodeFailedPrecondition},
		{ring.ErrTooFewNodes, connect.CodeFailedPrecondition},
		{connect.NewError(connect.CodeInvalidArgument, errors.New("x")), connect.CodeInvalidArgument},
		{errors.New("raft: leadership lost"), connect.CodeUnavailable},
	} {
		if got := connect.CodeOf(placementError(tc.err)); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A Join cut short by the meta leader losing its leadership is marked as
// a call that may run again (ToMetaLeader then runs it on the new leader:
// Join is idempotent); its other failures are not.
func TestJoinErrorRetries(t *testing.T) {
	for _, tc := range []struct {
		err   error
		retry bool
	}{
		{raft.ErrLeadershipLost, true},
		{fmt.Errorf("add n4 to the meta group: %w", raft.ErrNotLeader), true},
		{raft.ErrLeadershipTransferInProgress, true},
		{connect.NewError(connect.CodeFailedPrecondition, errors.New("node n4 is leaving")), false},
		{cluster.ErrStaleEpoch, false},
	} {
		err := joinError(tc.err)
		if isNoLeader(err) != tc.retry {
			t.Errorf("%v: retry %v, want %v", tc.err, isNoLeader(err), tc.retry)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("%v: the cause is lost in %v", tc.err, err)
		}
	}
}

// A move rolling back says so in its status, with the reason and the last
// error.
func TestMoveStatus(t *testing.T) {
	m := cluster.Move{Partition: 7, From: "n1", To: "n4", State: cluster.MoveRollingBack, Epoch: 9,
		Rollback: "cancelled", Error: "target down"}
	got := MoveStatus(m)
	want := &nornv1.MoveStatus{Partition: 7, FromNode: "n1", ToNode: "n4", State: string(cluster.MoveRollingBack),
		Error: "rolling back: cancelled; target down", Epoch: 9}
	if got.String() != want.String() {
		t.Fatalf("got %v, want %v", got, want)
	}
	m.State, m.Error = cluster.MoveFilling, ""
	if got := MoveStatus(m); got.GetError() != "" || got.GetState() != string(cluster.MoveFilling) {
		t.Fatalf("filling: %v", got)
	}
}

// A ChangeGroup answer names whether a node votes.
func TestServerVotes(t *testing.T) {
	servers := []*nornv1.GroupServer{{Id: "n1", Voter: true}, {Id: "n4", Voter: false}}
	if !serverVotes(servers, "n1") || serverVotes(servers, "n4") || serverVotes(servers, "n9") {
		t.Fatal("serverVotes")
	}
}
