package jepsen

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/norn-dev/norn/access"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/client"
	"github.com/norn-dev/norn/transport"
)

// The cluster under test runs secure, as a production cluster should
// (docs/SECURITY.md): TLS on the API and Raft ports with node
// certificates of a CA made for the run, gossip encrypted with a cluster
// key, and an access file. The workload's hot calls (framed, over TLS)
// authenticate with the client certificate of user "jepsen" (producer
// and worker on every queue); its AdminService calls with a bearer token
// of user "ops" (admin).

// security holds what the run's nodes and clients are given.
type security struct {
	dir      string // certs, gossip key and access file
	token    string // ops's bearer token
	clientTL *tls.Config
}

// newSecurity makes the CA, the certificates of nodes n1..n<nodes> (each
// key readable only by its node's uid), the gossip key and the access
// file under dir.
func newSecurity(dir string, nodes int) (*security, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	if err := transport.CreateCA(dir, "norn-jepsen CA"); err != nil {
		return nil, err
	}
	if err := transport.CreateGossipKey(dir); err != nil {
		return nil, err
	}
	for i := 1; i <= nodes; i++ {
		id := fmt.Sprintf("n%d", i)
		if err := transport.CreateNodeCert(dir, id, []string{NodeIP(i)}); err != nil {
			return nil, err
		}
		_, key := transport.NodeCertFiles(dir, id)
		if err := os.Chown(key, uidBase+i, uidBase+i); err != nil {
			return nil, err
		}
	}
	if err := transport.CreateClientCert(dir, "jepsen"); err != nil {
		return nil, err
	}
	tok, entry := access.NewToken("ops", time.Now())
	f := &access.File{
		Users: map[string]access.User{
			"jepsen": {Grants: []access.Grant{{Role: access.RoleProducer}, {Role: access.RoleWorker}, {Role: access.RoleReader}}},
			"ops":    {Grants: []access.Grant{{Role: access.RoleAdmin}}},
		},
		Tokens: []access.TokenEntry{entry},
	}
	authPath := filepath.Join(dir, "auth.json")
	if err := f.Write(authPath); err != nil {
		return nil, err
	}
	// Readable by every node's uid: the gossip key, the access file (a
	// test's secrets; a real cluster gives each node its own copy).
	for _, p := range []string{filepath.Join(dir, transport.GossipKeyFile), authPath, filepath.Join(dir, transport.CACertFile)} {
		if err := os.Chmod(p, 0o644); err != nil {
			return nil, err
		}
	}
	cert, key := transport.ClientCertFiles(dir, "jepsen")
	conf, err := client.LoadTLSConfig(filepath.Join(dir, transport.CACertFile), cert, key)
	if err != nil {
		return nil, err
	}
	return &security{dir: dir, token: tok, clientTL: conf}, nil
}

// nodeArgs are node id's security flags.
func (s *security) nodeArgs(id string) []string {
	cert, key := transport.NodeCertFiles(s.dir, id)
	return []string{"-tls-ca", filepath.Join(s.dir, transport.CACertFile), "-tls-cert", cert, "-tls-key", key,
		"-gossip-key", filepath.Join(s.dir, transport.GossipKeyFile), "-auth-file", filepath.Join(s.dir, "auth.json")}
}

// httpClient is the harness's HTTP client of the nodes: TLS with the
// jepsen client certificate.
func (s *security) httpClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 5 * time.Second,
		TLSClientConfig: s.clientTL.Clone(), TLSHandshakeTimeout: 2 * time.Second}}
}

// clients are node n's API clients: TaskService with the hot calls framed
// over TLS (the client certificate), AdminService with ops's token alone
// (adminHC presents no client certificate).
func (s *security) clients(hc, adminHC *http.Client, api string) (nornv1connect.TaskServiceClient, nornv1connect.AdminServiceClient) {
	base := "https://" + api
	tasks := client.NewFramedTaskServiceTLS(nornv1connect.NewTaskServiceClient(hc, base), api, s.clientTL)
	admin := nornv1connect.NewAdminServiceClient(adminHC, base, client.BearerToken(s.token))
	return tasks, admin
}

// nodeHTTPClient is an HTTP client of the nodes with node id's
// certificate: for the calls the harness makes as a node forwarding to
// another (Node.Forwarding).
func (s *security) nodeHTTPClient(id string) (*http.Client, error) {
	cert, key := transport.NodeCertFiles(s.dir, id)
	conf, err := client.LoadTLSConfig(filepath.Join(s.dir, transport.CACertFile), cert, key)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 5 * time.Second,
		TLSClientConfig: conf, TLSHandshakeTimeout: 2 * time.Second}}, nil
}

// adminHTTPClient is httpClient without the client certificate: the
// admin calls authenticate by token only.
func (s *security) adminHTTPClient() *http.Client {
	conf := s.clientTL.Clone()
	conf.Certificates = nil
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 5 * time.Second,
		TLSClientConfig: conf, TLSHandshakeTimeout: 2 * time.Second}}
}
