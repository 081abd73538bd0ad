package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/access"
	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	norn "github.com/norn-dev/norn/client"
	"github.com/norn-dev/norn/transport"
)

// startTLSNode starts one nornd (a cluster of itself) with TLS from dir's
// certificates as n1, and more flags; it waits until /healthz answers.
func startTLSNode(t *testing.T, dir string, extra ...string) *process {
	t.Helper()
	addr := freeAddr(t)
	cert, key := transport.NodeCertFiles(dir, "n1")
	args := append([]string{"-node-id", "n1", "-data-dir", t.TempDir(), "-listen", addr, "-partitions", "8",
		"-raft-timeout", "100ms", "-log-level", "warn",
		"-tls-ca", filepath.Join(dir, transport.CACertFile), "-tls-cert", cert, "-tls-key", key}, extra...)
	cmd := exec.Command(norndBin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, addr: addr}
	t.Cleanup(p.kill)
	hc := tlsHTTPClient(t, dir, "")
	waitUntil(t, 20*time.Second, "nornd with TLS healthy", func() bool {
		resp, err := hc.Get("https://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// TestAuthRoles: a TLS node with an access file answers UNAUTHENTICATED
// to a call without credentials, with a wrong token and with a revoked
// one, and PERMISSION_DENIED to a role or a queue outside the caller's
// grants, whether a task of another queue exists or not; within the
// grants, by token or by client certificate, calls are served.
func TestAuthRoles(t *testing.T) {
	dir := t.TempDir()
	makeCerts(t, dir)
	authPath := filepath.Join(t.TempDir(), "auth.json")
	prodTok, prodEntry := access.NewToken("prod", time.Now())
	opsTok, opsEntry := access.NewToken("ops", time.Now())
	f := &access.File{
		Users: map[string]access.User{
			"alice": {Grants: []access.Grant{{Role: access.RoleWorker, Queues: []string{"emails"}}}},
			"prod":  {Grants: []access.Grant{{Role: access.RoleProducer, Queues: []string{"emails", "billing.*"}}}},
			"ops":   {Grants: []access.Grant{{Role: access.RoleAdmin}}},
		},
		Tokens: []access.TokenEntry{prodEntry, opsEntry},
	}
	if err := f.Write(authPath); err != nil {
		t.Fatal(err)
	}
	p := startTLSNode(t, dir, "-auth-file", authPath)
	ctx := context.Background()
	newClient := func(user, token string) *norn.Client {
		opts := []norn.Option{norn.WithTLS(mustTLS(t, dir, user)), norn.WithRetry(norn.RetryPolicy{MaxAttempts: 1}), norn.WithDiscovery(0)}
		if token != "" {
			opts = append(opts, norn.WithToken(token))
		}
		c, err := norn.New(p.addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	wantCode := func(what string, err error, code connect.Code, msg string) {
		t.Helper()
		if connect.CodeOf(err) != code || !strings.Contains(err.Error(), msg) {
			t.Fatalf("%s: %v, want %s saying %q", what, err, code, msg)
		}
	}
	spec := func(q string) *nornv1.TaskSpec { return &nornv1.TaskSpec{Queue: q} }

	_, err := newClient("", "").Enqueue(ctx, spec("emails"))
	wantCode("no credentials", err, connect.CodeUnauthenticated, "no credentials")
	_, err = newClient("", prodTok+"x").Enqueue(ctx, spec("emails"))
	wantCode("a wrong token", err, connect.CodeUnauthenticated, "not valid")

	prod := newClient("", prodTok)
	emailID, err := prod.Enqueue(ctx, spec("emails"))
	if err != nil {
		t.Fatalf("producer, its queue: %v", err)
	}
	billID, err := prod.Enqueue(ctx, spec("billing.eu"))
	if err != nil {
		t.Fatalf("producer, its prefix: %v", err)
	}
	_, err = prod.Enqueue(ctx, spec("other"))
	wantCode("producer, another queue", err, connect.CodePermissionDenied, `queue "other"`)
	_, err = prod.Claim(ctx, norn.ClaimRequest{Queue: "emails", Worker: "w"})
	wantCode("producer claiming", err, connect.CodePermissionDenied, "role admin or worker")

	alice := newClient("alice", "") // her client certificate
	got, err := alice.Claim(ctx, norn.ClaimRequest{Queue: "emails", Worker: "w"})
	if err != nil || len(got) != 1 || got[0].GetTask().GetId() != emailID {
		t.Fatalf("worker, its queue: %v %v", got, err)
	}
	_, err = alice.Claim(ctx, norn.ClaimRequest{Queue: "billing.eu", Worker: "w"})
	wantCode("worker, another queue", err, connect.CodePermissionDenied, `queue "billing.eu"`)
	err = alice.Complete(ctx, billID, 12345, nil)
	wantCode("worker completing another queue's task", err, connect.CodePermissionDenied, "not in a queue it is granted")
	// A task that does not exist is refused the same way: no leak.
	_, err = alice.GetTask(ctx, billID+1000)
	wantCode("worker reading a task that does not exist", err, connect.CodePermissionDenied, "not in a queue it is granted")
	if _, err := alice.GetTask(ctx, emailID); err != nil {
		t.Fatalf("worker reading its queue's task: %v", err)
	}
	_, err = alice.Status(ctx)
	wantCode("worker asking for Status", err, connect.CodePermissionDenied, "Status")
	if _, err := newClient("", opsTok).Status(ctx); err != nil {
		t.Fatalf("admin Status: %v", err)
	}
	// A token names the caller of its call, whatever certificate the
	// connection carries: alice's connection with ops's token is ops.
	if _, err := newClient("alice", opsTok).Status(ctx); err != nil {
		t.Fatalf("Status with alice's certificate and ops's token: %v", err)
	}

	// Revoked: the file without prod's token, picked up on SIGHUP.
	f.Tokens = []access.TokenEntry{opsEntry}
	if err := f.Write(authPath); err != nil {
		t.Fatal(err)
	}
	p.cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, 10*time.Second, "the revoked token refused", func() bool {
		_, err := newClient("", prodTok).Enqueue(ctx, spec("emails"))
		return connect.CodeOf(err) == connect.CodeUnauthenticated
	})
	_, err = newClient("", prodTok).Enqueue(ctx, spec("emails"))
	wantCode("a revoked token", err, connect.CodeUnauthenticated, "not valid")
}
