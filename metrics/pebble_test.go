package metrics

import (
	"testing"
	"time"
)

// The fsync histogram keeps one of Pebble's bounds per target, 100 µs to
// 10 s, ascending.
func TestFsyncBounds(t *testing.T) {
	b := fsyncBounds()
	if len(b) != len(fsyncTargets) {
		t.Fatalf("%d bounds kept for %d targets: %v", len(b), len(fsyncTargets), b)
	}
	if b[0] != float64(100*time.Microsecond) || b[len(b)-1] < 0.999999*float64(10*time.Second) {
		t.Fatalf("bounds %v ns, want 100 µs to 10 s", b)
	}
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] || b[i] > fsyncTargets[i]*float64(time.Second)*(1+1e-9) {
			t.Fatalf("bound %d: %v ns after %v, target %v s", i, b[i], b[i-1], fsyncTargets[i])
		}
	}
}
