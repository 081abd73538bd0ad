package node

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/transport"
)

// Who calls, checked before a request's body is read, and the bytes the
// node holds for requests in flight (issue 42; docs/SECURITY.md, "The
// memory bound"). A TLS client certificate is optional at the handshake
// (a bearer token may stand in for it), so a caller with neither reaches
// net/http; before this check PeerService read a body of up to 64 MiB
// before it looked at its caller: 24 such calls without a certificate
// grew the heap by 1-1.7 GB and made every partition group hold an
// election (TestLargeRequestsWithoutCertificate).

// PeerMaxRequestBytes is the largest request body PeerService reads, only
// once its caller has been admitted as a node of the cluster: Replicate
// carries up to 10,000 task states, anti-entropy's SegmentEntries a
// segment's. The framed peer calls on the Raft port have the same bound
// per frame.
const PeerMaxRequestBytes = 64 << 20

// Defaults of Config.MaxInflightClientBytes and MaxInflightPeerBytes.
const (
	// DefaultMaxInflightClientBytes: 16 requests at the default 4 MiB
	// limit at once, thousands of ordinary ones (a task of a few KiB).
	DefaultMaxInflightClientBytes = 64 << 20
	// DefaultMaxInflightPeerBytes: 4 peer requests of the largest size
	// (PeerMaxRequestBytes), or the replication of 16 peers at their
	// busiest (2 calls of 8 MiB in flight per peer: coord's sender).
	DefaultMaxInflightPeerBytes = 256 << 20
)

// grpcEnvelope is what a gRPC or gRPC-Web body holds besides its message:
// the 5-byte prefix of its one envelope.
const grpcEnvelope = 5

// edge wraps the API's mux: for every TaskService, AdminService,
// QueueService and PeerService call it finds the caller from the connection's verified
// certificate (passed on in the context; over TLS a PeerService call's
// node header is set from it: emptied for a user's certificate or none),
// refuses at once, before any byte of the body is read, a caller who may
// make no call of the service, and a body declared larger than the
// service's limit; then it reads the body through the node's client or
// peer Budget, given back when the call has been answered.
//
// Refused before the body: a PeerService call from anything but a node
// of this cluster (server.AdmitPeer, PERMISSION_DENIED); with access
// control on (TLS, or an access file), a client call with no certificate
// and no valid bearer token (server.AdmitClient, UNAUTHENTICATED). The
// checks by method and queue stay where they were (AuthInterceptor,
// every PeerService method's checkPeer), once the body is decoded.
func (n *Node) edge(next http.Handler) http.Handler {
	peerPrefix := "/" + nornv1connect.PeerServiceName + "/"
	taskPrefix := "/" + nornv1connect.TaskServiceName + "/"
	adminPrefix := "/" + nornv1connect.AdminServiceName + "/"
	queuePrefix := "/" + nornv1connect.QueueServiceName + "/"
	errs := connect.NewErrorWriter()
	tlsOn := n.cfg.TLS != nil
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var id transport.Identity
		if tlsOn && r.TLS != nil {
			id, _ = transport.IdentityOf(*r.TLS)
		}
		if id != (transport.Identity{}) {
			r = r.WithContext(transport.WithIdentity(r.Context(), id))
		}
		var budget *transport.Budget
		var limit int64
		var err error
		switch path := r.URL.Path; {
		case strings.HasPrefix(path, peerPrefix):
			if tlsOn {
				r.Header.Set(transport.HeaderNode, id.Node)
			}
			err = n.server.AdmitPeer(r.RemoteAddr, r.Header)
			budget, limit = n.peerBudget, PeerMaxRequestBytes
		case strings.HasPrefix(path, taskPrefix), strings.HasPrefix(path, adminPrefix), strings.HasPrefix(path, queuePrefix),
			strings.HasPrefix(path, reflectionPrefixes[0]), strings.HasPrefix(path, reflectionPrefixes[1]):
			if nid := r.Header.Get(transport.HeaderNode); !tlsOn && n.cfg.Auth != nil && nid != "" && nid != n.cfg.NodeID &&
				n.server.AdmitPeer(r.RemoteAddr, r.Header) == nil {
				// Over cleartext a node forwarding a client's call is
				// known as a PeerService caller is: by its name and its
				// address ("Who may make a peer call", SECURITY.md). A
				// node never forwards to itself: a call naming this node
				// is a client's.
				id = transport.Identity{Node: nid}
				r = r.WithContext(transport.WithIdentity(r.Context(), id))
			}
			err = n.server.AdmitClient(path, id, r.Header.Get("Authorization"))
			budget, limit = n.clientBudget, int64(n.cfg.MaxRequestBytes)
		default:
			next.ServeHTTP(w, r)
			return
		}
		encoding := bodyEncoding(r.Header)
		if err == nil && encoding == "" && r.ContentLength > limit+grpcEnvelope {
			err = connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("request of %d bytes exceeds the limit of %d", r.ContentLength, limit))
		}
		if err != nil {
			n.metrics.rpc.ObserveRefused(r.URL.Path, start, err)
			errs.Write(w, r, err) //nolint:errcheck // the caller is gone
			return
		}
		body := budget.Body(r.Context(), r.Body, transport.BodyShape{Limit: limit, Length: r.ContentLength, Encoding: encoding,
			Enveloped: strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc"), Shared: r.ProtoMajor >= 2})
		defer body.Release()
		r.Body = body
		next.ServeHTTP(w, r)
	})
}

// bodyEncoding is the compression a request's body says it has, by the
// header of each protocol ("" for none).
func bodyEncoding(h http.Header) string {
	for _, k := range []string{"Content-Encoding", "Connect-Content-Encoding", "Grpc-Encoding"} {
		if v := h.Get(k); v != "" && !strings.EqualFold(v, "identity") {
			return v
		}
	}
	return ""
}

// admitFramed is the framed client calls' check before a frame's body is
// read (transport.RPCServerConfig.Admit): the connection's certificate is
// their only credential, so with access control on, a connection without
// one has every call refused as AdmitClient refuses it.
func (n *Node) admitFramed(m transport.RPCMethod, meta transport.RPCMeta) error {
	var id transport.Identity
	if meta.Cert != nil {
		id = *meta.Cert
	}
	proc := m.Procedure()
	if proc == "" {
		proc = fmt.Sprintf("framed method %d", m)
	}
	return n.server.AdmitClient(proc, id, "")
}
