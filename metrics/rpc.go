package metrics

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/reflect/protoreflect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/transport"
)

// The values of the RPC metrics' transport label.
const (
	TransportConnect = "connect" // connect over HTTP: gRPC, gRPC-Web, Connect, JSON
	TransportFramed  = "framed"  // the framed calls (transport.RPCClient)
)

// ServiceRaft is the service label of the framed Raft calls between
// nodes, which are no PeerService method: method "Heartbeats"
// (transport.MethodRaftHeartbeats) and "RPC" (transport.MethodRaft, one
// Raft RPC of one group).
const ServiceRaft = "raft"

// rpcBuckets are the classic buckets of the RPC latency histograms, in
// seconds: a framed call on loopback takes tens of µs, a long-polling
// Claim up to its wait (at most the node's -max-wait).
var rpcBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// nativeHistogram sets opts to keep a native histogram (buckets about
// 10% apart, at most 160, reset at most hourly) besides its classic
// buckets: a scraper that asks for the protobuf format gets both, the
// text format carries the classic ones.
func nativeHistogram(opts prometheus.HistogramOpts) prometheus.HistogramOpts {
	opts.NativeHistogramBucketFactor = 1.1
	opts.NativeHistogramMaxBucketNumber = 160
	opts.NativeHistogramMinResetDuration = time.Hour
	return opts
}

// side is which end of a call a series counts.
type side int

const (
	sideServer side = iota
	sideClient
)

// transportIndex is the index of a transport label value in
// rpcMethod.series.
const (
	viaConnect = iota
	viaFramed
)

// numCodes is the number of code label values: "ok" and connect's 16
// codes (1 to 16).
const numCodes = 17

// RPC counts the node's calls, served and made, and their latency: by
// service, method, transport and code (calls) and by service, method
// and transport (latency). It serves connect calls through Interceptor
// and framed calls through FramedServer and ObserveFramedClient.
//
// A call costs two clock reads, one counter increment and one histogram
// observation; the series of every method are found once (per connect
// procedure: in the interceptor's closure; per framed method: in an
// array) and made on first use, so a series exists only for what was
// called. Safe for concurrent use.
type RPC struct {
	calls    [2]*prometheus.CounterVec   // by side
	duration [2]*prometheus.HistogramVec // by side

	procs  map[string]*rpcMethod // by connect procedure; read-only after NewRPC
	framed [256]*rpcMethod       // by transport.RPCMethod; read-only after NewRPC
	other  *rpcMethod            // a procedure or framed method the API does not have

	mu    sync.Mutex
	extra map[string]*rpcMethod // procedures met that are not in procs (none in the API)
}

// rpcMethod is one method's series.
type rpcMethod struct {
	procedure       string // "" for a framed-only method
	service, method string
	series          [2][2]rpcSeries // by side, transport
	rpc             *RPC
}

// rpcSeries is the series of one method, side and transport, made on
// first use.
type rpcSeries struct {
	codes [numCodes]atomic.Pointer[prometheus.Counter]
	dur   atomic.Pointer[prometheus.Observer]
}

