package client

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// Health of an endpoint: after a failure that shows the node down (see
// endpointDown) the endpoint is not picked for a backoff that starts at
// minEndpointBackoff and doubles with every further failure, up to
// maxEndpointBackoff; a success resets it.
const (
	minEndpointBackoff = time.Second
	maxEndpointBackoff = 30 * time.Second
)

// endpoint is one node's API: its base URL and the connect clients for
// it, which share the Client's HTTP client.
type endpoint struct {
	base  string // "http://host:port"
	tasks nornv1connect.TaskServiceClient
	admin nornv1connect.AdminServiceClient
	queue nornv1connect.QueueServiceClient

	// Health, guarded by the endpoints' mu.
	failures  int       // failures in a row that marked it down
	downUntil time.Time // not picked before this while another endpoint is healthy
	failedAt  time.Time // the last failure; zero if none yet
}

// healthy reports whether ep may be picked at now.
func (ep *endpoint) healthy(now time.Time) bool { return !now.Before(ep.downUntil) }

// endpoints is the set of nodes a Client sends to: the seeds given to New
// and the nodes learned from Status, with the health of each. It is a
// state machine: time is an argument and it does no I/O. Safe for
// concurrent use.
type endpoints struct {
	newEndpoint func(base string) *endpoint
	seeds       []string // base URLs, in the order given; never empty

	mu   sync.Mutex
	list []*endpoint // the seeds, then the learned nodes in URL order
	next int         // round-robin cursor into list
}

func newEndpoints(seeds []string, newEndpoint func(base string) *endpoint) *endpoints {
	if len(seeds) == 0 {
		panic("norn: endpoints without seeds")
	}
	e := &endpoints{newEndpoint: newEndpoint, seeds: seeds}
	for _, b := range seeds {
		e.list = append(e.list, newEndpoint(b))
	}
	return e
}

// pick returns the endpoint for the next attempt of a call: the next
// healthy one in round-robin order other than avoid (the endpoint the
// call's previous attempt went to, or nil); avoid when it is the only
// healthy one; and when none is healthy, the one that failed least
// recently, so a call is always tried.
func (e *endpoints) pick(now time.Time, avoid *endpoint) *endpoint {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.list)
	var fallback *endpoint
	avoidHealthy := false
	for i := range n {
		j := (e.next + i) % n
		ep := e.list[j]
		switch {
		case !ep.healthy(now):
			if fallback == nil || ep.failedAt.Before(fallback.failedAt) {
				fallback = ep
			}
		case ep == avoid:
			avoidHealthy = true
		default:
			e.next = (j + 1) % n
			return ep
		}
	}
	if avoidHealthy {
		return avoid
	}
	return fallback
}

// failed records a failure of ep at now that shows the node down. It
// reports whether ep went from healthy to down: failures of calls that
// were in flight together count once, so the backoff doubles once per
// episode.
// preferred returns the endpoint whose base is base if it is healthy, nil
// otherwise (or when base is not one of the client's endpoints).
func (e *endpoints) preferred(now time.Time, base string) *endpoint {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ep := range e.list {
		if ep.base == base && ep.healthy(now) {
			return ep
		}
	}
	return nil
}

func (e *endpoints) failed(ep *endpoint, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	ep.failedAt = now
	if !ep.healthy(now) {
		return false
	}
	ep.failures++
	ep.downUntil = now.Add(endpointBackoff(ep.failures))
	return true
}

// succeeded records that ep answered: it is healthy again.
func (e *endpoints) succeeded(ep *endpoint) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ep.failures = 0
	ep.downUntil = time.Time{}
}

// endpointBackoff is how long an endpoint is down after its n-th failure
// in a row (from 1).
func endpointBackoff(n int) time.Duration {
	d := minEndpointBackoff
	for i := 1; i < n && d < maxEndpointBackoff; i++ {
		d *= 2
	}
	return min(d, maxEndpointBackoff)
}

