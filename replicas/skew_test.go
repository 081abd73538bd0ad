package replicas

import (
	"testing"
	"time"

	"github.com/norn-dev/norn/cluster"
)

// TestLargestSkewBuffer: a leader waits the largest skew buffer of any
// member that has not left (dead ones may come back and lead), and at
// least its own; a member that predates the field gossips 0.
func TestLargestSkewBuffer(t *testing.T) {
	s := time.Second
	member := func(state cluster.MemberState, skewMs int64) cluster.Member {
		return cluster.Member{State: state, NodeMeta: cluster.NodeMeta{SkewBufferMs: skewMs}}
	}
	for _, tc := range []struct {
		name    string
		own     time.Duration
		members []cluster.Member
		want    time.Duration
	}{
		{"alone", 2 * s, nil, 2 * s},
		{"same everywhere", 2 * s, []cluster.Member{member(cluster.StateAlive, 2000), member(cluster.StateAlive, 2000)}, 2 * s},
		{"a peer's larger: a rolling change", 2 * s, []cluster.Member{member(cluster.StateAlive, 3000), member(cluster.StateSuspect, 2000)}, 3 * s},
		{"a dead peer's counts", 2 * s, []cluster.Member{member(cluster.StateDead, 4000)}, 4 * s},
		{"a peer that left does not", 2 * s, []cluster.Member{member(cluster.StateLeft, 4000)}, 2 * s},
		{"an old peer gossips none", 2 * s, []cluster.Member{member(cluster.StateAlive, 0)}, 2 * s},
		{"own larger", 5 * s, []cluster.Member{member(cluster.StateAlive, 2000)}, 5 * s},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := largestSkewBuffer(tc.own, tc.members); got != tc.want {
				t.Fatalf("largestSkewBuffer(%v, ...) = %v, want %v", tc.own, got, tc.want)
			}
		})
	}
}
