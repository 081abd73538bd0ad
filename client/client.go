package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// Client talks to the nodes of a Norn cluster (any node answers any call),
// spreading its calls over them and failing over from a node that is down.
// It is safe for concurrent use; make one per process and share it. Close
// it when done.
type Client struct {
	scheme string      // "http" or "https", of every endpoint
	eps    *endpoints  // the nodes calls go to
	disc   *discovery  // nil when discovery is off
	used   atomic.Bool // a call was made: discovery may start

	// ownTransport is the transport New made (nil when the caller gave an
	// http.Client); Close closes its idle connections.
	ownTransport *http.Transport

	retry   RetryPolicy
	timeout time.Duration
	w       uint32

	hints claimHints // leaders and lease expiries of claimed tasks

	enqueues  *coalescer[enqueueCall, uint64]               // nil when batching is off (WithEnqueueBatching)
	completes *coalescer[*nornv1.CompleteRequest, struct{}] // nil when batching is off (WithCompleteBatching)

	mu      sync.Mutex
	closing bool // Close was called
	closed  bool // Close has sent the last batches: calls fail
}

// Option configures a Client; pass options to New.
type Option func(*options)

type options struct {
	httpClient  connect.HTTPClient
	retry       RetryPolicy
	timeout     time.Duration
	w           uint32
	enqueueB    batching
	completeB   batching
	connectOpts []connect.ClientOption
	discovery   time.Duration
	noFramed    bool        // WithFramedCalls(false)
	tls         *tls.Config // WithTLS
	token       string      // WithToken
}

// DefaultTimeout is the timeout New gives every call whose context has no
// deadline, unless WithTimeout says otherwise.
const DefaultTimeout = 10 * time.Second

// WithHTTPClient makes the client send its requests through hc instead of
// the HTTP/2 cleartext (h2c) client New builds. hc must speak HTTP/2 to
// the node: the gRPC protocol needs it.
func WithHTTPClient(hc connect.HTTPClient) Option {
	return func(o *options) { o.httpClient = hc }
}

// WithFramedCalls turns the framed protocol for the hot calls on (the
// default) or off. With it on, Enqueue, EnqueueBatch, Claim, Complete,
// CompleteBatch and Renew travel as framed calls on the node's API port,
// which costs the client about half and the node about a fifth less CPU
// than a gRPC call over HTTP/2 (docs/API.md, "Framed calls"); every other call,
// and every call to a node that does not speak it, goes through connect.
// Over TLS they need WithTLS (ALPN norn-framed/1 on the same port, the
// client certificate as their credential). It is off, whatever this
// says, with WithHTTPClient, WithConnectOptions (whose interceptors and
// options framed calls would skip), WithToken (framed calls carry no
// headers), or an https address without WithTLS.
func WithFramedCalls(on bool) Option {
	return func(o *options) { o.noFramed = !on }
}

// WithTLS makes the client speak TLS (HTTP/2 by ALPN) with conf: its
// RootCAs (the cluster's CA) verify the nodes, its certificate (if any)
// authenticates the client. Addresses without a scheme then mean https;
// an http:// address is an error. LoadTLSConfig reads conf from PEM
// files. The hot calls still travel framed (WithFramedCalls), over TLS.
func WithTLS(conf *tls.Config) Option {
	return func(o *options) { o.tls = conf }
}

// WithToken sends token (nornctl token create) as a bearer token with
// every call: how a client without a client certificate authenticates to
// a node with an access file. Use it over TLS only (WithTLS): a token in
// cleartext can be read on the way. Framed calls are off with a token
// (they carry no headers).
func WithToken(token string) Option {
	return func(o *options) { o.token = token }
}

// LoadTLSConfig reads a TLS configuration for WithTLS: caFile, a PEM
// bundle of the CA certificates that sign the nodes' certificates, and,
// when certFile is not empty, the client's certificate and its key
// (nornctl cert create-client). The nodes' certificates must name the
// host the client dials (nornctl cert create-node --host).
func LoadTLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("norn: CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("norn: CA bundle %s: no PEM certificate in it", caFile)
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool}
	if certFile != "" || keyFile != "" {
		kp, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("norn: client certificate: %w", err)
		}
		conf.Certificates = []tls.Certificate{kp}
	}
	return conf, nil
}