// set makes the endpoint set the seeds plus learned (base URLs, in any
// order, duplicates allowed). Endpoints already known keep their clients
// and health.
func (e *endpoints) set(learned []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := make(map[string]*endpoint, len(e.list))
	for _, ep := range e.list {
		old[ep.base] = ep
	}
	learned = slices.Clone(learned)
	slices.Sort(learned)
	list := make([]*endpoint, 0, len(e.seeds)+len(learned))
	seen := make(map[string]bool, cap(list))
	for _, b := range slices.Concat(e.seeds, learned) {
		if seen[b] {
			continue
		}
		seen[b] = true
		ep := old[b]
		if ep == nil {
			ep = e.newEndpoint(b)
		}
		list = append(list, ep)
	}
	e.list = list
	e.next %= len(list)
}

// closeFramed closes the framed connections of every endpoint (Close).
func (e *endpoints) closeFramed() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ep := range e.list {
		if f, ok := ep.tasks.(*framedTasks); ok {
			f.rpc.Close()
		}
	}
}

// bases returns the base URLs of the endpoints, seeds first.
func (e *endpoints) bases() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]string, len(e.list))
	for i, ep := range e.list {
		out[i] = ep.base
	}
	return out
}

// size returns the number of endpoints.
func (e *endpoints) size() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.list)
}

// endpointDown reports whether err, the error of a call whose context was
// still live, shows that the endpoint could not serve it, so that the
// next calls should go elsewhere for a while:
//
//   - the connection failed: refused, reset, aborted, unreachable, timed
//     out, or the name did not resolve;
//   - the client's HTTP/2 layer gave up on the request (connect reports
//     UNAVAILABLE without it coming from the server: GOAWAY, a refused
//     stream, an unexpected EOF, an HTTP 502/503/504 from a proxy);
//   - the node answered UNAVAILABLE without a WriteFailure detail: it
//     cannot serve now (no claim leader reachable, shutting down).
//
// An UNAVAILABLE with a WriteFailure is a write quorum missed by a live
// node: the call may be retried elsewhere, but the node is not down. Other
// answers of the node (NOT_FOUND, FAILED_PRECONDITION, ...) show it alive.
func endpointDown(err error) bool {
	if err == nil {
		return false
	}
	if connect.IsWireError(err) {
		if connect.CodeOf(err) != connect.CodeUnavailable {
			return false
		}
		_, quorum := WriteFailureOf(err)
		return !quorum
	}
	return connectionFailure(err) || connect.CodeOf(err) == connect.CodeUnavailable
}

// connectionFailure reports whether err is a failure of the connection to
// the node (or of resolving its name).
func connectionFailure(err error) bool {
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return true
	}
	for _, errno := range []syscall.Errno{
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
		syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ETIMEDOUT,
	} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// parseSeeds parses New's address list: addresses separated by commas,
// each as parseAddr takes it, all with the same scheme. It returns their
// base URLs without duplicates, in order, and the scheme.
func parseSeeds(addrs string) (bases []string, scheme string, err error) {
	for a := range strings.SplitSeq(addrs, ",") {
		a = strings.TrimSpace(a)
		if a == "" && strings.Contains(addrs, ",") {
			return nil, "", fmt.Errorf("norn: address list %q: empty address", addrs)
		}
		base, s, err := parseAddr(a)
		if err != nil {
			return nil, "", err
		}
		if scheme != "" && s != scheme {
			return nil, "", fmt.Errorf("norn: address list %q: mixes http and https", addrs)
		}
		scheme = s
		if !slices.Contains(bases, base) {
			bases = append(bases, base)
		}
	}
	return bases, scheme, nil
}

// nodeBase turns the api_address of a node in a Status answer into a base
// URL with the seeds' scheme. It rejects an address a remote client cannot
// dial: no host, or an unspecified one (0.0.0.0, ::).
func nodeBase(apiAddr, scheme string) (string, bool) {
	if apiAddr == "" {
		return "", false
	}
	if !strings.Contains(apiAddr, "://") {
		apiAddr = scheme + "://" + apiAddr
	}
	base, s, err := parseAddr(apiAddr)
	if err != nil || s != scheme {
		return "", false
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", false
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return "", false
	}
	return base, true
}
