package main

import (
	"path/filepath"
	"strings"
	"testing"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// nornctl whoami names the caller and its grants: a token's user on a
// node with an access file (made with nornctl token and grant), and says
// that a node without one checks no caller.
func TestWhoAmI(t *testing.T) {
	mustContain(t, "whoami without access control", ok(t, startNornd(t), "whoami"), "checks no caller")

	auth := filepath.Join(t.TempDir(), "auth.json")
	ok(t, "", "grant", "alice", "worker", "--queues", "emails,billing.*", "--auth-file", auth)
	tok := ok(t, "", "token", "create", "alice", "--auth-file", auth)
	addr := freeAddrs(t, 1)[0]
	startNorndArgs(t, "-data-dir", t.TempDir(), "-listen", addr, "-auth-file", auth)
	tok = strings.TrimSpace(tok)
	mustContain(t, "whoami", ok(t, addr, "whoami", "--token", tok), "user alice (token)", "worker", "emails,billing.*")
	var me nornv1.WhoAmIResponse
	okJSON(t, addr, &me, "whoami", "--token", tok)
	if me.User != "alice" || !me.AccessControl || len(me.Grants) != 1 || me.Grants[0].Role != "worker" {
		t.Fatalf("whoami -o json: %v", &me)
	}
	if r := nornctl(t, addr, "", "whoami", "--token", "norn_x_y"); r.code == 0 {
		t.Fatalf("whoami with an unknown token: exit 0\n%s", r.stdout)
	}
}
