package node

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// chromiumPath is Debian's chromium (installed by .ci/run), or "" when
// this machine has none: the browser tests then skip, and `make test`
// says so loudly.
func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// newChromium starts a headless Chromium for the test (stopped when it
// ends) and returns its context; a dialog (an alert: a script ran) fails
// the test.
func newChromium(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		t.Skip("NO BROWSER TESTS: chromium is not installed (apt-get install chromium); the console was tested over HTTP only")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1366, 900), chromedp.DisableGPU)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			t.Errorf("a dialog opened in the page: %q (a script ran)", d.Message)
		}
	}))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // start the browser
		t.Fatalf("starting chromium %s: %v", path, err)
	}
	return ctx
}

// run runs steps in the browser within 30 s.
func run(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(c, steps...); err != nil {
		t.Fatalf("in the browser: %v", err)
	}
}

// get runs a with a value in the browser within 30 s.
func get[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, a)
	if err != nil {
		t.Fatalf("in the browser: %v", err)
	}
	return v
}

// shot saves a screenshot of the whole page as name.png in the test's
// artifact directory (go test -artifacts keeps it).
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png := get(t, ctx, chromedp.FullScreenshot(100))
	p := filepath.Join(t.ArtifactDir(), name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", p)
}

// click clicks the element sel, again if the live update replaced it
// between the lookup and the click.
func click(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	var err error
	for range 5 {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = chromedp.Do(c, chromedp.Click(chromedp.CSS(sel)))
		cancel()
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("click on %s: %v", sel, err)
}

// mainText is the text of the page's main part.
func mainText(t *testing.T, ctx context.Context) string {
	t.Helper()
	return get(t, ctx, chromedp.Text(chromedp.CSS("#main")))
}

// waitText waits until the main part holds one of wants (the live
// update, or the page a click or a form loads: a read during the load
// fails and is tried again), and returns the text.
func waitText(t *testing.T, ctx context.Context, wants ...string) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var s string
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := chromedp.Run(c, chromedp.Text(chromedp.CSS("#main")))
		cancel()
		if err == nil {
			s = got
			for _, w := range wants {
				if strings.Contains(s, w) {
					return s
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never showed %q; it shows:\n%s", wants, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestConsoleInBrowser opens each page of the console in headless
// Chromium against a real node: the content a user looks for, a payload
// holding <script> shown as text (no script runs), cancel clicked and
// the status changing, a queue paused and claims stopping, 10,000 tasks
// paged through, dark mode; a screenshot of each.
func TestConsoleInBrowser(t *testing.T) {
	ctx := newChromium(t)
	h := newHarness(t, t.TempDir(), nil)
	bg := context.Background()
	// 10,000 tasks in queue bulk, and one with a script in its payload.
	for range 10 {
		specs := make([]*nornv1.TaskSpec, 1000)
		for i := range specs {
			specs[i] = &nornv1.TaskSpec{Queue: "bulk", Payload: []byte(`{"n":1}`)}
		}
		if _, err := h.api.EnqueueBatch(bg, connect.NewRequest(&nornv1.EnqueueBatchRequest{Tasks: specs})); err != nil {
			t.Fatal(err)
		}
	}
	id := h.enqueue(&nornv1.TaskSpec{Queue: "emails", Payload: []byte(`<script>alert("owned")</script><img src=x onerror=alert(1)>`)})
	ids := strconv.FormatUint(id, 10)
	base := h.srv.URL + "/ui/"

	run(t, ctx, chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("h1")))
	waitText(t, ctx, "Nodes")
	shot(t, ctx, "overview")

	run(t, ctx, chromedp.Navigate(base+"queues"), chromedp.WaitVisible(chromedp.CSS("table")))
	waitText(t, ctx, "bulk")
	waitText(t, ctx, "emails")
	shot(t, ctx, "queues")

	run(t, ctx, chromedp.Navigate(base+"tasks/"+ids), chromedp.WaitVisible(chromedp.CSS("pre.payload")))
	payload := get(t, ctx, chromedp.Text(chromedp.CSS("pre.payload")))
	if !strings.Contains(payload, `<script>alert("owned")</script>`) {
		t.Fatalf("the payload is not shown as text: %q", payload)
	}
	shot(t, ctx, "task")
	// The tasks that depend on it: the link on its page, and a search by
	// payload text.
	child := h.enqueue(&nornv1.TaskSpec{Queue: "emails", Payload: []byte(`{"after":"the script"}`), DependsOn: []uint64{id}})
	click(t, ctx, "a.dependents")
	waitText(t, ctx, strconv.FormatUint(child, 10))
	if rows := get(t, ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("tr.task td:first-child")).map(td => td.textContent)`)); len(rows) != 1 {
		t.Fatalf("the tasks depending on %d: %v, want %d alone", id, rows, child)
	}
	shot(t, ctx, "dependents")
	run(t, ctx, chromedp.Navigate(base+"tasks?queue=emails&text="+url.QueryEscape("owned")), chromedp.WaitVisible(chromedp.CSS("table")))
	waitText(t, ctx, ids)
	shot(t, ctx, "search")
	// Workers holding claims.
	if c := h.claim("bulk", 3, time.Minute); len(c) != 3 {
		t.Fatalf("claimed %d of bulk, want 3", len(c))
	}
	run(t, ctx, chromedp.Navigate(base+"workers?queue=bulk"), chromedp.WaitVisible(chromedp.CSS("table")))
	if n := get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("tr.worker").length`)); n != 1 || !strings.Contains(mainText(t, ctx), "from the 3 CLAIMED tasks") {
		t.Fatalf("workers of bulk: %d rows\n%s", n, mainText(t, ctx))
	}
	shot(t, ctx, "workers")
	run(t, ctx, chromedp.Navigate(base+"tasks/"+ids), chromedp.WaitVisible(chromedp.CSS("pre.payload")))
	click(t, ctx, "button.danger")
	waitText(t, ctx, "CANCELLED")
	waitText(t, ctx, "Retry")
	if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_CANCELLED {
		t.Fatalf("after the click on Cancel: %v", got)
	}

	// Pause bulk: claims stop.
	run(t, ctx, chromedp.Navigate(base+"queues"), chromedp.WaitVisible(chromedp.CSS("table")))
	click(t, ctx, `form[action="/ui/queues/bulk/pause"] button`)
	waitText(t, ctx, "paused")
	if c := h.claim("bulk", 1, time.Minute); len(c) != 0 {
		t.Fatalf("a claim of the paused queue got %v", c)
	}
	shot(t, ctx, "queues-paused")

	// Page through the 10,000 tasks, 500 a page.
	run(t, ctx, chromedp.Navigate(base+"tasks?queue=bulk"), chromedp.WaitVisible(chromedp.CSS("table")))
	shot(t, ctx, "tasks")
	run(t, ctx, chromedp.Navigate(base+"tasks?queue=bulk&size=500"), chromedp.WaitVisible(chromedp.CSS("table")))
	seen := map[string]bool{}
	for pages := 1; ; pages++ {
		rows := get(t, ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("tr.task td:first-child")).map(td => td.textContent)`))
		for _, r := range rows {
			seen[r] = true
		}
		// The next page link, followed (Navigate waits for the page's load;
		// a click would not).
		next := get(t, ctx, chromedp.Evaluate[string](`(document.querySelector("a.next") || {}).href || ""`))
		if next == "" {
			break
		}
		if pages > 40 {
			t.Fatalf("more than 40 pages of 500 for 10,000 tasks (%d seen)", len(seen))
		}
		run(t, ctx, chromedp.Navigate(next), chromedp.WaitVisible(chromedp.CSS("table")))
	}
	if len(seen) != 10000 {
		t.Fatalf("paged through %d distinct tasks, want 10000", len(seen))
	}

	run(t, ctx, chromedp.Navigate(base+"dead"), chromedp.WaitVisible(chromedp.CSS("h1")))
	shot(t, ctx, "dead")
	run(t, ctx, chromedp.Navigate(base+"schedules"), chromedp.WaitVisible(chromedp.CSS("h1")))
	shot(t, ctx, "schedules")
	// A schedule created through the form.
	run(t, ctx, chromedp.Navigate(base+"schedules/new"), chromedp.WaitVisible(chromedp.CSS("form.edit")),
		chromedp.SendKeys(chromedp.CSS(`input[name="name"]`), "nightly"),
		chromedp.SendKeys(chromedp.CSS(`input[name="template.queue"]`), "reports"),
		chromedp.SendKeys(chromedp.CSS(`textarea[name="template.payload"]`), "{\"kind\": \"nightly\"}\n"),
		chromedp.SendKeys(chromedp.CSS(`input[name="cron"]`), "0 3 * * *"),
		chromedp.SendKeys(chromedp.CSS(`input[name="timeZone"]`), "Europe/Paris"))
	shot(t, ctx, "schedule-form")
	click(t, ctx, "form.edit button")
	waitText(t, ctx, "created schedule nightly")
	if s := h.getSchedule("nightly"); s.GetCron() != "0 3 * * *" || s.GetTimeZone() != "Europe/Paris" || string(s.GetTemplate().GetPayload()) != "{\"kind\": \"nightly\"}\n" {
		t.Fatalf("the schedule created in the browser: %v", s)
	}
	run(t, ctx, chromedp.Navigate(base+"cluster"), chromedp.WaitVisible(chromedp.CSS("h1")))
	waitText(t, ctx, "Rebalance plan")
	shot(t, ctx, "cluster")

	// Dark mode.
	if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, chromedp.Navigate(base+"tasks/"+ids), chromedp.WaitVisible(chromedp.CSS("pre.payload")))
	bg2 := get(t, ctx, chromedp.Evaluate[string](`getComputedStyle(document.body).backgroundColor`))
	if bg2 == "rgb(255, 255, 255)" {
		t.Fatalf("dark mode: the body's background is %s", bg2)
	}
	shot(t, ctx, "task-dark")
}

// TestConsoleLoginInBrowser: on a node with an access file, the browser
// is sent to the login page, logs in with a token, gets a Secure,
// HttpOnly, SameSite=Strict cookie no script can read; a POST without
// the CSRF token is refused; alice (no admin grant) sees no pause
// button; repeated wrong tokens are rate limited.
func TestConsoleLoginInBrowser(t *testing.T) {
	ctx := newChromium(t)
	h, tok, _ := aliceAndRoot(t)
	base := h.srv.URL + "/ui/"
	run(t, ctx, chromedp.Navigate(base+"queues"), chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)))
	shot(t, ctx, "login")
	run(t, ctx, chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), tok), chromedp.Submit(chromedp.CSS(`input[name="token"]`)))
	waitText(t, ctx, "Queues")
	got, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{})
	if err != nil {
		t.Fatal(err)
	}
	var session *network.Cookie
	for _, c := range got.Cookies {
		if c.Name == "norn_session" {
			session = c
		}
	}
	if session == nil || !session.Secure || !session.HTTPOnly || session.SameSite != network.CookieSameSiteStrict {
		t.Fatalf("the session cookie: %+v", session)
	}
	seen := get(t, ctx, chromedp.Evaluate[string](`document.cookie`))
	if strings.Contains(seen, "norn_session") {
		t.Fatalf("a script reads the session cookie: %q", seen)
	}
	if strings.Contains(mainText(t, ctx), "Pause") {
		t.Fatal("alice, without an admin grant, sees a pause button")
	}
	shot(t, ctx, "queues-alice")
	status := get(t, ctx, chromedp.Evaluate[int](`fetch("/ui/queues/mine/pause", {method: "POST", body: new URLSearchParams({paused: "true"})}).then(r => r.status)`,
		chromedp.EvalAwaitPromise))
	if status != 403 {
		t.Fatalf("a POST without the CSRF token: %d, want 403", status)
	}

	// Log out, then wrong tokens until the rate limit.
	click(t, ctx, `form[action="/ui/logout"] button`)
	waitText(t, ctx, "Paste a bearer token")
	limited := false
	for i := range 10 {
		run(t, ctx, chromedp.Navigate(base+"login"), chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
			chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), fmt.Sprintf("norn_wrong_%d", i)),
			chromedp.Submit(chromedp.CSS(`input[name="token"]`)))
		if strings.Contains(waitText(t, ctx, "not valid", "too many login attempts"), "too many login attempts") {
			limited = true
			break
		}
	}
	if !limited {
		t.Fatal("10 wrong tokens in a row: never rate limited")
	}
	shot(t, ctx, "login-limited")
}
