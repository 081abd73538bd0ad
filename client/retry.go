package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
)

// RetryPolicy says how often and how patiently a call is retried. Which
// errors are retried depends on the call (see the package documentation):
// in short, UNAVAILABLE and DEADLINE_EXCEEDED for idempotent calls, and
// for the others (Claim, and Enqueue before it knows its id) only errors
// that prove the request never reached a node.
//
// Attempt k (from 1) that fails waits a random time in [d/2, d) before
// attempt k+1, where d = BaseBackoff * 2^(k-1), capped at MaxBackoff. The
// call's context (and the client's timeout) bounds the whole series.
type RetryPolicy struct {
	// MaxAttempts is how many times a call is tried in all, the first
	// attempt included. Default 5; 1 turns retries off.
	MaxAttempts int

	// BaseBackoff is the wait after the first failed attempt, before
	// jitter. Default 50 ms.
	BaseBackoff time.Duration

	// MaxBackoff caps the wait between two attempts. Default 2 s.
	MaxBackoff time.Duration
}

// Defaults of RetryPolicy.
const (
	DefaultMaxAttempts = 5
	DefaultBaseBackoff = 50 * time.Millisecond
	DefaultMaxBackoff  = 2 * time.Second
)

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.BaseBackoff == 0 {
		p.BaseBackoff = DefaultBaseBackoff
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = DefaultMaxBackoff
	}
	return p
}

func (p RetryPolicy) validate() error {
	if p.MaxAttempts < 1 || p.BaseBackoff < 0 || p.MaxBackoff < p.BaseBackoff {
		return fmt.Errorf("norn: bad RetryPolicy %+v: need MaxAttempts >= 1 and 0 <= BaseBackoff <= MaxBackoff", p)
	}
	return nil
}

// backoff returns the wait after failed attempt k (from 1), with jitter.
func (p RetryPolicy) backoff(k int) time.Duration {
	d := p.BaseBackoff
	for i := 1; i < k && d < p.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, p.MaxBackoff)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

// retryClass says which errors a call may retry.
type retryClass int

const (
	// retryNoEffect retries only errors that prove the request never
	// reached a node: the call is not idempotent.
	retryNoEffect retryClass = iota
	// retryIdempotent also retries UNAVAILABLE and DEADLINE_EXCEEDED: a
	// repeat of the call does no harm.
	retryIdempotent
)

// retryable reports whether err may be retried by a call of class rc.
// The caller also stops once its context is done.
func retryable(rc retryClass, err error) bool {
	if noEffect(err) {
		return true
	}
	if rc != retryIdempotent {
		return false
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded:
		return true
	}
	return false
}

// noEffect reports whether err proves that the request never took effect
// on a node: the connection was refused, the name did not resolve, or the
// node had no room to hold it (overBudget). Such a call is safe to repeat
// whatever it was.
func noEffect(err error) bool {
	if errors.Is(err, ErrClosed) {
		return false
	}
	var dnsErr *net.DNSError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &dnsErr) || overBudget(err)
}

// overBudget reports whether err is a node's refusal of a request it had
// no room to hold (RESOURCE_EXHAUSTED with a google.rpc.RetryInfo detail,
// or from a node before those, a message ending "retry later";
// docs/API.md "Limits"): it refused the request before reading it, so it
// did not run.
func overBudget(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted {
		return false
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if _, ok := v.(*errdetails.RetryInfo); ok {
				return true
			}
		}
	}
	return strings.HasSuffix(ce.Message(), "retry later")
}

// sleep waits d or until ctx is done; it reports whether it waited d.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// do runs call until it succeeds, fails with an error that may not be
// retried (retry decides), or the policy's attempts run out. Each attempt
// goes to the endpoint the client picks (another one than the previous
// attempt's when another is healthy), and its outcome updates that
// endpoint's health. ctx must already carry the call's timeout. The error
// is wrapped for method.
func (c *Client) do(ctx context.Context, method string, retry func(err error) bool, call func(ctx context.Context, ep *endpoint) error) error {
	return c.doAt(ctx, "", method, retry, call)
}

// doAt is do whose first attempt goes to the node at API address leader
// (a leader hint, host:port) when it is one of the client's healthy
// endpoints; retries go elsewhere as usual.
func (c *Client) doAt(ctx context.Context, leader, method string, retry func(err error) bool, call func(ctx context.Context, ep *endpoint) error) error {
	return c.doUntil(ctx, leader, time.Time{}, method, retry, call)
}

// doUntil is doAt that, past the policy's attempts, goes on retrying
// until until (zero: it does not).
func (c *Client) doUntil(ctx context.Context, leader string, until time.Time, method string, retry func(err error) bool, call func(ctx context.Context, ep *endpoint) error) error {
	if c.isClosed() {
		return wrapErr(method, ErrClosed)
	}
	c.firstUse()
	var prev *endpoint
	for attempt := 1; ; attempt++ {
		var ep *endpoint
		if attempt == 1 && leader != "" {
			ep = c.eps.preferred(time.Now(), c.scheme+"://"+leader)
		}
		if ep == nil {
			ep = c.eps.pick(time.Now(), prev)
		}
		err := call(ctx, ep)
		c.observe(ctx, ep, err)
		if err == nil {
			return nil
		}
		prev = ep
		wait := c.retry.backoff(attempt)
		if attempt >= c.retry.MaxAttempts && !time.Now().Add(wait).Before(until) || ctx.Err() != nil || !retry(err) {
			return wrapErr(method, err)
		}
		if !sleep(ctx, wait) {
			return &callError{method: method, err: err, ctxErr: context.Cause(ctx)}
		}
	}
}

// callClaim is call for the calls on task id's claim (Renew, Update,
// Complete, Abort, Yield; done: the call ends the claim), which must
// outlast a failover of the task's partition: a new leader takes one to
// three seconds, and until then the calls answer UNAVAILABLE. So they
// retry UNAVAILABLE and DEADLINE_EXCEEDED (they are idempotent) for as
// long as the claim's lease lasts, as the client last learned it
// (claimHints), within the call's deadline (its context's, else the
// client's timeout), and at least the policy's attempts. The first
// attempt goes to the partition's leader when the client knows it.
func (c *Client) callClaim(ctx context.Context, id uint64, done bool, method string, fn func(ctx context.Context, ep *endpoint) error) error {
	return c.callHinted(ctx, c.hints.get(id, done), method, fn)
}

// callHinted is callClaim with the claim's hint given.
func (c *Client) callHinted(ctx context.Context, hint claimHint, method string, fn func(ctx context.Context, ep *endpoint) error) error {
	ctx, cancel := c.withTimeout(ctx, 0)
	defer cancel()
	until, ok := ctx.Deadline()
	if !hint.expiry.IsZero() && (!ok || hint.expiry.Before(until)) {
		until = hint.expiry
	}
	return c.doUntil(ctx, hint.leader, until, method, func(err error) bool { return retryable(retryIdempotent, err) }, fn)
}

// call is do for the common case: a call of class rc with the client's
// timeout.
func (c *Client) call(ctx context.Context, method string, rc retryClass, fn func(ctx context.Context, ep *endpoint) error) error {
	return c.callAt(ctx, "", method, rc, fn)
}

// callAt is call whose first attempt goes to leader when it can (doAt).
func (c *Client) callAt(ctx context.Context, leader, method string, rc retryClass, fn func(ctx context.Context, ep *endpoint) error) error {
	ctx, cancel := c.withTimeout(ctx, 0)
	defer cancel()
	return c.doAt(ctx, leader, method, func(err error) bool { return retryable(rc, err) }, fn)
}
