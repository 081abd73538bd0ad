package node

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// browser is a console client: no redirects followed, the session cookie
// sent by hand (a Secure cookie, which a jar keeps off http://).
type browser struct {
	t       *testing.T
	base    string
	hc      *http.Client
	session string
	origin  string // the Origin header of its POSTs, "" for none
}

func newBrowser(t *testing.T, h *harness) *browser {
	return &browser{t: t, base: h.srv.URL, hc: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

// do sends a request and returns the status, the Location and the body.
func (b *browser) do(method, path string, form url.Values) (int, string, string, http.Header) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if b.session != "" {
		req.AddCookie(&http.Cookie{Name: "norn_session", Value: b.session})
	}
	if b.origin != "" {
		req.Header.Set("Origin", b.origin)
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(out), resp.Header
}

// page GETs path and wants 200 and each of wants in the page.
func (b *browser) page(path string, wants ...string) string {
	b.t.Helper()
	code, loc, body, _ := b.do("GET", path, nil)
	if code != http.StatusOK {
		b.t.Fatalf("GET %s: %d (to %q)\n%s", path, code, loc, body)
	}
	for _, w := range wants {
		if !strings.Contains(body, w) {
			b.t.Fatalf("GET %s: no %q in the page\n%s", path, w, body)
		}
	}
	return body
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the CSRF token of a page.
func (b *browser) csrf(page string) string {
	b.t.Helper()
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		b.t.Fatalf("no CSRF token in the page\n%s", page)
	}
	return m[1]
}

// TestConsoleOpen: on a node without access control, the console shows
// the overview, the queues with their counts, a queue's tasks and a
// task's page, where a payload holding <script> shows as text; cancel
// and pause act through the API, and only with the page's CSRF token and
// from the console's own origin; every page forbids framing and foreign
// scripts.
func TestConsoleOpen(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	r, err := h.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "emails",
		Payload: []byte(`<script>alert("x")</script>`)}}))
	if err != nil {
		t.Fatal(err)
	}
	id := strconv.FormatUint(r.Msg.Id, 10)
	b := newBrowser(t, h)
	if code, loc, _, _ := b.do("GET", "/ui", nil); code != http.StatusMovedPermanently || loc != "/ui/" {
		t.Fatalf("GET /ui: %d to %q", code, loc)
	}
	b.page("/ui/", "Overview", "Nodes", "ring epoch")
	b.page("/ui/queues", "emails", `href="/ui/tasks?queue=emails&amp;status=READY"`, "Pause")
	b.page("/ui/tasks?queue=emails", `href="/ui/tasks/`+id+`"`, "READY")
	task := b.page("/ui/tasks/"+id, "READY", "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;", "Cancel")
	if strings.Contains(task, `<script>alert`) {
		t.Fatalf("the payload's <script> is in the page as markup\n%s", task)
	}
	_, _, _, hdr := b.do("GET", "/ui/tasks/"+id, nil)
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || hdr.Get("X-Frame-Options") != "DENY" {
		t.Fatalf("headers %v", hdr)
	}
	if code, loc, _, _ := b.do("GET", "/ui/find?id="+id, nil); code != http.StatusSeeOther || loc != "/ui/tasks/"+id {
		t.Fatalf("find: %d to %q", code, loc)
	}

	cancel := "/ui/tasks/" + id + "/cancel"
	if code, _, _, _ := b.do("POST", cancel, url.Values{}); code != http.StatusForbidden {
		t.Fatalf("cancel without the CSRF token: %d, want 403", code)
	}
	if code, _, _, _ := b.do("POST", cancel, url.Values{"csrf": {"forged"}}); code != http.StatusForbidden {
		t.Fatalf("cancel with a forged CSRF token: %d, want 403", code)
	}
	b.origin = "https://evil.example"
	if code, _, _, _ := b.do("POST", cancel, url.Values{"csrf": {b.csrf(task)}}); code != http.StatusForbidden {
		t.Fatalf("cancel from another origin: %d, want 403", code)
	}
	b.origin = b.base
	if code, loc, _, _ := b.do("POST", cancel, url.Values{"csrf": {b.csrf(task)}}); code != http.StatusSeeOther || loc != "/ui/tasks/"+id {
		t.Fatalf("cancel: %d to %q", code, loc)
	}
	g, err := h.api.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: r.Msg.Id}))
	if err != nil || g.Msg.Task.Status != nornv1.TaskStatus_TASK_STATUS_CANCELLED {
		t.Fatalf("after the console's cancel: %v, %v", g, err)
	}
	b.page("/ui/tasks/"+id, "CANCELLED", "Retry")

	queues := b.page("/ui/queues")
	if code, _, _, _ := b.do("POST", "/ui/queues/emails/pause", url.Values{"csrf": {b.csrf(queues)}, "paused": {"true"}}); code != http.StatusSeeOther {
		t.Fatalf("pause: %d", code)
	}
	q, err := nornv1connect.NewQueueServiceClient(h.hc, h.srv.URL).GetQueue(ctx, connect.NewRequest(&nornv1.GetQueueRequest{Queue: "emails"}))
	if err != nil || !q.Msg.Queue.GetSettings().GetPaused() {
		t.Fatalf("after the console's pause: %v, %v", q, err)
	}
	b.page("/ui/queues", "paused", "Resume")
}