// WithRetry sets the retry policy (see RetryPolicy for what is retried).
// Zero fields take their defaults; MaxAttempts 1 turns retries off.
func WithRetry(p RetryPolicy) Option {
	return func(o *options) { o.retry = p }
}

// WithTimeout sets the timeout of a call whose context has no deadline:
// the whole call, retries included, must finish within d (a Claim within d
// plus its long-poll wait). Default DefaultTimeout (10 s); 0 means no
// timeout. A context with a deadline is used as it is.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// WithDefaultQuorum sets the write quorum W of every write (Enqueue,
// EnqueueBatch, Update, Complete, Abort, Cancel) that does not choose its
// own: how many replicas must store the write durably before the call
// succeeds. Default 0: the server's default, a majority of the replicas.
// W=1 keeps enqueues available without a majority, at the risk of losing
// a task with its one replica.
func WithDefaultQuorum(w uint32) Option {
	return func(o *options) { o.w = w }
}

// batching is the setting of one batching option.
type batching struct {
	set      bool
	linger   time.Duration
	maxBatch int
}

// DefaultMaxBatch is the most calls one batch holds when batching while
// in flight, the default (see WithEnqueueBatching).
const DefaultMaxBatch = 500

// WithEnqueueBatching sets how concurrent Enqueue calls share EnqueueBatch
// RPCs. Each caller still gets its own id and error back. See the package
// documentation (Batching).
//
// With linger > 0 (timed batching), a call joins the open batch (or opens
// one), and a batch is sent when it holds maxBatch tasks (or about 2 MiB
// of specs) or linger after its first call, whichever comes first: 1 ms
// and 500 suit a producer with hundreds of goroutines.
//
// With linger 0 (batching while in flight), a call goes out at once,
// alone, unless four calls of the same write quorum are in flight; calls
// that come meanwhile go together, up to maxBatch, as soon as one of
// them returns. A lone caller, or a few, wait for nothing. maxBatch 1
// turns batching off: every Enqueue is its own RPC.
//
// Default: batching while in flight, up to DefaultMaxBatch. linger must
// not be negative and maxBatch must be between 1 and 10,000; New fails
// otherwise.
func WithEnqueueBatching(linger time.Duration, maxBatch int) Option {
	return func(o *options) { o.enqueueB = batching{true, linger, maxBatch} }
}

// WithCompleteBatching sets how concurrent Complete calls share
// CompleteBatch RPCs, as WithEnqueueBatching does for Enqueue (calls for
// tasks whose claims name different leaders go apart): the node then
// commits a batch of completions with one fsync, and each caller still
// gets its own error back. Timed batching (1 ms and 100, say) suits a
// worker process running many handlers at once (Worker with a high
// concurrency).
//
// Default: batching while in flight, up to DefaultMaxBatch; maxBatch 1
// turns batching off.
func WithCompleteBatching(linger time.Duration, maxBatch int) Option {
	return func(o *options) { o.completeB = batching{true, linger, maxBatch} }
}

// WithDiscovery sets how often the client asks a node (AdminService.Status)
// for the nodes of the cluster, to spread its calls over every node that is
// alive or suspect, along with the addresses given to New. The first time
// is after the client's first call; a call that cannot connect to a node
// also asks at once. Default DefaultDiscoveryInterval (30 s); 0 turns
// discovery off: the client then sends only to the addresses given to New.
// Discovery runs in a goroutine of its own until Close.
func WithDiscovery(interval time.Duration) Option {
	return func(o *options) { o.discovery = interval }
}

// WithConnectOptions adds connect client options (interceptors, read
// limits, ...) after the client's own (connect.WithGRPC, and gzip
// removed: the client does not ask for compressed answers; over a slow
// link, connect.WithAcceptCompression("gzip", ...) asks again).
func WithConnectOptions(opts ...connect.ClientOption) Option {
	return func(o *options) { o.connectOpts = append(o.connectOpts, opts...) }
}