// NewRPC returns the RPC metrics of every method of the norn.v1 services
// and the framed calls, registered with reg.
func NewRPC(reg prometheus.Registerer) *RPC {
	r := &RPC{procs: map[string]*rpcMethod{}, extra: map[string]*rpcMethod{}}
	r.calls[sideServer] = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "norn_rpc_server_calls_total",
		Help: "Calls this node answered, by service, method, transport (connect or framed) and code (ok or the connect error code).",
	}, []string{"service", "method", "transport", "code"})
	r.calls[sideClient] = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "norn_rpc_client_calls_total",
		Help: "Calls this node made to other nodes, by service, method, transport (connect or framed) and code (ok or the connect error code).",
	}, []string{"service", "method", "transport", "code"})
	r.duration[sideServer] = prometheus.NewHistogramVec(nativeHistogram(prometheus.HistogramOpts{
		Name:    "norn_rpc_server_duration_seconds",
		Help:    "Time this node took to answer a call (a long-polling Claim's wait included), by service, method and transport.",
		Buckets: rpcBuckets,
	}), []string{"service", "method", "transport"})
	r.duration[sideClient] = prometheus.NewHistogramVec(nativeHistogram(prometheus.HistogramOpts{
		Name:    "norn_rpc_client_duration_seconds",
		Help:    "Time a call this node made to another node took, by service, method and transport.",
		Buckets: rpcBuckets,
	}), []string{"service", "method", "transport"})
	reg.MustRegister(r.calls[0], r.calls[1], r.duration[0], r.duration[1])

	for _, f := range []protoreflect.FileDescriptor{nornv1.File_norn_v1_task_service_proto,
		nornv1.File_norn_v1_admin_service_proto, nornv1.File_norn_v1_peer_service_proto, nornv1.File_norn_v1_queue_service_proto} {
		for i := range f.Services().Len() {
			s := f.Services().Get(i)
			for j := range s.Methods().Len() {
				m := s.Methods().Get(j)
				proc := "/" + string(s.FullName()) + "/" + string(m.Name())
				r.procs[proc] = r.newMethod(proc, string(s.FullName()), string(m.Name()))
			}
		}
	}
	r.other = r.newMethod("", "unknown", "unknown")
	for i := range r.framed {
		r.framed[i] = r.other
	}
	task := func(m string) *rpcMethod { return r.procs["/norn.v1.TaskService/"+m] }
	r.framed[transport.MethodEnqueue] = task("Enqueue")
	r.framed[transport.MethodEnqueueBatch] = task("EnqueueBatch")
	r.framed[transport.MethodClaim] = task("Claim")
	r.framed[transport.MethodComplete] = task("Complete")
	r.framed[transport.MethodCompleteBatch] = task("CompleteBatch")
	r.framed[transport.MethodRenew] = task("Renew")
	r.framed[transport.MethodReplicate] = r.procs["/norn.v1.PeerService/Replicate"]
	r.framed[transport.MethodRaftHeartbeats] = r.newMethod("", ServiceRaft, "Heartbeats")
	r.framed[transport.MethodRaft] = r.newMethod("", ServiceRaft, "RPC")
	for i, m := range r.framed {
		if m == nil {
			panic(fmt.Sprintf("metrics: framed method %d has no PeerService or TaskService method", i))
		}
	}
	return r
}

func (r *RPC) newMethod(proc, service, method string) *rpcMethod {
	return &rpcMethod{procedure: proc, service: service, method: method, rpc: r}
}

