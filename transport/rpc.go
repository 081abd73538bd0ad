package transport

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// PeerRPCGroup is the mux id, on the Raft port, of the framed node-to-node
// calls (the hot PeerService calls: Replicate). See RPCClient.
//
// Why not connect over HTTP/2 as the other peer calls: a unary connect call
// costs about 43 µs of server CPU (DESIGN, section 8) plus the client's,
// and the replication of a completion makes two of them; on the
// claim+complete benchmark a quarter of a node's CPU was HTTP/2 and
// connect framing. A frame here is a length, an id and the protobuf body;
// each connection has one reader and one writer goroutine, and the writer
// flushes only when no other frame is waiting, so concurrent calls share
// syscalls.
const PeerRPCGroup uint32 = 0xFFFF_FFFE

// RPCMethod names the call a frame carries.
type RPCMethod uint8

// The methods of the framed peer calls.
const (
	// MethodReplicate carries a norn.v1.ReplicateRequest and answers an
	// empty body.
	MethodReplicate RPCMethod = 1
	// MethodRaftHeartbeats carries the Raft heartbeats of many groups to
	// one node (Heartbeats) and answers theirs.
	MethodRaftHeartbeats RPCMethod = 2
	// MethodRaft carries one Raft RPC of one group other than a heartbeat
	// or a snapshot (Heartbeats.ServeRaft).
	MethodRaft RPCMethod = 3
)

// The methods of the framed client calls (SplitListener): each carries a
// TaskService request message and answers its response message. A client
// call's RPCMeta carries only its timeout (ClientCallMeta).
const (
	MethodEnqueueBatch  RPCMethod = 16
	MethodClaim         RPCMethod = 17
	MethodComplete      RPCMethod = 18
	MethodCompleteBatch RPCMethod = 19
	MethodRenew         RPCMethod = 20
	MethodEnqueue       RPCMethod = 21
)

// rpcTraced, set in a request frame's method byte, says a trace context
// follows the cluster id (see encodeRequest). Methods are below 128, so
// that the flag is free; MethodCancel (255) never carries it and is told
// apart first.
const rpcTraced RPCMethod = 0x80

// MethodCancel asks the server to cancel the context of a call under way
// on the same connection; its body is the call's id (8 bytes). It has no
// answer. Clients of the framed client calls send it when a call's
// context ends first.
const MethodCancel RPCMethod = 255

// ClientCallMeta is the RPCMeta of a framed client call under ctx: the
// time left before ctx's deadline, in ms, where peer calls carry the ring
// epoch (0: no deadline).
func ClientCallMeta(ctx context.Context) RPCMeta {
	dl, ok := ctx.Deadline()
	if !ok {
		return RPCMeta{}
	}
	return RPCMeta{Epoch: uint64(max(time.Until(dl).Milliseconds(), 1))}
}

// ClientCallTimeout is the timeout a framed client call carries (0: none).
func ClientCallTimeout(meta RPCMeta) time.Duration {
	return time.Duration(min(meta.Epoch, uint64(24*time.Hour/time.Millisecond))) * time.Millisecond
}

// RPCMeta is what a call says of its caller: the headers of a connect peer
// call (HeaderNode, HeaderCluster, HeaderEpoch) and the connection's remote
// address.
type RPCMeta struct {
	Node    string
	Cluster string
	Epoch   uint64
	Remote  string
	// Cert is the identity of the connection's verified TLS certificate
	// (nil over cleartext, or when the caller presented none): handlers
	// trust it over Node.
	Cert *Identity
	// Trace is the caller's trace context (W3C traceparent), invalid when
	// the call carried none. RPCClient.Call takes it from its context (a
	// field set here is ignored); the server puts it in the handler's
	// context as the remote parent (trace.SpanContextFromContext).
	Trace trace.SpanContext
}

// RPCHandler answers one call: a body, or an error (a *connect.Error keeps
// its code; any other error is INTERNAL).
type RPCHandler func(ctx context.Context, m RPCMethod, meta RPCMeta, body []byte) ([]byte, error)

// ErrRPCUnsupported means the peer does not serve framed calls (an older
// node): use its PeerService over connect.
var ErrRPCUnsupported = errors.New("transport: the peer serves no framed calls")

// maxRPCFrame bounds one frame, as connect's limits bound a peer call.
const maxRPCFrame = 64 << 20

// rpcHello is the byte a server writes when it takes a connection.
const rpcHello = 0x4e