// New returns a client for the nodes at addrs: one address, or several
// separated by commas ("10.0.0.1:7400,10.0.0.2:7400"), each "host:port"
// (for example "127.0.0.1:7400"), "http://host:port" or "https://host:port",
// all with the same scheme. These seeds are always kept; the other nodes
// of the cluster are learned from them (WithDiscovery). Calls go to the
// nodes in turn, skipping a node for a while after it failed (see the
// package documentation). The client speaks the gRPC protocol over HTTP/2,
// in cleartext (h2c) for "http" and plain addresses, there with the hot
// calls framed (WithFramedCalls). New does not connect; the first call
// does.
func New(addrs string, opts ...Option) (*Client, error) {
	o := options{timeout: DefaultTimeout, discovery: DefaultDiscoveryInterval}
	for _, opt := range opts {
		opt(&o)
	}
	if o.tls != nil {
		addrs = defaultHTTPS(addrs)
	}
	seeds, scheme, err := parseSeeds(addrs)
	if err != nil {
		return nil, err
	}
	if o.tls != nil && scheme != "https" {
		return nil, fmt.Errorf("norn: address list %q: http with WithTLS", addrs)
	}
	o.retry = o.retry.withDefaults()
	if err := o.retry.validate(); err != nil {
		return nil, err
	}
	if o.timeout < 0 {
		return nil, fmt.Errorf("norn: WithTimeout(%v): negative", o.timeout)
	}
	if o.discovery < 0 {
		return nil, fmt.Errorf("norn: WithDiscovery(%v): negative", o.discovery)
	}
	if err := o.enqueueB.validate("WithEnqueueBatching"); err != nil {
		return nil, err
	}
	if err := o.completeB.validate("WithCompleteBatching"); err != nil {
		return nil, err
	}

	c := &Client{scheme: scheme, retry: o.retry, timeout: o.timeout, w: o.w}
	hc := o.httpClient
	if hc == nil {
		c.ownTransport = newTransport(scheme)
		if o.tls != nil {
			c.ownTransport.TLSClientConfig = o.tls.Clone()
		}
		hc = &http.Client{Transport: c.ownTransport}
	}
	// No gzip: compressing claims and lists cost more CPU on both sides
	// than it saved on a LAN (docs/BENCHMARKS.md, session 12);
	// WithConnectOptions can add it back.
	// The caller's trace context travels with every call (outermost, so
	// that an otelconnect interceptor given in WithConnectOptions sends
	// its client span's instead).
	copts := append([]connect.ClientOption{connect.WithGRPC(), connect.WithAcceptCompression("gzip", nil, nil),
		connect.WithInterceptors(traceContext{})}, o.connectOpts...)
	if o.token != "" {
		copts = append(copts, BearerToken(o.token))
	}
	// Framed calls: in cleartext, or over TLS with WithTLS (the client
	// certificate is their credential: a token, which they cannot carry,
	// turns them off).
	framed := (scheme == "http" || o.tls != nil) && o.httpClient == nil && len(o.connectOpts) == 0 && !o.noFramed && o.token == ""
	c.eps = newEndpoints(seeds, func(base string) *endpoint {
		var tasks nornv1connect.TaskServiceClient = nornv1connect.NewTaskServiceClient(hc, base, copts...)
		switch {
		case framed && o.tls != nil:
			tasks = newFramedTasksTLS(tasks, strings.TrimPrefix(base, "https://"), o.tls)
		case framed:
			tasks = newFramedTasks(tasks, strings.TrimPrefix(base, "http://"))
		}
		return &endpoint{
			base:  base,
			tasks: tasks,
			admin: nornv1connect.NewAdminServiceClient(hc, base, copts...),
			queue: nornv1connect.NewQueueServiceClient(hc, base, copts...),
		}
	})
	if linger, maxBatch, on := o.enqueueB.settings(); on {
		c.enqueues = newEnqueueCoalescer(c, linger, maxBatch)
	}
	if linger, maxBatch, on := o.completeB.settings(); on {
		c.completes = newCompleteCoalescer(c, linger, maxBatch)
	}
	if o.discovery > 0 {
		c.startDiscovery(o.discovery)
	}
	return c, nil
}

// validate checks the arguments of a batching option (named option).
func (b batching) validate(option string) error {
	if b.set && (b.linger < 0 || b.maxBatch < 1 || b.maxBatch > maxBatchTasks) {
		return fmt.Errorf("norn: %s(%v, %d): need linger >= 0 and 1 <= maxBatch <= %d", option, b.linger, b.maxBatch, maxBatchTasks)
	}
	return nil
}

