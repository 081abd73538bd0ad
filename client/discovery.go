package client

import (
	"context"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// DefaultDiscoveryInterval is how often a Client asks a node for the
// cluster's nodes, unless WithDiscovery says otherwise.
const DefaultDiscoveryInterval = 30 * time.Second

// maxStatusTimeout bounds one Status call of discovery.
const maxStatusTimeout = 5 * time.Second

// discovery is the background refresh of a Client's endpoint set (see
// WithDiscovery): a goroutine that calls Status after the client's first
// call, every interval, and at once when a connection to a node fails.
type discovery struct {
	interval time.Duration
	kick     chan struct{} // capacity 1: a refresh is wanted now
	stop     context.CancelFunc
	done     chan struct{} // closed when the goroutine has returned
}

// startDiscovery starts the discovery goroutine of c; Close stops it.
func (c *Client) startDiscovery(interval time.Duration) {
	ctx, stop := context.WithCancel(context.Background())
	c.disc = &discovery{interval: interval, kick: make(chan struct{}, 1), stop: stop, done: make(chan struct{})}
	go c.discover(ctx, c.disc)
}

// kickDiscovery asks for a refresh now; it never blocks, and does nothing
// when discovery is off.
func (c *Client) kickDiscovery() {
	if c.disc == nil {
		return
	}
	select {
	case c.disc.kick <- struct{}{}:
	default: // a refresh is already wanted
	}
}

// stopDiscovery stops the discovery goroutine and waits for it to return.
func (c *Client) stopDiscovery() {
	if c.disc == nil {
		return
	}
	c.disc.stop()
	<-c.disc.done
}

// discover runs the refreshes until ctx is done. The first waits for the
// client's first call (New does not connect).
func (c *Client) discover(ctx context.Context, d *discovery) {
	defer close(d.done)
	select {
	case <-ctx.Done():
		return
	case <-d.kick:
	}
	t := time.NewTimer(d.interval)
	defer t.Stop()
	for {
		c.refresh(ctx)
		t.Reset(d.interval)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.kick:
		}
	}
}

// refresh asks the endpoints in turn for Status until one answers, and
// makes the nodes it lists as alive or suspect the endpoint set, with the
// seeds. An answer with no nodes (a single node) changes nothing.
func (c *Client) refresh(ctx context.Context) {
	var prev *endpoint
	for range c.eps.size() {
		ep := c.eps.pick(time.Now(), prev)
		prev = ep
		resp, err := c.statusOf(ctx, ep)
		if ctx.Err() != nil {
			return
		}
		c.observe(ctx, ep, err)
		if err != nil {
			continue
		}
		if len(resp.GetNodes()) == 0 {
			return
		}
		var learned []string
		for _, n := range resp.GetNodes() {
			if n.GetState() != "alive" && n.GetState() != "suspect" {
				continue
			}
			if base, ok := nodeBase(n.GetApiAddress(), c.scheme); ok {
				learned = append(learned, base)
			}
		}
		c.eps.set(learned)
		return
	}
}

// statusOf calls Status on ep once, within maxStatusTimeout (or the
// client's timeout when shorter).
func (c *Client) statusOf(ctx context.Context, ep *endpoint) (*nornv1.StatusResponse, error) {
	d := maxStatusTimeout
	if c.timeout > 0 {
		d = min(d, c.timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	resp, err := ep.admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{SkipCounts: true}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// observe updates ep's health after an attempt that ended with err (nil
// for success). The attempt's context must be checked first: an attempt
// cut short by its own context says nothing about the node.
func (c *Client) observe(ctx context.Context, ep *endpoint, err error) {
	switch {
	case err == nil:
		c.eps.succeeded(ep)
	case ctx.Err() != nil:
	case endpointDown(err):
		if c.eps.failed(ep, time.Now()) && !connect.IsWireError(err) {
			c.kickDiscovery()
		}
	case connect.IsWireError(err):
		c.eps.succeeded(ep) // the node answered
	}
}
