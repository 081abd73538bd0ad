package node

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestConsoleSearch: a task's page links to the tasks that depend on it
// (of its queue, and of every queue), and those links list exactly them;
// the tasks page searches by payload text, worker and error; a bad
// dependency id is named; an unknown task action is refused.
func TestConsoleSearch(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	enqueue := func(queue, payload string, deps ...uint64) uint64 {
		t.Helper()
		r, err := h.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: queue,
			Payload: []byte(payload), DependsOn: deps}}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.Id
	}
	s := strconv.FormatUint
	x := enqueue("jobs", `{"user":"ada"}`)
	d1, d2 := enqueue("jobs", "one", x), enqueue("jobs", "two", x)
	other := enqueue("other", "three", x)
	plain := enqueue("jobs", `{"user":"bob"}`)
	b := newBrowser(t, h)
	page := b.page("/ui/tasks/"+s(x, 10), "depended on by",
		`href="/ui/tasks?queue=jobs&amp;dependsOn=`+s(x, 10)+`"`, `href="/ui/tasks?dependsOn=`+s(x, 10)+`"`)
	listed := func(path string, want ...uint64) {
		t.Helper()
		page := b.page(path)
		for _, id := range []uint64{x, d1, d2, other, plain} {
			has := strings.Contains(page, `href="/ui/tasks/`+s(id, 10)+`"`)
			if has != slices.Contains(want, id) {
				t.Fatalf("GET %s: task %d listed %v, want %v\n%s", path, id, has, !has, page)
			}
		}
	}
	listed("/ui/tasks?queue=jobs&dependsOn="+s(x, 10), d1, d2)
	listed("/ui/tasks?dependsOn="+s(x, 10), d1, d2, other)
	listed("/ui/tasks?dependsOn="+s(x, 10)+"&newest=1&size=10", d1, d2, other)
	listed("/ui/tasks?text=%22ada%22", x)
	listed("/ui/tasks?queue=jobs&text=user", x, plain)
	// A worker's claims and an error text.
	cl, err := h.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "other", Worker: "w-7"}))
	if err != nil || len(cl.Msg.Tasks) != 0 {
		t.Fatalf("claim of other (its task waits for %d): %v, %v", x, cl, err)
	}
	cl, err = h.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "jobs", Worker: "w-7", Max: 1}))
	if err != nil || len(cl.Msg.Tasks) != 1 {
		t.Fatalf("claim of jobs: %v, %v", cl, err)
	}
	claimed := cl.Msg.Tasks[0]
	if _, err := h.api.Abort(ctx, connect.NewRequest(&nornv1.AbortRequest{Id: claimed.Task.Id, ClaimId: claimed.ClaimId,
		Errors: []*nornv1.TaskError{{Code: "bad_input", Description: "no such <user>"}}})); err != nil {
		t.Fatal(err)
	}
	// Workers: those holding claims now, with what they hold.
	b.page("/ui/workers?queue=jobs", "no worker holds a claim")
	enqueue("jobs", "four")
	var held []uint64
	for range 2 {
		if cl, err = h.api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{Queue: "jobs", Worker: "w-9", Max: 1})); err != nil || len(cl.Msg.Tasks) != 1 {
			t.Fatalf("claim of jobs by w-9: %v, %v", cl, err)
		}
		held = append(held, cl.Msg.Tasks[0].Task.Id)
	}
	for _, path := range []string{"/ui/workers?queue=jobs", "/ui/workers"} {
		page := b.page(path, "from the 2 CLAIMED tasks", `href="/ui/tasks?`)
		if !regexp.MustCompile(`<td>w-9</td><td class="n">2</td>`).MatchString(page) || strings.Contains(page, "w-7") {
			t.Fatalf("GET %s: want w-9 holding 2 and no w-7\n%s", path, page)
		}
	}
	listed("/ui/tasks?queue=jobs&status=CLAIMED&worker=w-9", held...)
	listed("/ui/tasks?worker=w-7", claimed.Task.Id)
	listed("/ui/tasks?worker=w-8")
	listed("/ui/tasks?errorText=%3Cuser%3E&status=ABORTED", claimed.Task.Id)
	b.page("/ui/tasks?errorText=%3Cuser%3E", "no such &lt;user&gt;")
	b.page("/ui/tasks?dependsOn=abc", "depends on: &#34;abc&#34; is not a task id")
	code, loc, _, _ := b.do("POST", "/ui/tasks/"+s(x, 10)+"/explode", url.Values{"csrf": {b.csrf(page)}})
	if code != http.StatusSeeOther || !strings.Contains(loc, "not+an+action") {
		t.Fatalf("an unknown action: %d to %q", code, loc)
	}
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestConsoleAudit: the console's actions are in the node's audit log as
// any client's calls are, under the caller's name: root's pause from the
// queues page as an admin action, alice's refused cancel and pause as
// refused calls.
func TestConsoleAudit(t *testing.T) {
	var log syncBuffer
	h, tok, admTok := aliceAndRootWith(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
	ctx := context.Background()
	req := connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "theirs"}})
	req.Header().Set("Authorization", "Bearer "+admTok)
	r, err := h.api.Enqueue(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, h)
	b.origin = b.base
	b.session = admTok
	page := b.page("/ui/queues", "theirs", "Pause")
	if code, loc, _, _ := b.do("POST", "/ui/queues/theirs/pause", url.Values{"csrf": {b.csrf(page)}, "paused": {"true"}}); code != http.StatusSeeOther || strings.Contains(loc, "error") {
		t.Fatalf("root's pause: %d to %q", code, loc)
	}
	b.session = tok
	page = b.page("/ui/queues", "mine")
	b.do("POST", "/ui/tasks/"+strconv.FormatUint(r.Msg.Id, 10)+"/cancel", url.Values{"csrf": {b.csrf(page)}})
	b.do("POST", "/ui/queues/theirs/pause", url.Values{"csrf": {b.csrf(page)}, "paused": {"false"}})
	got := log.String()
	for _, want := range [][]string{
		{"logger=audit", `msg="admin action"`, "procedure=/norn.v1.QueueService/SetQueue", `user \"root\"`},
		{"logger=audit", `msg="call refused"`, "procedure=/norn.v1.TaskService/Cancel", `user \"alice\"`, "code=permission_denied"},
		{"logger=audit", `msg="call refused"`, "procedure=/norn.v1.QueueService/SetQueue", `user \"alice\"`, "code=permission_denied"},
	} {
		found := false
		for line := range strings.Lines(got) {
			if all(line, want) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("no audit line with %q in the log:\n%s", want, got)
		}
	}
}

// all reports whether s contains each of subs.
func all(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
