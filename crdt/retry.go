package crdt

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// RetryPolicy is how a task is retried after a failed attempt (an expired
// lease or a retryable abort; docs/JOBQUEUE.md). The claim FSM computes
// a retry's due time from it at apply, so it is all integers: every
// replica must get the same time on every architecture, and Go may fuse
// a floating-point multiply and add on some (arm64) and not on others.
type RetryPolicy struct {
	// MaxAttempts is how many failed attempts make the task dead; 0 is
	// unlimited.
	MaxAttempts uint32
	// InitialMs is the backoff after the first failed attempt; 0 is
	// none (claimable again at once, as before retries existed).
	InitialMs int64
	// MaxMs bounds the backoff; at least InitialMs.
	MaxMs int64
	// MultiplierMilli is the backoff's growth per attempt in thousandths:
	// 2000 doubles it, 1000 keeps it constant. At least 1000.
	MultiplierMilli uint32
	// JitterMilli is the largest share of a backoff, in thousandths,
	// taken off it, by an amount drawn from the task's id and the
	// attempt (the same on every replica): 0 is none, 1000 at most all.
	JitterMilli uint32
}

// Policy bounds.
const (
	// MaxBackoffMs bounds MaxMs: 30 days.
	MaxBackoffMs = 30 * 24 * 3600 * 1000
	// MaxMultiplierMilli bounds MultiplierMilli: x100 per attempt.
	MaxMultiplierMilli = 100_000
	// backoffSteps bounds the growth loop of BackoffMs: a multiplier
	// barely above 1 reaches MaxMs slowly, and an attempt number may be
	// large; past this many steps the backoff stays where it is.
	backoffSteps = 10_000
)

// ErrBadPolicy is wrapped by Validate's errors.
var ErrBadPolicy = errors.New("crdt: invalid retry policy")

// Validate checks p's fields against their bounds, naming the field.
func (p RetryPolicy) Validate() error {
	switch {
	case p.InitialMs < 0:
		return fmt.Errorf("%w: initial backoff %d ms is negative", ErrBadPolicy, p.InitialMs)
	case p.MaxMs < p.InitialMs:
		return fmt.Errorf("%w: max backoff %d ms is below the initial %d ms", ErrBadPolicy, p.MaxMs, p.InitialMs)
	case p.MaxMs > MaxBackoffMs:
		return fmt.Errorf("%w: max backoff %d ms is above %d ms (30 days)", ErrBadPolicy, p.MaxMs, int64(MaxBackoffMs))
	case p.MultiplierMilli < 1000 || p.MultiplierMilli > MaxMultiplierMilli:
		return fmt.Errorf("%w: multiplier %d/1000 is outside [1, 100]", ErrBadPolicy, p.MultiplierMilli)
	case p.JitterMilli > 1000:
		return fmt.Errorf("%w: jitter %d/1000 is above 1", ErrBadPolicy, p.JitterMilli)
	}
	return nil
}

// BackoffMs is how long task id waits after its attempt-th failed
// attempt (1 for the first) before it may be claimed again:
// InitialMs × Multiplier^(attempt-1), at most MaxMs, less the jitter.
// It saturates instead of overflowing and is the same on every replica.
// p must be valid.
func (p RetryPolicy) BackoffMs(id uint64, attempt uint32) int64 {
	if p.InitialMs <= 0 || attempt == 0 {
		return 0
	}
	d := p.InitialMs
	if p.MultiplierMilli > 1000 {
		for i := uint32(1); i < attempt && i <= backoffSteps && d < p.MaxMs; i++ {
			// d <= MaxBackoffMs (2.6e9) and the multiplier <= 1e5: the
			// product stays below 2.6e14, far from overflowing.
			next := d * int64(p.MultiplierMilli) / 1000
			if next == d {
				next++ // a multiplier close to 1 on a small backoff still grows
			}
			d = next
		}
	}
	d = min(d, p.MaxMs)
	if p.JitterMilli > 0 {
		var b [12]byte
		binary.LittleEndian.PutUint64(b[:8], id)
		binary.LittleEndian.PutUint32(b[8:], attempt)
		u := int64(xxhash.Sum64(b[:]) % 1001) // 0..1000
		// d <= 2.6e9, times 1000 times 1000: below 2.6e15.
		d -= d * int64(p.JitterMilli) * u / 1_000_000
	}
	return d
}
