package crdt

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// The backoff grows by the multiplier from the initial value, stops at
// the maximum, and never overflows, whatever the attempt.
func TestBackoffGrowsAndSaturates(t *testing.T) {
	p := RetryPolicy{InitialMs: 100, MaxMs: 10_000, MultiplierMilli: 2000}
	for attempt, want := range map[uint32]int64{1: 100, 2: 200, 3: 400, 7: 6400, 8: 10_000, 9: 10_000, math.MaxUint32: 10_000} {
		if got := p.BackoffMs(1, attempt); got != want {
			t.Errorf("attempt %d: %d ms, want %d", attempt, got, want)
		}
	}
	if got := (RetryPolicy{InitialMs: 500, MaxMs: 500, MultiplierMilli: 1000}).BackoffMs(1, math.MaxUint32); got != 500 {
		t.Errorf("constant backoff: %d", got)
	}
	if got := (RetryPolicy{}).BackoffMs(1, 3); got != 0 {
		t.Errorf("no backoff: %d", got)
	}
	// The extremes: the largest bounds, the largest multiplier.
	big := RetryPolicy{InitialMs: MaxBackoffMs, MaxMs: MaxBackoffMs, MultiplierMilli: MaxMultiplierMilli, JitterMilli: 1000}
	for _, attempt := range []uint32{1, 2, 1 << 20, math.MaxUint32} {
		if got := big.BackoffMs(math.MaxUint64, attempt); got < 0 || got > MaxBackoffMs {
			t.Errorf("extreme policy, attempt %d: %d ms", attempt, got)
		}
	}
	// A multiplier barely above 1 on a 1 ms backoff still grows, and
	// stops within backoffSteps.
	slow := RetryPolicy{InitialMs: 1, MaxMs: MaxBackoffMs, MultiplierMilli: 1001}
	if a, b := slow.BackoffMs(1, 10), slow.BackoffMs(1, math.MaxUint32); a <= 1 || b < a || b > MaxBackoffMs {
		t.Errorf("slow growth: attempt 10 %d ms, attempt max %d ms", a, b)
	}
}

// Jitter takes at most its share off, is the same for the same task and
// attempt (every replica computes it), and differs across tasks.
func TestBackoffJitter(t *testing.T) {
	p := RetryPolicy{InitialMs: 1000, MaxMs: 1000, MultiplierMilli: 1000, JitterMilli: 250}
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[int64]bool{}
	for range 1000 {
		id, attempt := rng.Uint64(), rng.Uint32N(50)+1
		d := p.BackoffMs(id, attempt)
		if d < 750 || d > 1000 {
			t.Fatalf("jitter 25%% of 1000 ms gave %d ms", d)
		}
		if d != p.BackoffMs(id, attempt) {
			t.Fatal("the same task and attempt gave two backoffs")
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Fatalf("1000 tasks got only %d distinct backoffs", len(seen))
	}
}

// Validate names what is wrong.
func TestRetryPolicyValidate(t *testing.T) {
	ok := RetryPolicy{MaxAttempts: 5, InitialMs: 1000, MaxMs: 60_000, MultiplierMilli: 2000, JitterMilli: 100}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]RetryPolicy{
		"negative initial":     {InitialMs: -1, MaxMs: 10, MultiplierMilli: 1000},
		"max below initial":    {InitialMs: 10, MaxMs: 5, MultiplierMilli: 1000},
		"max too large":        {InitialMs: 10, MaxMs: MaxBackoffMs + 1, MultiplierMilli: 1000},
		"multiplier below 1":   {InitialMs: 10, MaxMs: 10, MultiplierMilli: 999},
		"multiplier too large": {InitialMs: 10, MaxMs: 10, MultiplierMilli: MaxMultiplierMilli + 1},
		"jitter above 1":       {InitialMs: 10, MaxMs: 10, MultiplierMilli: 1000, JitterMilli: 1001},
	} {
		if err := p.Validate(); !errors.Is(err, ErrBadPolicy) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
