package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	norn "github.com/norn-dev/norn/client"
	"github.com/norn-dev/norn/transport"
)

// makeCerts makes a CA in dir with node certificates for n1..n3
// (127.0.0.1) and a client certificate for "alice".
func makeCerts(t *testing.T, dir string) {
	t.Helper()
	if err := transport.CreateCA(dir, "test CA"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if err := transport.CreateNodeCert(dir, fmt.Sprintf("n%d", i), []string{"127.0.0.1", "localhost"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := transport.CreateClientCert(dir, "alice"); err != nil {
		t.Fatal(err)
	}
}

// tlsHTTPClient is an HTTP/2-over-TLS client trusting dir's CA, with
// user's client certificate (none for "").
func tlsHTTPClient(t *testing.T, dir, user string) *http.Client {
	t.Helper()
	conf := mustTLS(t, dir, user)
	p := new(http.Protocols)
	p.SetHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p, TLSClientConfig: conf}}
}

// startTLSCluster starts three nornd processes with TLS from dir's
// certificates.
func startTLSCluster(t *testing.T, dir string) []*clusterNode {
	t.Helper()
	ns := make([]*clusterNode, 3)
	addrs := freeAddrs(t, 3*len(ns))
	hc := tlsHTTPClient(t, dir, "alice")
	for i := range ns {
		id := fmt.Sprintf("n%d", i+1)
		cert, key := transport.NodeCertFiles(dir, id)
		ns[i] = &clusterNode{id: id, dir: t.TempDir(),
			api: addrs[3*i], raftA: addrs[3*i+1], gossipA: addrs[3*i+2], hc: hc, scheme: "https",
			flags: []string{"-tls-ca", filepath.Join(dir, transport.CACertFile), "-tls-cert", cert, "-tls-key", key}}
		ns[i].tasks = nornv1connect.NewTaskServiceClient(hc, "https://"+ns[i].api, connect.WithGRPC())
		ns[i].admin = nornv1connect.NewAdminServiceClient(hc, "https://"+ns[i].api)
	}
	joinAndStart(t, ns)
	return ns
}

// TestTLSCluster runs a 3-node cluster with TLS on its API ports and its
// peer calls: a client of the cluster's CA is served on every node (a
// task enqueued on one is read on the others, so replication runs over
// TLS), and the doors stay shut to a plaintext client, a client of
// another CA and a client certificate calling PeerService.
func TestTLSCluster(t *testing.T) {
	dir := t.TempDir()
	makeCerts(t, dir)
	ns := startTLSCluster(t, dir)
	ctx := context.Background()

	// The Go client over TLS, with the client certificate.
	c, err := norn.New(ns[0].api, norn.WithTLS(mustTLS(t, dir, "alice")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "tls", Payload: []byte("x")}, norn.WithQuorum(3))
	if err != nil {
		t.Fatalf("enqueue over TLS: %v", err)
	}
	for _, n := range ns[1:] {
		got, err := n.tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id}))
		if err != nil || got.Msg.GetTask().GetSpec().GetQueue() != "tls" {
			t.Fatalf("%s: get %d: %v", n.id, id, err)
		}
	}

	st, err := ns[1].admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{}))
	if err != nil || !st.Msg.GetSecurity().GetTls() || st.Msg.GetSecurity().GetInsecure() {
		t.Fatalf("status security: %v %v", st.Msg.GetSecurity(), err)
	}

	// JSON with a typo'd field is refused, naming it.
	resp, err := tlsHTTPClient(t, dir, "alice").Post("https://"+ns[0].api+"/norn.v1.TaskService/Enqueue", "application/json",
		strings.NewReader(`{"task": {"queue": "tls", "priorty": 5}}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "priorty") {
		t.Fatalf("JSON with an unknown field: %d %s", resp.StatusCode, body)
	}

	// A plaintext client (h2c) gets no answer: the port speaks TLS only.
	if _, err := client(ns[0].api).CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{})); err == nil {
		t.Fatal("a plaintext call was served")
	}
	// Plain HTTP/1.1 is told so (a 400 naming TLS), never served.
	if resp, err := http.Get("http://" + ns[0].api + "/healthz"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "serves TLS only") {
			t.Fatalf("plaintext HTTP/1.1 was served: %d %q", resp.StatusCode, b)
		}
	}

	// A client certificate of another CA is refused at the handshake.
	other := t.TempDir()
	makeCerts(t, other)
	oc := tlsHTTPClient(t, other, "alice")
	oc.Transport.(*http.Transport).TLSClientConfig.RootCAs = mustTLS(t, dir, "").RootCAs // trusts the nodes
	_, err = nornv1connect.NewTaskServiceClient(oc, "https://"+ns[0].api, connect.WithGRPC()).
		CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{}))
	// Refused at the handshake: with TLS 1.3 the client may see the
	// server's alert ("bad certificate") or only the connection breaking
	// under its first request ("broken pipe"); without the refusal the
	// call would be served (this node has no access file).
	if err == nil {
		t.Fatal("a client certificate of another CA was served")
	}

	// A user's certificate does not open PeerService, whatever node its
	// header claims.
	peer := nornv1connect.NewPeerServiceClient(tlsHTTPClient(t, dir, "alice"), "https://"+ns[0].api, connect.WithGRPC())
	req := connect.NewRequest(&nornv1.ReplicateRequest{})
	req.Header().Set(transport.HeaderNode, "n2")
	_, err = peer.Replicate(ctx, req)
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("Replicate with a user's certificate: %v, want permission_denied", err)
	}
}

// TestTLSClusterAdvertisesNames: nodes that advertise their API address
// by DNS name (localhost here; on Kubernetes the pod's name in the
// headless Service, deploy/k8s) and their Raft and gossip addresses by
// IP form a cluster and replicate to each other over TLS: a peer's
// certificate names it, so no check needs the name to resolve to the
// caller's IP (before, every peer call was refused and the cluster never
// became healthy).
func TestTLSClusterAdvertisesNames(t *testing.T) {
	dir := t.TempDir()
	makeCerts(t, dir)
	ns := make([]*clusterNode, 3)
	addrs := freeAddrs(t, 3*len(ns))
	hc := tlsHTTPClient(t, dir, "alice")
	for i := range ns {
		id := fmt.Sprintf("n%d", i+1)
		cert, key := transport.NodeCertFiles(dir, id)
		_, port, _ := net.SplitHostPort(addrs[3*i])
		ns[i] = &clusterNode{id: id, dir: t.TempDir(),
			api: addrs[3*i], raftA: addrs[3*i+1], gossipA: addrs[3*i+2], hc: hc, scheme: "https",
			flags: []string{"-tls-ca", filepath.Join(dir, transport.CACertFile), "-tls-cert", cert, "-tls-key", key,
				"-advertise", net.JoinHostPort("localhost", port)}}
		ns[i].tasks = nornv1connect.NewTaskServiceClient(hc, "https://"+ns[i].api, connect.WithGRPC())
		ns[i].admin = nornv1connect.NewAdminServiceClient(hc, "https://"+ns[i].api)
	}
	joinAndStart(t, ns)
	ctx := context.Background()
	st, err := ns[0].admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range st.Msg.GetNodes() {
		if host, _, _ := net.SplitHostPort(nd.GetApiAddress()); host != "localhost" {
			t.Fatalf("node %s advertises %q, want a localhost address", nd.GetId(), nd.GetApiAddress())
		}
	}
	// W=3: every replica must take the write from n1 over TLS.
	got, err := ns[0].tasks.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "names", Payload: []byte("x")}, W: 3}))
	if err != nil {
		t.Fatalf("enqueue with W=3: %v", err)
	}
	for _, n := range ns[1:] {
		if _, err := n.tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: got.Msg.GetId()})); err != nil {
			t.Fatalf("%s: get %d: %v", n.id, got.Msg.GetId(), err)
		}
	}
}

// TestTLSRaftPort: the Raft port of a TLS node takes node certificates of
// its CA only: a node certificate of another CA, a client's certificate of
// the right CA and no certificate are all refused at the handshake; the
// cluster's own node certificate gets through.
func TestTLSRaftPort(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	makeCerts(t, dir)
	makeCerts(t, other)
	ns := startTLSCluster(t, dir)
	pool := mustTLS(t, dir, "").RootCAs
	dial := func(certDir, cert, key string) error {
		conf := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", NextProtos: []string{transport.RaftALPN}, MinVersion: tls.VersionTLS13}
		if cert != "" {
			kp, err := tls.LoadX509KeyPair(filepath.Join(certDir, cert), filepath.Join(certDir, key))
			if err != nil {
				t.Fatal(err)
			}
			conf.Certificates = []tls.Certificate{kp}
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ns[0].raftA, conf)
		if err != nil {
			return err
		}
		defer c.Close()
		// TLS 1.3: a refused client certificate shows at the first read.
		c.SetReadDeadline(time.Now().Add(time.Second)) // below the mux's header timeout (5 s)
		_, err = c.Read(make([]byte, 1))
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return nil // accepted: the mux waits for the group header
		}
		return err
	}
	for _, c := range []struct{ name, dir, cert, key string }{
		{"another CA's node certificate", other, "node-n2.crt", "node-n2.key"},
		{"a client certificate", dir, "client-alice.crt", "client-alice.key"},
		{"no certificate", dir, "", ""},
	} {
		if err := dial(c.dir, c.cert, c.key); err == nil {
			t.Errorf("raft port with %s: accepted", c.name)
		}
	}
	if err := dial(dir, "node-n2.crt", "node-n2.key"); err != nil {
		t.Fatalf("raft port with n2's certificate: %v", err)
	}
}

// TestTLSRotation rotates a running 3-node cluster to a new CA without a
// failed call: clients trust both CAs first; then each node's CA bundle
// becomes old+new, then each node's certificate one of the new CA, and
// the nodes pick the files up by themselves (the watch) or on SIGHUP.
// A client making new connections all along sees no error, and at the
// end every node presents a certificate of the new CA on its API and
// Raft ports and still replicates (W=3).
func TestTLSRotation(t *testing.T) {
	dir, newCA := t.TempDir(), t.TempDir()
	makeCerts(t, dir)
	if err := transport.CreateCA(newCA, "new CA"); err != nil {
		t.Fatal(err)
	}
	ns := startTLSCluster(t, dir)
	oldPEM, _ := os.ReadFile(filepath.Join(dir, transport.CACertFile))
	newPEM, _ := os.ReadFile(filepath.Join(newCA, transport.CACertFile))
	bothPath := filepath.Join(t.TempDir(), "both.crt")
	if err := os.WriteFile(bothPath, append(append([]byte{}, oldPEM...), newPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	cert, key := transport.ClientCertFiles(dir, "alice")
	clientConf, err := norn.LoadTLSConfig(bothPath, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stop, failed := make(chan struct{}), make(chan error, 1)
	calls := make(chan int, 1)
	go func() {
		n := 0
		defer func() { calls <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			// A new client each time: a new TLS handshake each time.
			c, err := norn.New(ns[n%3].api, norn.WithTLS(clientConf), norn.WithDiscovery(0))
			if err == nil {
				_, err = c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "rot"}, norn.WithQuorum(2))
				c.Close()
			}
			if err != nil {
				failed <- fmt.Errorf("call %d during the rotation: %w", n, err)
				return
			}
			n++
		}
	}()

	// The CA bundle of every node: old and new (the same file for all).
	// A node has it once it takes a client certificate of the new CA.
	writeFileAtomic(t, filepath.Join(dir, transport.CACertFile), append(append([]byte{}, oldPEM...), newPEM...))
	if err := transport.CreateClientCert(newCA, "bob"); err != nil {
		t.Fatal(err)
	}
	bc, bk := transport.ClientCertFiles(newCA, "bob")
	bobConf, err := norn.LoadTLSConfig(bothPath, bc, bk)
	if err != nil {
		t.Fatal(err)
	}
	bob := &http.Client{Transport: &http.Transport{TLSClientConfig: bobConf, DisableKeepAlives: true}}
	for _, n := range ns {
		waitUntil(t, 30*time.Second, n.id+" trusting the new CA", func() bool {
			resp, err := bob.Get("https://" + n.api + "/healthz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	// Each node's certificate from the new CA, one node after the other;
	// n2 is told by SIGHUP, the others find the change themselves.
	for i, n := range ns {
		if err := transport.CreateNodeCert(newCA, n.id, []string{"127.0.0.1", "localhost"}); err != nil {
			t.Fatal(err)
		}
		nc, nk := transport.NodeCertFiles(newCA, n.id)
		oc, ok := transport.NodeCertFiles(dir, n.id)
		copyFile(t, nk, ok)
		copyFile(t, nc, oc)
		if i == 1 {
			n.proc.cmd.Process.Signal(syscall.SIGHUP)
		}
		waitUntil(t, 30*time.Second, n.id+" presenting the new CA's certificate", func() bool {
			return issuer(t, n.api, clientConf) == "new CA"
		})
	}
	time.Sleep(500 * time.Millisecond) // a few more calls on the new certificates
	close(stop)
	select {
	case err := <-failed:
		t.Fatal(err)
	case n := <-calls:
		if n < 10 {
			t.Fatalf("only %d calls during the rotation", n)
		}
		t.Logf("%d calls during the rotation, none failed", n)
	}
	for _, n := range ns {
		if got := issuer(t, n.raftA, nodeClientConf(t, newCA, "n1", bothPath)); got != "new CA" {
			t.Fatalf("%s's Raft port presents a certificate of %q", n.id, got)
		}
	}
	c, err := norn.New(ns[0].api, norn.WithTLS(clientConf))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "rot"}, norn.WithQuorum(3)); err != nil {
		t.Fatalf("W=3 after the rotation: %v", err)
	}
}

// issuer dials addr with conf and returns the common name of the issuer
// of the certificate the server presents.
func issuer(t *testing.T, addr string, conf *tls.Config) string {
	t.Helper()
	conf = conf.Clone()
	conf.InsecureSkipVerify = true // the name: checked by the callers' comparisons
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, conf)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Issuer.CommonName
}

// nodeClientConf is a TLS client configuration with node id's
// certificate of dir, for the Raft port.
func nodeClientConf(t *testing.T, dir, id, bundle string) *tls.Config {
	t.Helper()
	cert, key := transport.NodeCertFiles(dir, id)
	conf, err := norn.LoadTLSConfig(bundle, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	conf.NextProtos = []string{transport.RaftALPN}
	return conf
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFileAtomic(t, to, b)
}

func writeFileAtomic(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func mustTLS(t *testing.T, dir, user string) *tls.Config {
	t.Helper()
	cert, key := "", ""
	if user != "" {
		cert, key = transport.ClientCertFiles(dir, user)
	}
	conf, err := norn.LoadTLSConfig(filepath.Join(dir, transport.CACertFile), cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return conf
}

// TestTLSFlags: the -tls-* flags go together, a certificate of another
// node is refused at start, and cleartext on a non-loopback address needs
// -insecure.
func TestTLSFlags(t *testing.T) {
	dir := t.TempDir()
	makeCerts(t, dir)
	ca := filepath.Join(dir, transport.CACertFile)
	cert, key := transport.NodeCertFiles(dir, "n2")
	if out := runFails(t, 2, "-tls-ca", ca); !strings.Contains(out, "go together") {
		t.Fatalf("-tls-ca alone:\n%s", out)
	}
	if out := runFails(t, 1, "-node-id", "n1", "-tls-ca", ca, "-tls-cert", cert, "-tls-key", key); !strings.Contains(out, `not of node "n1"`) {
		t.Fatalf("n2's certificate on n1:\n%s", out)
	}
	out, err := exec.Command(norndBin, "-data-dir", t.TempDir(), "-listen", "0.0.0.0:0").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "-insecure") {
		t.Fatalf("cleartext on 0.0.0.0: %v\n%s", err, out)
	}
}
