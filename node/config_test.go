package node

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/norn-dev/norn/testhooks"
)

// TestConfigSkewBufferCoversTwoOffsets: the skew buffer must exceed
// 2 × max clock offset + the clock measurement error (100 ms), since two
// nodes each within the max offset of the median can be twice it apart.
// The rule before issue 41 (buffer > max offset) took 2 s with 1.8 s; a
// refusal names both settings and the largest offset the buffer covers.
// With the seeded bug skew-one-offset the old rule is back.
func TestConfigSkewBufferCoversTwoOffsets(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		skew, max time.Duration
		ok        bool
	}{
		{0, 0, true}, // the defaults: 2 s, 500 ms
		{2 * time.Second, 949 * ms, true},
		{2 * time.Second, 950 * ms, false}, // 2 × 950 ms + 100 ms = 2 s: not above
		{2 * time.Second, 1800 * ms, false},
		{time.Second, 900 * ms, false},
		{103 * ms, ms, true},
		{102 * ms, ms, false},
	} {
		for _, bug := range testhooks.BugCases() {
			t.Run(fmt.Sprintf("skew=%v/max=%v/bug=%v", tc.skew, tc.max, bug), func(t *testing.T) {
				c := Config{DataDir: t.TempDir(), SkewBuffer: tc.skew, MaxClockOffset: tc.max}
				c.TestBugs.SkewOneOffset = bug
				c.setDefaults()
				err := c.Validate()
				want := tc.ok || (bug && c.SkewBuffer > c.MaxClockOffset)
				if (err == nil) != want {
					t.Fatalf("Validate() = %v, want ok %v", err, want)
				}
				if err != nil && !bug && (!strings.Contains(err.Error(), "skew buffer "+c.SkewBuffer.String()+" (-skew-buffer)") ||
					!strings.Contains(err.Error(), "max clock offset "+c.MaxClockOffset.String()+" (-max-clock-offset)") || !strings.Contains(err.Error(), "to at most ")) {
					t.Fatalf("Validate() = %v: want both settings and the largest covered offset named", err)
				}
			})
		}
	}
	if got := maxClockOffsetFor(2 * time.Second); got != 949*ms {
		t.Fatalf("maxClockOffsetFor(2s) = %v, want 949ms", got)
	}
}

// TestConfigRequestBounds: a request limit fits in its budget (a client
// request and a framed frame's header in the client budget, the largest
// peer request in the peer budget), and no client request may be larger
// than a peer's.
func TestConfigRequestBounds(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		request, client, peer int
		wantErr               string // "" ok
	}{
		{"the defaults", 0, 0, 0, ""},
		{"the smallest budgets", 4 << 20, 4<<20 + 1<<10, 64<<20 + 1<<10, ""},
		{"client budget below a request", 4 << 20, 4 << 20, 0, "max in-flight client bytes"},
		{"client budget below the default request", 0, 1 << 20, 0, "max in-flight client bytes"},
		{"peer budget below a peer request", 0, 0, 64 << 20, "max in-flight peer bytes"},
		{"client requests larger than a peer's", 65 << 20, 128 << 20, 0, "above"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{DataDir: t.TempDir(), MaxRequestBytes: tc.request, MaxInflightClientBytes: tc.client, MaxInflightPeerBytes: tc.peer}
			c.setDefaults()
			err := c.Validate()
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate() = %v, want an error naming %q", err, tc.wantErr)
			}
		})
	}
}
