package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"

	"github.com/norn-dev/norn/testhooks"
)

// Identities in certificates (docs/SECURITY.md). A node's certificate
// carries the URI SAN norn://node/<id>; a client's carries
// norn://user/<name> (and the name as its Common Name). The cluster's CA
// signs both; nothing else is trusted.
const (
	nodeURIPrefix = "norn://node/"
	userURIPrefix = "norn://user/"
)

// NodeURI is the URI SAN of node id's certificate.
func NodeURI(id string) *url.URL { return &url.URL{Scheme: "norn", Host: "node", Path: "/" + id} }

// UserURI is the URI SAN of user name's client certificate.
func UserURI(name string) *url.URL { return &url.URL{Scheme: "norn", Host: "user", Path: "/" + name} }

// Identity is who a verified certificate speaks for: a node (Node set) or
// a user (User set), never both.
type Identity struct {
	Node string
	User string
}

// CertIdentity reads the identity of a certificate the CA verified: its
// norn://node/ or norn://user/ URI SAN. A certificate with neither, with
// several, or with both kinds has none (an error).
func CertIdentity(c *x509.Certificate) (Identity, error) {
	var id Identity
	n := 0
	for _, u := range c.URIs {
		s := u.String()
		switch {
		case strings.HasPrefix(s, nodeURIPrefix):
			id.Node = strings.TrimPrefix(s, nodeURIPrefix)
			n++
		case strings.HasPrefix(s, userURIPrefix):
			id.User = strings.TrimPrefix(s, userURIPrefix)
			n++
		}
	}
	if n != 1 || (id.Node == "" && id.User == "") {
		return Identity{}, fmt.Errorf("certificate %q: want exactly one %s<id> or %s<name> URI SAN", c.Subject.CommonName, nodeURIPrefix, userURIPrefix)
	}
	return id, nil
}

// TLSFiles names the PEM files of a node's or a client's TLS: the CA
// bundle (one or more CA certificates: during a rotation the old and the
// new), and the certificate and its key.
type TLSFiles struct {
	CA, Cert, Key string
}

// Certs holds a TLSFiles' certificates, read again by Reload (on SIGHUP or
// when the files' modification times change: Watch). Handshakes take the
// current ones, so a rotation needs no restart: new connections use the
// new certificate, existing ones keep theirs. Safe for concurrent use.
type Certs struct {
	*Reloader
	files TLSFiles
	cur   atomic.Pointer[certSet]
	// AcceptAnyClient is the seeded bug tls-any-client (a build with
	// the test hooks only): listeners take a client certificate of any
	// CA, reading its identity without verifying it.
	AcceptAnyClient bool
}

type certSet struct {
	pool *x509.CertPool
	cert *tls.Certificate
}

// LoadCerts reads the files; an error names the file at fault.
func LoadCerts(files TLSFiles) (*Certs, error) {
	c := &Certs{files: files}
	r, err := NewReloader(c.load, files.CA, files.Cert, files.Key)
	if err != nil {
		return nil, err
	}
	c.Reloader = r
	return c, nil
}

// load reads the files and installs them; on an error the certificates
// in use stay.
func (c *Certs) load() error {
	caPEM, err := os.ReadFile(c.files.CA)
	if err != nil {
		return fmt.Errorf("tls: CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("tls: CA bundle %s: no PEM certificate in it", c.files.CA)
	}
	kp, err := tls.LoadX509KeyPair(c.files.Cert, c.files.Key)
	if err != nil {
		return fmt.Errorf("tls: certificate %s and key %s: %w", c.files.Cert, c.files.Key, err)
	}
	if kp.Leaf == nil {
		if kp.Leaf, err = x509.ParseCertificate(kp.Certificate[0]); err != nil {
			return fmt.Errorf("tls: certificate %s: %w", c.files.Cert, err)
		}
	}
	c.cur.Store(&certSet{pool: pool, cert: &kp})
	return nil
}

// Identity is the identity of the certificate in use.
func (c *Certs) Identity() (Identity, error) { return CertIdentity(c.cur.Load().cert.Leaf) }

// verify checks a peer's chain against the current CA bundle, for the
// given use, and returns its identity.
func (c *Certs) verify(raw [][]byte, usage x509.ExtKeyUsage) (Identity, error) {
	if len(raw) == 0 {
		return Identity{}, errors.New("tls: no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		cert, err := x509.ParseCertificate(r)
		if err != nil {
			return Identity{}, fmt.Errorf("tls: certificate: %w", err)
		}
		certs[i] = cert
	}
	inter := x509.NewCertPool()
	for _, cert := range certs[1:] {
		inter.AddCert(cert)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: c.cur.Load().pool, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return Identity{}, fmt.Errorf("tls: certificate %q: %w", certs[0].Subject.CommonName, err)
	}
	return CertIdentity(certs[0])
}

// ServerConfig is the TLS 1.3 configuration of a listener: it presents
// the current certificate, offers alpn, and asks for a client certificate.
// With requireNode a client must present a node certificate (the Raft
// port); otherwise a client certificate is optional (the API port: a
// client may use a token instead), but one presented must verify and
// name a node or a user. Handlers read the identity with
// IdentityOf(conn.ConnectionState()).
func (c *Certs) ServerConfig(alpn []string, requireNode bool) *tls.Config {
	auth := tls.RequestClientCert
	if requireNode {
		auth = tls.RequireAnyClientCert
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: alpn,
		ClientAuth: auth,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cur.Load().cert, nil
		},
		// Verified here, against the bundle of the moment (a static
		// ClientCAs would miss a rotation).
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return nil // no certificate: allowed unless requireNode (then refused before this)
			}
			if testhooks.Built && c.AcceptAnyClient {
				return nil // the seeded bug: any CA will do
			}
			id, err := c.verify(raw, x509.ExtKeyUsageClientAuth)
			if err != nil {
				return err
			}
			if requireNode && id.Node == "" {
				return fmt.Errorf("tls: user %q's certificate: this port takes node certificates only", id.User)
			}
			return nil
		},
	}
}

// ClientConfig is the TLS 1.3 configuration of a connection to a node:
// it presents the current certificate and accepts only a node certificate
// from the CA bundle of the moment (of node wantNode, unless it is "").
// Server names are not checked: the CA and the node id in the
// certificate are, as nodes are reached at addresses that may change.
func (c *Certs) ClientConfig(alpn []string, wantNode string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: alpn,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.cur.Load().cert, nil
		},
		InsecureSkipVerify: true, // verified below, against the current bundle
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			id, err := c.verify(raw, x509.ExtKeyUsageServerAuth)
			if err != nil {
				return err
			}
			if id.Node == "" {
				return fmt.Errorf("tls: the server presented user %q's certificate, not a node's", id.User)
			}
			if wantNode != "" && id.Node != wantNode {
				return fmt.Errorf("tls: the server is node %q, want %q", id.Node, wantNode)
			}
			return nil
		},
	}
}

// IdentityOf is the identity of a connection's verified client
// certificate (false when it presented none). The listeners' configs
// (ServerConfig) verify every certificate presented before a connection
// is served.
func IdentityOf(st tls.ConnectionState) (Identity, bool) {
	if len(st.PeerCertificates) == 0 {
		return Identity{}, false
	}
	id, err := CertIdentity(st.PeerCertificates[0])
	return id, err == nil
}

type identityKey struct{}

// WithIdentity returns ctx carrying the identity of the call's verified
// TLS client certificate (set by the node's HTTP layer).
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// IdentityFromContext is the identity WithIdentity put in ctx.
func IdentityFromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}