// settings returns the coalescer's linger and batch size, and whether
// batching is on.
func (b batching) settings() (linger time.Duration, maxBatch int, on bool) {
	switch {
	case !b.set:
		return 0, DefaultMaxBatch, true
	case b.linger == 0 && b.maxBatch == 1:
		return 0, 0, false
	}
	return b.linger, b.maxBatch, true
}

// parseAddr turns addr into a base URL and its scheme.
func parseAddr(addr string) (base, scheme string, err error) {
	if addr == "" {
		return "", "", errors.New("norn: empty address")
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return "", "", fmt.Errorf("norn: address %q: %w", addr, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", "", fmt.Errorf("norn: address %q: scheme must be http or https", addr)
	}
	if u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", "", fmt.Errorf("norn: address %q: want host:port or http://host:port", addr)
	}
	return strings.TrimRight(u.Scheme+"://"+u.Host+u.EscapedPath(), "/"), u.Scheme, nil
}

// newTransport returns an HTTP/2-only transport: cleartext HTTP/2 with
// prior knowledge (h2c) for "http", HTTP/2 over TLS for "https". Pings
// detect a dead connection within about 45 s when it is idle.
func newTransport(scheme string) *http.Transport {
	var p http.Protocols
	if scheme == "https" {
		p.SetHTTP2(true)
	} else {
		p.SetUnencryptedHTTP2(true)
	}
	return &http.Transport{
		Protocols:           &p,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout: 30 * time.Second,
			PingTimeout:     15 * time.Second,
		},
	}
}

// Close sends the enqueues still waiting in a batch, waits for the batches
// in flight, stops discovery, and closes idle connections and the framed
// ones. Calls made
// after Close fail with ErrClosed; calls already running finish normally.
// Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	already := c.closing
	c.closing = true
	c.mu.Unlock()
	if already {
		return nil
	}
	// Before c.closed: the last batches still need the client.
	if c.enqueues != nil {
		c.enqueues.close()
	}
	if c.completes != nil {
		c.completes.close()
	}
	c.stopDiscovery()
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	if c.ownTransport != nil {
		c.ownTransport.CloseIdleConnections()
	}
	c.eps.closeFramed()
	return nil
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Addr returns the base URL of the first address given to New, for
// example "http://127.0.0.1:7400".
func (c *Client) Addr() string { return c.eps.seeds[0] }

// Endpoints returns the base URLs the client now spreads its calls over:
// the addresses given to New, then the nodes learned by discovery.
func (c *Client) Endpoints() []string { return c.eps.bases() }

// TaskService returns the generated connect client of one node the Client
// would send to now (the next in turn), for the fields and calls the
// Client does not expose (for example GetTaskRequest.r). Its calls are
// neither retried, batched nor failed over.
func (c *Client) TaskService() nornv1connect.TaskServiceClient { return c.endpoint().tasks }

// AdminService returns the generated connect client of AdminService, as
// TaskService does for TaskService.
func (c *Client) AdminService() nornv1connect.AdminServiceClient { return c.endpoint().admin }

// endpoint picks the endpoint for a raw client.
func (c *Client) endpoint() *endpoint {
	c.firstUse()
	return c.eps.pick(time.Now(), nil)
}

// firstUse starts discovery on the client's first call.
func (c *Client) firstUse() {
	if !c.used.Load() && c.used.CompareAndSwap(false, true) {
		c.kickDiscovery()
	}
}

// withTimeout applies the client's timeout (plus extra) to a context that
// has no deadline.
func (c *Client) withTimeout(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || c.timeout == 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.timeout+extra)
}

// defaultHTTPS gives the addresses of a comma-separated list that have no
// scheme the scheme https.
func defaultHTTPS(addrs string) string {
	parts := strings.Split(addrs, ",")
	for i, a := range parts {
		if a = strings.TrimSpace(a); a != "" && !strings.Contains(a, "://") {
			parts[i] = "https://" + a
		}
	}
	return strings.Join(parts, ",")
}

// BearerToken is a connect client option that sends token as a bearer
// token with every call (what WithToken does), for callers of the
// generated clients.
func BearerToken(token string) connect.ClientOption {
	return connect.WithInterceptors(bearer("Bearer " + token))
}

// bearer is a client interceptor that sets the Authorization header.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
