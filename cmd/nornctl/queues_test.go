package main

import (
	"fmt"
	"strings"
	"testing"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestQueueCommands: pause a queue and see claims get nothing, resume
// it, set and clear its defaults, list and get with -o json, and a bad
// setting refused naming its field.
func TestQueueCommands(t *testing.T) {
	addr := startNornd(t)
	id := strings.TrimSpace(ok(t, addr, "enqueue", "mail", "x"))
	row(t, "pause", ok(t, addr, "queue", "pause", "mail"), "PAUSED", "yes")
	var claimed nornv1.ClaimResponse
	okJSON(t, addr, &claimed, "claim", "mail")
	if len(claimed.GetTasks()) != 0 {
		t.Fatalf("claimed from a paused queue: %v", claimed.GetTasks())
	}
	var q nornv1.Queue
	okJSON(t, addr, &q, "queue", "get", "mail")
	if !q.GetSettings().GetPaused() || q.GetByStatus()["READY"] != 1 || strings.TrimSpace(id) != fmt.Sprint(q.GetOldestReadyId()) || q.GetOldestReadyAge() == nil {
		t.Fatalf("queue get: %v (task %s)", &q, id)
	}
	row(t, "resume", ok(t, addr, "queue", "resume", "mail"), "PAUSED", "no")
	okJSON(t, addr, &claimed, "claim", "mail")
	if len(claimed.GetTasks()) != 1 || claimed.GetTasks()[0].GetTask().GetId() == 0 {
		t.Fatalf("claim after resume: %v (task %s)", claimed.GetTasks(), id)
	}

	out := ok(t, addr, "queue", "set", "hooks", "--default-lease", "2m", "--max-attempts", "5", "--backoff", "10s", "--backoff-multiplier", "2")
	row(t, "queue set", out, "DEFAULT LEASE", "2m0s")
	row(t, "queue set", out, "DEFAULT RETRY", "5 attempts, 10s x2")
	var list nornv1.ListQueuesResponse
	okJSON(t, addr, &list, "queue", "list")
	var names []string
	for _, q := range list.GetQueues() {
		names = append(names, q.GetName())
	}
	if strings.Join(names, ",") != "hooks,mail" {
		t.Fatalf("queue list: %v", names)
	}
	table := ok(t, addr, "queue", "list")
	row(t, "queue list table", table, "QUEUE", "PAUSED")
	row(t, "queue list table", table, "hooks", "no")
	row(t, "queue list table", table, "mail", "no")
	out = ok(t, addr, "queue", "set", "hooks", "--clear", "default_lease")
	row(t, "clear", out, "DEFAULT LEASE", "the node's")
	row(t, "clear", out, "DEFAULT RETRY", "5 attempts")
	out = ok(t, addr, "queue", "set", "hooks", "--max-claimed", "4", "--claim-rate", "2.5")
	row(t, "limits", out, "MAX CLAIMED", "4")
	row(t, "limits", out, "CLAIM RATE", "2.5/s")
	out = ok(t, addr, "queue", "set", "hooks", "--retention", "48h")
	row(t, "retention", out, "RETENTION", "48h0m0s")
	out = ok(t, addr, "queue", "set", "hooks", "--clear", "retention")
	row(t, "retention cleared", out, "RETENTION", "the node's")
	if r := nornctl(t, addr, "", "queue", "set", "hooks", "--retention", "10m"); r.code != 1 || !strings.Contains(r.stderr, "settings.retention") {
		t.Errorf("a retention below an hour: exit %d, stderr %q", r.code, r.stderr)
	}
	r0 := nornctl(t, addr, "", "queue", "set", "hooks", "--claim-rate", "-1")
	if r0.code != 1 || !strings.Contains(r0.stderr, "settings.claimRate") {
		t.Errorf("a negative rate: exit %d, stderr %q", r0.code, r0.stderr)
	}

	r := nornctl(t, addr, "", "queue", "set", "hooks", "--backoff-multiplier", "0.5")
	if r.code != 1 || !strings.Contains(r.stderr, "settings.defaultRetry.multiplier") {
		t.Errorf("a bad multiplier: exit %d, stderr %q", r.code, r.stderr)
	}
	r = nornctl(t, addr, "", "queue", "set", "hooks", "--clear", "speed")
	if r.code != 1 || !strings.Contains(r.stderr, "clear[0]") {
		t.Errorf("an unknown setting: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := nornctl(t, addr, "", "queue", "frobnicate"); r.code != 2 {
		t.Errorf("an unknown queue command: exit %d", r.code)
	}
}

// row fails t unless out has a line that starts with label and holds
// value after it.
func row(t *testing.T, what, out, label, value string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, label); ok && strings.Contains(rest, value) {
			return
		}
	}
	t.Errorf("%s has no row %q with %q:\n%s", what, label, value, out)
}
