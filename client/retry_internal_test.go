package client

import (
	"testing"
	"time"
)

// TestBackoff: attempt k waits in [d/2, d) with d = base * 2^(k-1) capped
// at max.
func TestBackoff(t *testing.T) {
	p := RetryPolicy{BaseBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}.withDefaults()
	for _, tc := range []struct {
		attempt int
		d       time.Duration
	}{
		{1, 10 * time.Millisecond},
		{2, 20 * time.Millisecond},
		{3, 40 * time.Millisecond},
		{4, 80 * time.Millisecond},
		{5, 100 * time.Millisecond},
		{60, 100 * time.Millisecond},
	} {
		for range 100 {
			if got := p.backoff(tc.attempt); got < tc.d/2 || got >= tc.d {
				t.Fatalf("backoff(%d) = %v, want in [%v, %v)", tc.attempt, got, tc.d/2, tc.d)
			}
		}
	}
	if got := (RetryPolicy{MaxAttempts: 1}).backoff(3); got != 0 {
		t.Fatalf("zero backoff = %v", got)
	}
}
