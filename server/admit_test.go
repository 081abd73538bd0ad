package server

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/access"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/transport"
)

// TestAdmitClient: before a body is read, a client call is refused only
// when it can be nobody: with access control on (TLS, or an access file),
// no certificate and no valid token, with AuthInterceptor's error and an
// audit line; callers who may be somebody pass on to the checks by
// method and queue.
func TestAdmitClient(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	tok, entry := access.NewToken("ci", time.Now())
	f := &access.File{Users: map[string]access.User{"ci": {Grants: []access.Grant{{Role: access.RoleProducer}}}}, Tokens: []access.TokenEntry{entry}}
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	rules, err := access.LoadRules(path)
	if err != nil {
		t.Fatal(err)
	}
	user, node := transport.Identity{User: "alice"}, transport.Identity{Node: "n2"}
	type caller struct {
		cert  transport.Identity
		authz string
	}
	callers := map[string]caller{
		"nothing":          {},
		"user certificate": {cert: user},
		"node certificate": {cert: node},
		"token":            {authz: "Bearer " + tok},
		"bad token":        {authz: "Bearer norn_00000000_nope"},
		"not bearer":       {authz: "Basic abc"},
	}
	const ok = connect.Code(0)
	un := connect.CodeUnauthenticated
	for _, mode := range []struct {
		name string
		cfg  Config
		want map[string]connect.Code // missing: ok
		msg  string                  // of "nothing"
	}{
		{"cleartext, no access file", Config{}, nil, ""},
		{"TLS, no access file", Config{Security: SecurityStatus{TLS: true}},
			map[string]connect.Code{"nothing": un, "token": un, "bad token": un, "not bearer": un}, "no client certificate"},
		{"access file", Config{Auth: rules, Security: SecurityStatus{TLS: true}},
			map[string]connect.Code{"nothing": un, "bad token": un, "not bearer": un}, "no credentials"},
	} {
		for name, c := range callers {
			t.Run(mode.name+"/"+name, func(t *testing.T) {
				var log bytes.Buffer
				cfg := mode.cfg
				cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
				sv := New(cfg)
				err := sv.AdmitClient(nornv1connect.TaskServiceEnqueueProcedure, c.cert, c.authz)
				want := mode.want[name]
				if got := connect.CodeOf(err); err != nil && got != want || err == nil && want != ok {
					t.Fatalf("AdmitClient: %v, want %v", err, want)
				}
				if audited := strings.Contains(log.String(), "call refused"); audited != (want != ok) {
					t.Fatalf("audit log %q for %v", log.String(), err)
				}
				if want == ok {
					return
				}
				if name == "nothing" && !strings.Contains(err.Error(), mode.msg) {
					t.Fatalf("AdmitClient: %v, want it to say %q", err, mode.msg)
				}
				// The interceptor's answer, once the body was read.
				if _, ierr := sv.authorize(t.Context(), nornv1connect.TaskServiceEnqueueProcedure, c.cert, c.authz, nil); ierr == nil || ierr.Error() != err.Error() {
					t.Fatalf("AdmitClient: %v; the interceptor: %v", err, ierr)
				}
			})
		}
	}
}
