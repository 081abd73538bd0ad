package node

import (
	"context"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// sparkHarness is a node whose console charts a point every 50 ms.
func sparkHarness(t *testing.T) *harness {
	t.Helper()
	consoleSampleEvery = 50 * time.Millisecond
	t.Cleanup(func() { consoleSampleEvery = 0 })
	return newHarness(t, t.TempDir(), nil)
}

// enqueueRow matches Enqueue's row: its name, a calls sparkline, then
// its calls per second.
var enqueueRow = regexp.MustCompile(`<tr><td>TaskService/Enqueue</td><td><svg class="spark"[^>]*>.*?<polyline class="calls" points="[0-9., ]+"`)

// TestConsoleSparks: API calls to a real node show on the console's
// overview as a row of sparklines for the method called (calls per
// second and latency, from the node's metrics), without PeerService and
// without any style attribute (the CSP forbids inline styles); the
// node's Close stops the console's sampling.
func TestConsoleSparks(t *testing.T) {
	before := samplers()
	h := sparkHarness(t)
	ctx := context.Background()
	for range 20 {
		h.enqueue(&nornv1.TaskSpec{Queue: "charts"})
	}
	if _, err := nornv1connect.NewQueueServiceClient(h.hc, h.srv.URL).ListQueues(ctx, connect.NewRequest(&nornv1.ListQueuesRequest{})); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, h)
	deadline := time.Now().Add(10 * time.Second)
	var page string
	for {
		page = b.page("/ui/", "API calls on this node")
		if enqueueRow.MatchString(page) && strings.Contains(page, "<td>QueueService/ListQueues</td>") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sparklines of Enqueue and ListQueues on the overview in 10 s\n%s", page)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, bad := range []string{"PeerService", "style="} {
		if strings.Contains(page, bad) {
			t.Fatalf("%q in the overview\n%s", bad, page)
		}
	}
	if samplers() <= before {
		t.Fatal("no console sampler running")
	}
	h.close()
	// Close returns once the sampling loop has returned; its goroutine
	// may take a moment more to exit.
	deadline = time.Now().Add(5 * time.Second)
	for n := samplers(); n > before; n = samplers() {
		if time.Now().After(deadline) {
			t.Fatalf("%d console samplers run after the node's Close, %d before it started", n, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// samplers counts the goroutines sampling a console's metrics (a node
// another test left open may have one).
func samplers() int {
	buf := make([]byte, 4<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "console.(*sampler).start.func1(")
}

// TestConsoleSparksInBrowser: the sparklines render in Chromium, their
// colours from the stylesheet, in light and dark mode.
func TestConsoleSparksInBrowser(t *testing.T) {
	ctx := newChromium(t)
	h := sparkHarness(t)
	for range 20 {
		h.enqueue(&nornv1.TaskSpec{Queue: "charts"})
	}
	run(t, ctx, chromedp.Navigate(h.srv.URL+"/ui/"), chromedp.WaitVisible(chromedp.CSS("h1")))
	waitText(t, ctx, "TaskService/Enqueue")
	const probe = `(() => { const p = document.querySelector("tr td svg.spark polyline.calls");
		const r = p.closest("svg").getBoundingClientRect();
		return [getComputedStyle(p).stroke, String(r.width), String(r.height)]; })()`
	got := get(t, ctx, chromedp.Evaluate[[]string](probe))
	if got[0] != "rgb(36, 87, 197)" || got[1] != "120" || got[2] != "24" {
		t.Fatalf("the calls sparkline: stroke, width, height %v, want the accent colour at 120×24", got)
	}
	shot(t, ctx, "overview-sparks")
	if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, ctx, chromedp.Evaluate[[]string](probe)); got[0] != "rgb(122, 162, 247)" {
		t.Fatalf("dark mode: the calls sparkline's stroke is %s, want the dark accent", got[0])
	}
	shot(t, ctx, "overview-sparks-dark")
}