// method returns the series of a connect procedure.
func (r *RPC) method(proc string) *rpcMethod {
	if m, ok := r.procs[proc]; ok {
		return m
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.extra[proc]; ok {
		return m
	}
	// Not an API method (connect routes only those): counted as
	// unknown, with a bound on what is remembered.
	if len(r.extra) >= 64 {
		return r.other
	}
	service, method, _ := strings.Cut(strings.TrimPrefix(proc, "/"), "/")
	m := r.other
	if service != "" && method != "" {
		m = r.newMethod(proc, service, method)
	}
	r.extra[proc] = m
	return m
}

// observe counts one call of m on side s over transport via, started at
// start, that ended with err.
func (m *rpcMethod) observe(s side, via int, start time.Time, err error) {
	d := time.Since(start).Seconds()
	ser := &m.series[s][via]
	code := codeIndex(err)
	c := ser.codes[code].Load()
	if c == nil {
		c = ser.makeCounter(m, s, via, code)
	}
	(*c).Inc()
	h := ser.dur.Load()
	if h == nil {
		h = ser.makeObserver(m, s, via)
	}
	(*h).Observe(d)
}

func (ser *rpcSeries) makeCounter(m *rpcMethod, s side, via, code int) *prometheus.Counter {
	c := m.rpc.calls[s].WithLabelValues(m.service, m.method, transportNames[via], codeNames[code])
	ser.codes[code].CompareAndSwap(nil, &c)
	return ser.codes[code].Load()
}

func (ser *rpcSeries) makeObserver(m *rpcMethod, s side, via int) *prometheus.Observer {
	o := m.rpc.duration[s].WithLabelValues(m.service, m.method, transportNames[via])
	ser.dur.CompareAndSwap(nil, &o)
	return ser.dur.Load()
}

var transportNames = [2]string{viaConnect: TransportConnect, viaFramed: TransportFramed}

// codeNames are the code label values by codeIndex.
var codeNames = func() (n [numCodes]string) {
	n[0] = "ok"
	for c := 1; c < numCodes; c++ {
		n[c] = connect.Code(c).String()
	}
	return n
}()

// codeIndex is err's code label index: 0 for nil, else its connect code
// (a context's error as connect reports it; any other error unknown).
func codeIndex(err error) int {
	if err == nil {
		return 0
	}
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		if c := int(ce.Code()); c > 0 && c < numCodes {
			return c
		}
	case errors.Is(err, context.Canceled):
		return int(connect.CodeCanceled)
	case errors.Is(err, context.DeadlineExceeded):
		return int(connect.CodeDeadlineExceeded)
	}
	return int(connect.CodeUnknown)
}

// Interceptor returns the connect interceptor of the RPC metrics, for
// handlers (server side) and clients (client side) alike. Put it first
// (outermost), so that calls other interceptors refuse are counted too.
// Norn's API has unary methods only: streams pass through uncounted.
func (r *RPC) Interceptor() connect.Interceptor { return rpcInterceptor{r} }

type rpcInterceptor struct{ r *RPC }

// WrapUnary wraps one procedure's handler or client (connect wraps each
// once), so the closure keeps the procedure's series after its first
// call.
func (i rpcInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	var cached atomic.Pointer[rpcMethod]
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		spec := req.Spec()
		m := cached.Load()
		if m == nil || m.procedure != spec.Procedure {
			m = i.r.method(spec.Procedure)
			cached.Store(m)
		}
		resp, err := next(ctx, req)
		s := sideServer
		if spec.IsClient {
			s = sideClient
		}
		m.observe(s, viaConnect, start, err)
		return resp, err
	}
}

func (rpcInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (rpcInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// FramedServer wraps the handler of framed calls (client calls on the API
// port, peer calls on the Raft port) to count them on the server side.
func (r *RPC) FramedServer(h transport.RPCHandler) transport.RPCHandler {
	return func(ctx context.Context, m transport.RPCMethod, meta transport.RPCMeta, body []byte) ([]byte, error) {
		start := time.Now()
		out, err := h(ctx, m, meta, body)
		r.framed[m].observe(sideServer, viaFramed, start, err)
		return out, err
	}
}

// ObserveRefused counts a call the node refused before connect read it
// (its caller checked before its body: node's edge), started at start.
// A procedure the API does not have counts as unknown: no series is made
// for a path a caller made up.
func (r *RPC) ObserveRefused(procedure string, start time.Time, err error) {
	m, ok := r.procs[procedure]
	if !ok {
		m = r.other
	}
	m.observe(sideServer, viaConnect, start, err)
}

// ObserveFramedRefused counts a framed call refused before its handler
// ran (transport.RPCServerConfig.Refused).
func (r *RPC) ObserveFramedRefused(m transport.RPCMethod, err error) {
	r.framed[m].observe(sideServer, viaFramed, time.Now(), err)
}

// ObserveFramedClient counts one framed call this node made
// (transport.PeersConfig.ObserveRPC).
func (r *RPC) ObserveFramedClient(m transport.RPCMethod, start time.Time, err error) {
	r.framed[m].observe(sideClient, viaFramed, start, err)
}