// TestConsoleLogin: on a node with an access file, the console sends a
// browser without a session to the login page; a wrong token is refused;
// a right one sets a cookie marked Secure, HttpOnly and SameSite=Strict;
// the pages follow the caller's grants (alice, granted queue mine, sees
// mine alone and no pause button; root sees every queue and may pause);
// an action the caller's grants do not allow is refused by the API and
// changes nothing; logins from one address are rate limited.
func TestConsoleLogin(t *testing.T) {
	h, tok, admTok := aliceAndRoot(t)
	ctx := context.Background()
	enqueue := func(queue string) uint64 {
		req := connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: queue}})
		req.Header().Set("Authorization", "Bearer "+admTok)
		r, err := h.api.Enqueue(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.Id
	}
	enqueue("mine")
	theirs := enqueue("theirs")
	b := newBrowser(t, h)
	if code, loc, _, _ := b.do("GET", "/ui/queues", nil); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/login?next=") {
		t.Fatalf("GET /ui/queues without a session: %d to %q", code, loc)
	}
	b.page("/ui/login", "Log in", `name="token"`)

	login := func(token string) (int, string, http.Header) {
		code, loc, body, hdr := b.do("POST", "/ui/login", url.Values{"token": {token}, "next": {"/ui/queues"}})
		if code != http.StatusSeeOther {
			return code, body, hdr
		}
		return code, loc, hdr
	}
	code, loc, hdr := login(tok)
	if code != http.StatusSeeOther || loc != "/ui/queues" {
		t.Fatalf("alice's login: %d %q", code, loc)
	}
	cookie := hdr.Get("Set-Cookie")
	for _, want := range []string{"norn_session=" + tok, "HttpOnly", "Secure", "SameSite=Strict", "Path=/ui/"} {
		if !strings.Contains(cookie, want) {
			t.Fatalf("the session cookie %q lacks %q", cookie, want)
		}
	}
	b.session = tok
	page := b.page("/ui/queues", "mine", "alice")
	if strings.Contains(page, "theirs") || strings.Contains(page, "Pause") {
		t.Fatalf("alice's queues page shows another queue or a pause button\n%s", page)
	}
	// A task of a queue alice may not touch: the API refuses the cancel.
	task := strconv.FormatUint(theirs, 10)
	b.origin = b.base
	code, loc, _, _ = b.do("POST", "/ui/tasks/"+task+"/cancel", url.Values{"csrf": {b.csrf(page)}})
	if code != http.StatusSeeOther || !strings.Contains(loc, "PermissionDenied") && !strings.Contains(loc, "permission_denied") {
		t.Fatalf("alice's cancel of a task of theirs: %d to %q, want the API's refusal", code, loc)
	}
	req := connect.NewRequest(&nornv1.GetTaskRequest{Id: theirs})
	req.Header().Set("Authorization", "Bearer "+admTok)
	if g, err := h.api.GetTask(ctx, req); err != nil || g.Msg.Task.Status != nornv1.TaskStatus_TASK_STATUS_READY {
		t.Fatalf("the task after alice's refused cancel: %v, %v", g, err)
	}

	b.session = admTok
	b.page("/ui/queues", "mine", "theirs", "Pause", "root")

	// Wrong tokens: refused, then rate limited (alice's and root's
	// logins took 1 of the 5 attempts; root's page was no login).
	b.session = ""
	if code, body, _ := login("norn_nope_nope"); code != http.StatusUnauthorized || !strings.Contains(body, "not valid") {
		t.Fatalf("a wrong token: %d\n%s", code, body)
	}
	limited := false
	for range 6 {
		if code, _, _ := login("norn_nope_nope"); code == http.StatusTooManyRequests {
			limited = true
			break
		}
	}
	if !limited {
		t.Fatal("8 logins from one address in a moment: none rate limited")
	}
}
