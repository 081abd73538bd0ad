package node

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestConsoleOps: the dead tasks page lists a queue's DEAD tasks with
// their last error; retrying one checked and then every DEAD task of the
// queue (BulkAction) revives them; the schedules page lists a schedule,
// pauses it and triggers a tick; the cluster page shows the rebalance
// plan, a dry run.
func TestConsoleOps(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	kill := func() uint64 {
		id := h.enqueue(&nornv1.TaskSpec{Queue: "jobs", Retry: &nornv1.RetryPolicy{MaxAttempts: 1}})
		c := h.claim("jobs", 1, time.Minute)
		h.fail(c[0].Task.Id, c[0].ClaimId, "boom<b>")
		return id
	}
	one, two, three := kill(), kill(), kill()
	b := newBrowser(t, h)
	b.origin = b.base
	page := b.page("/ui/dead?queue=jobs", strconv.FormatUint(one, 10), strconv.FormatUint(three, 10), "boom&lt;b&gt;", "Retry selected", "Retry every dead task of jobs")
	code, loc, _, _ := b.do("POST", "/ui/dead", url.Values{"csrf": {b.csrf(page)}, "queue": {"jobs"}, "action": {"retry"}, "id": {strconv.FormatUint(one, 10)}})
	if code != http.StatusSeeOther || !strings.Contains(loc, "done=retry") {
		t.Fatalf("retry of one: %d to %q", code, loc)
	}
	if got := h.get(one); got.Status != nornv1.TaskStatus_TASK_STATUS_READY || got.Life != 1 {
		t.Fatalf("the task retried from the console: %v", got)
	}
	if got := h.get(two); got.Status != nornv1.TaskStatus_TASK_STATUS_DEAD {
		t.Fatalf("a task not checked: %v", got)
	}
	code, loc, _, _ = b.do("POST", "/ui/dead", url.Values{"csrf": {b.csrf(page)}, "queue": {"jobs"}, "action": {"retry"}, "all": {"1"}})
	if code != http.StatusSeeOther || !strings.Contains(loc, "2+of+2") {
		t.Fatalf("retry of every dead task: %d to %q", code, loc)
	}
	for _, id := range []uint64{two, three} {
		if got := h.get(id); got.Status != nornv1.TaskStatus_TASK_STATUS_READY {
			t.Fatalf("task %d after the bulk retry: %v", id, got)
		}
	}
	b.page("/ui/dead?queue=jobs", "no dead task")

	h.createSchedule(&nornv1.Schedule{Name: "nightly", Interval: durationpb.New(time.Hour), Template: &nornv1.TaskSpec{Queue: "reports"}})
	page = b.page("/ui/schedules", "nightly", "reports", "Pause", "Trigger now")
	if code, loc, _, _ := b.do("POST", "/ui/schedules/nightly/trigger", url.Values{"csrf": {b.csrf(page)}}); code != http.StatusSeeOther || !strings.Contains(loc, "triggered+nightly") {
		t.Fatalf("trigger: %d to %q", code, loc)
	}
	if code, _, _, _ := b.do("POST", "/ui/schedules/nightly/pause", url.Values{"csrf": {b.csrf(page)}, "paused": {"true"}}); code != http.StatusSeeOther {
		t.Fatalf("pause: %d", code)
	}
	if !h.getSchedule("nightly").Paused {
		t.Fatal("the schedule is not paused after the console's pause")
	}
	b.page("/ui/schedules", "paused", "Resume")
	b.page("/ui/cluster", "Rebalance plan", "No move under way")
}