// frameWriter writes frames from many goroutines through one writer
// goroutine that flushes when no frame is waiting.
type frameWriter struct {
	c    net.Conn
	q    chan []byte
	done chan struct{}
	once sync.Once
	err  atomic.Pointer[error]
}

func newFrameWriter(c net.Conn) *frameWriter {
	w := &frameWriter{c: c, q: make(chan []byte, 256), done: make(chan struct{})}
	go w.loop()
	return w
}

func (w *frameWriter) loop() {
	bw := bufio.NewWriterSize(w.c, 64<<10)
	for {
		var f []byte
		select {
		case f = <-w.q:
		case <-w.done:
			return
		}
		_, err := bw.Write(f)
		for err == nil && len(w.q) > 0 {
			_, err = bw.Write(<-w.q)
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			w.err.Store(&err)
			w.c.Close()
			w.close()
			return
		}
	}
}

// send queues a frame; it fails once the connection is dead.
func (w *frameWriter) send(f []byte) error {
	select {
	case w.q <- f:
		return nil
	case <-w.done:
		if e := w.err.Load(); e != nil {
			return *e
		}
		return net.ErrClosed
	}
}

func (w *frameWriter) close() { w.once.Do(func() { close(w.done) }) }

// readFrame reads one frame of at most most bytes (at most 64 MiB): a
// larger frame up to 64 MiB is read past (not kept) and reported as an
// *oversizedFrame, so the connection goes on; one over 64 MiB is an error
// that ends the connection.
func readFrame(r *bufio.Reader, most uint32) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size <= most {
		f := make([]byte, size)
		if _, err := io.ReadFull(r, f); err != nil {
			return nil, err
		}
		return f, nil
	}
	if size > maxRPCFrame || size < 8 {
		return nil, fmt.Errorf("frame of %d bytes exceeds %d", size, maxRPCFrame)
	}
	var id [8]byte
	if _, err := io.ReadFull(r, id[:]); err != nil {
		return nil, err
	}
	if _, err := r.Discard(int(size) - 8); err != nil {
		return nil, err
	}
	return nil, &oversizedFrame{id: binary.BigEndian.Uint64(id[:]), size: size, most: most}
}

// A request frame: length, id, method, epoch, node and cluster ids (a byte
// of length each), then the body. A traced frame (meta.Trace valid; method
// byte with rpcTraced set) has, after the cluster id, a byte of length and
// the binary trace context (AppendTraceContext); a reader takes what it
// knows of it and skips the rest.
//
// Compatibility: a node of an older version answers a traced frame
// UNIMPLEMENTED (an unknown method) without running it; the caller then
// sends the call again untraced and sends untraced frames on that
// connection from then on (rpcConn.untraced). An untraced frame is what
// every version reads.
func encodeRequest(id uint64, m RPCMethod, meta RPCMeta, body []byte) ([]byte, error) {
	if len(meta.Node) > 255 || len(meta.Cluster) > 255 {
		return nil, errors.New("transport: node or cluster id longer than 255 bytes")
	}
	traced := meta.Trace.IsValid() && m != MethodCancel
	n := 8 + 1 + 8 + 1 + len(meta.Node) + 1 + len(meta.Cluster) + len(body)
	if traced {
		n += 1 + TraceContextLen
		m |= rpcTraced
	}
	if n > maxRPCFrame {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("peer call of %d bytes exceeds %d", n, maxRPCFrame))
	}
	f := make([]byte, 0, 4+n)
	f = binary.BigEndian.AppendUint32(f, uint32(n))
	f = binary.BigEndian.AppendUint64(f, id)
	f = append(f, byte(m))
	f = binary.BigEndian.AppendUint64(f, meta.Epoch)
	f = append(f, byte(len(meta.Node)))
	f = append(f, meta.Node...)
	f = append(f, byte(len(meta.Cluster)))
	f = append(f, meta.Cluster...)
	if traced {
		f = append(f, TraceContextLen)
		f = AppendTraceContext(f, meta.Trace)
	}
	return append(f, body...), nil
}

func parseRequest(f []byte, conn RPCMeta) (id uint64, m RPCMethod, meta RPCMeta, body []byte, err error) {
	bad := errors.New("short request frame")
	if len(f) < 8+1+8+1 {
		return 0, 0, meta, nil, bad
	}
	id, m, meta.Epoch = binary.BigEndian.Uint64(f), RPCMethod(f[8]), binary.BigEndian.Uint64(f[9:])
	f = f[17:]
	str := func() (string, bool) {
		if len(f) < 1 || len(f) < 1+int(f[0]) {
			return "", false
		}
		s := string(f[1 : 1+int(f[0])])
		f = f[1+int(f[0]):]
		return s, true
	}
	var ok1, ok2 bool
	meta.Node, ok1 = str()
	meta.Cluster, ok2 = str()
	if !ok1 || !ok2 {
		return 0, 0, meta, nil, bad
	}
	if m != MethodCancel && m&rpcTraced != 0 {
		m &^= rpcTraced
		if len(f) < 1 || len(f) < 1+int(f[0]) {
			return 0, 0, meta, nil, bad
		}
		// A trace context this node cannot read is no reason to refuse
		// the call: it runs untraced.
		meta.Trace, _ = ParseTraceContext(f[1 : 1+int(f[0])])
		f = f[1+int(f[0]):]
	}
	meta.Remote, meta.Cert = conn.Remote, conn.Cert
	return id, m, meta, f, nil
}

// A response frame: length, id, code (0: ok, else a connect.Code), message
// length (2 bytes) and message, then the body; for an error, the body is
// the error's details, each a 4-byte length and a google.protobuf.Any
// (older readers ignore what follows an error's message).
func encodeResponse(id uint64, body []byte, err error) []byte {
	var code connect.Code
	var msg string
	if err != nil {
		body = nil
		var ce *connect.Error
		if errors.As(err, &ce) {
			code, msg = ce.Code(), ce.Message()
			body = encodeDetails(ce.Details())
		} else {
			code, msg = connect.CodeInternal, err.Error()
		}
		if len(msg) > 65535 {
			msg = msg[:65535]
		}
	}
	n := 8 + 1 + 2 + len(msg) + len(body)
	f := make([]byte, 0, 4+n)
	f = binary.BigEndian.AppendUint32(f, uint32(n))
	f = binary.BigEndian.AppendUint64(f, id)
	f = append(f, byte(code))
	f = binary.BigEndian.AppendUint16(f, uint16(len(msg)))
	f = append(f, msg...)
	return append(f, body...)
}

// maxErrorDetails bounds the details bytes an error frame carries.
const maxErrorDetails = 1 << 20

func encodeDetails(ds []*connect.ErrorDetail) []byte {
	var out []byte
	for _, d := range ds {
		b, err := proto.Marshal(&anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
		if err != nil || len(out)+4+len(b) > maxErrorDetails {
			continue
		}
		out = binary.BigEndian.AppendUint32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out
}

// decodeDetails adds the details in b to ce; what does not decode is
// left out.
func decodeDetails(ce *connect.Error, b []byte) {
	for len(b) >= 4 {
		n := int(binary.BigEndian.Uint32(b))
		if n > len(b)-4 {
			return
		}
		var a anypb.Any
		if proto.Unmarshal(b[4:4+n], &a) == nil {
			if d, err := connect.NewErrorDetail(&a); err == nil {
				ce.AddDetail(d)
			}
		}
		b = b[4+n:]
	}
}

type rpcResult struct {
	body []byte
	err  error
}

func parseResponse(f []byte) (uint64, rpcResult, error) {
	if len(f) < 11 {
		return 0, rpcResult{}, errors.New("short response frame")
	}
	id, code, ml := binary.BigEndian.Uint64(f), connect.Code(f[8]), int(binary.BigEndian.Uint16(f[9:]))
	if len(f) < 11+ml {
		return 0, rpcResult{}, errors.New("short response frame")
	}
	if code != 0 {
		ce := connect.NewError(code, errors.New(string(f[11:11+ml])))
		decodeDetails(ce, f[11+ml:])
		return id, rpcResult{err: ce}, nil
	}
	return id, rpcResult{body: f[11+ml:]}, nil
}

// Procedure returns the connect procedure whose request and response
// framed method m carries ("/norn.v1.TaskService/Enqueue"), or "" for the
// Raft methods and methods it does not know.
func (m RPCMethod) Procedure() string {
	switch m {
	case MethodReplicate:
		return nornv1connect.PeerServiceReplicateProcedure
	case MethodEnqueue:
		return nornv1connect.TaskServiceEnqueueProcedure
	case MethodEnqueueBatch:
		return nornv1connect.TaskServiceEnqueueBatchProcedure
	case MethodClaim:
		return nornv1connect.TaskServiceClaimProcedure
	case MethodComplete:
		return nornv1connect.TaskServiceCompleteProcedure
	case MethodCompleteBatch:
		return nornv1connect.TaskServiceCompleteBatchProcedure
	case MethodRenew:
		return nornv1connect.TaskServiceRenewProcedure
	}
	return ""
}
