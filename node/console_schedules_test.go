package node

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// scheduleValues is the schedule form as a browser posts it.
func scheduleValues(csrf string, kv ...string) url.Values {
	v := url.Values{"csrf": {csrf}, "overlap": {"allow"}}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

// TestConsoleSchedules: an admin creates a schedule through the console's
// form (CreateSchedule: the payload stored as typed, line breaks as \n)
// and sees it listed; the edit form is filled from GetSchedule; a new
// interval saved through it shows in GetSchedule, the paused state and a
// template field the form does not show staying; an invalid cron shows
// the form again with the API's error, its field marked and the values
// as typed, and changes nothing; delete needs its "yes, delete" box; a
// POST without the CSRF token is refused (403) and creates nothing.
func TestConsoleSchedules(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	b := newBrowser(t, h)
	b.origin = b.base
	b.page("/ui/schedules", `href="/ui/schedules/new"`, "no schedule yet")
	csrf := b.csrf(b.page("/ui/schedules/new", "New schedule", `name="name"`, `name="template.queue"`, `name="template.payload"`, `name="interval"`, `name="cron"`, `name="timeZone"`))

	code, loc, body, _ := b.do("POST", "/ui/schedules", scheduleValues(csrf, "name", "beat", "template.queue", "pings",
		"template.payload", "{\"kind\":\"beat\",\r\n \"n\": 1}", "interval", "1h30m", "template.priority", "-3", "overlap", "skip", "catchUpWindow", "5m"))
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/schedules?done=created+schedule+beat") {
		t.Fatalf("create: %d to %q\n%s", code, loc, body)
	}
	s := h.getSchedule("beat")
	if s.GetInterval().AsDuration() != 90*time.Minute || s.GetTemplate().GetQueue() != "pings" || string(s.GetTemplate().GetPayload()) != "{\"kind\":\"beat\",\n \"n\": 1}" ||
		s.GetTemplate().GetPriority() != -3 || s.GetOverlap() != nornv1.Schedule_OVERLAP_SKIP || s.GetCatchUpWindow().AsDuration() != 5*time.Minute || s.GetPaused() {
		t.Fatalf("the schedule created through the form: %v", s)
	}
	b.page("/ui/schedules", "beat", "pings", "1h30m0s", `href="/ui/schedules/beat/edit"`, "Trigger now", "yes, delete")

	// Edit: the form holds the stored values. Pause the schedule and give
	// its template a retry policy through the API: both stay.
	edit := b.page("/ui/schedules/beat/edit", "Schedule beat", `value="pings"`, `value="1h30m"`, `value="-3"`, `value="5m"`,
		`<option value="skip" selected>`, "{&#34;kind&#34;:&#34;beat&#34;,\n &#34;n&#34;: 1}</textarea>", `action="/ui/schedules/beat"`)
	if strings.Contains(edit, `name="name"`) {
		t.Fatalf("the edit form lets the name change\n%s", edit)
	}
	if _, err := h.admin.PauseSchedule(ctx, connect.NewRequest(&nornv1.PauseScheduleRequest{Name: "beat", Paused: true})); err != nil {
		t.Fatal(err)
	}
	s.Paused = true
	s.Template.Retry = &nornv1.RetryPolicy{MaxAttempts: 4}
	if _, err := h.admin.UpdateSchedule(ctx, connect.NewRequest(&nornv1.UpdateScheduleRequest{Schedule: s})); err != nil {
		t.Fatal(err)
	}
	form := scheduleValues(b.csrf(edit), "template.queue", "pings", "template.payload", "{\"kind\":\"beat\",\n \"n\": 1}",
		"interval", "45m", "template.priority", "-3", "overlap", "skip", "catchUpWindow", "5m")
	code, loc, body, _ = b.do("POST", "/ui/schedules/beat", form)
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/schedules?done=updated+schedule+beat") {
		t.Fatalf("update: %d to %q\n%s", code, loc, body)
	}
	s = h.getSchedule("beat")
	if s.GetInterval().AsDuration() != 45*time.Minute || !s.GetPaused() || s.GetTemplate().GetRetry().GetMaxAttempts() != 4 ||
		s.GetTemplate().GetPriority() != -3 || s.GetTemplate().GetQueue() != "pings" {
		t.Fatalf("the schedule after the form's update: %v", s)
	}

	// An invalid cron (with the interval cleared): the form again, the
	// values kept, the field marked; the schedule unchanged.
	form.Set("interval", "")
	form.Set("cron", "61 * * * *")
	form.Set("timeZone", "Europe/Paris")
	code, _, body, _ = b.do("POST", "/ui/schedules/beat", form)
	if code != http.StatusUnprocessableEntity {
		t.Fatalf("update with an invalid cron: %d, want 422\n%s", code, body)
	}
	for _, want := range []string{"invalid_argument: schedule.cron:", `id="f-cron" name="cron" value="61 * * * *" placeholder="0 3 * * *" aria-invalid="true"`,
		`value="Europe/Paris"`, `value="pings"`, `value="-3"`, `name="csrf"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("the form after an invalid cron lacks %q\n%s", want, body)
		}
	}
	if s := h.getSchedule("beat"); s.GetCron() != "" || s.GetInterval().AsDuration() != 45*time.Minute {
		t.Fatalf("the schedule after a refused update: %v", s)
	}
	// The same on create: the name kept too; a duration the form cannot
	// read is refused the same way.
	code, _, body, _ = b.do("POST", "/ui/schedules", scheduleValues(csrf, "name", "nightly", "template.queue", "reports", "cron", "0 3 * * * *"))
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "schedule.cron") || !strings.Contains(body, `value="nightly"`) || !strings.Contains(body, `value="reports"`) {
		t.Fatalf("create with an invalid cron: %d\n%s", code, body)
	}
	code, _, body, _ = b.do("POST", "/ui/schedules", scheduleValues(csrf, "name", "nightly", "template.queue", "reports", "interval", "soon"))
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "schedule.interval: &#34;soon&#34; is not a duration") {
		t.Fatalf("create with an unreadable interval: %d\n%s", code, body)
	}
	code, _, body, _ = b.do("POST", "/ui/schedules", scheduleValues(csrf, "name", "beat", "template.queue", "pings", "interval", "1m"))
	if code != http.StatusConflict || !strings.Contains(body, "already_exists") {
		t.Fatalf("create of a name taken: %d\n%s", code, body)
	}

	// Without the CSRF token: 403, nothing created or deleted.
	noCSRF := scheduleValues("", "name", "forged", "template.queue", "pings", "interval", "1m")
	noCSRF.Del("csrf")
	if code, _, _, _ := b.do("POST", "/ui/schedules", noCSRF); code != http.StatusForbidden {
		t.Fatalf("create without the CSRF token: %d, want 403", code)
	}
	if code, _, _, _ := b.do("POST", "/ui/schedules/beat/delete", url.Values{"confirm": {"yes"}}); code != http.StatusForbidden {
		t.Fatalf("delete without the CSRF token: %d, want 403", code)
	}
	if _, err := h.admin.GetSchedule(ctx, connect.NewRequest(&nornv1.GetScheduleRequest{Name: "forged"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("a schedule created without the CSRF token: %v", err)
	}

	// Delete: not without the box checked.
	code, loc, _, _ = b.do("POST", "/ui/schedules/beat/delete", url.Values{"csrf": {csrf}})
	if code != http.StatusSeeOther || !strings.Contains(loc, "error=") {
		t.Fatalf("delete without yes: %d to %q", code, loc)
	}
	h.getSchedule("beat")
	code, loc, _, _ = b.do("POST", "/ui/schedules/beat/delete", url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	if code != http.StatusSeeOther || !strings.Contains(loc, "done=deleted+schedule+beat") {
		t.Fatalf("delete: %d to %q", code, loc)
	}
	if _, err := h.admin.GetSchedule(ctx, connect.NewRequest(&nornv1.GetScheduleRequest{Name: "beat"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("GetSchedule after the console's delete: %v", err)
	}
	b.page(loc, "deleted schedule beat", "no schedule yet")
	code, _, body, _ = b.do("GET", "/ui/schedules/beat/edit", nil)
	if code != http.StatusOK || !strings.Contains(body, "GetSchedule: not_found") || strings.Contains(body, `name="template.queue"`) {
		t.Fatalf("the edit page of a deleted schedule: %d\n%s", code, body)
	}
}

// TestConsoleSchedulesNotAdmin: alice, without an admin grant, sees no
// New, Edit or Delete control nor the form; her POSTs anyway get the
// API's refusal (PERMISSION_DENIED) and change nothing; root sees them.
func TestConsoleSchedulesNotAdmin(t *testing.T) {
	h, tok, admTok := aliceAndRoot(t)
	ctx := context.Background()
	req := connect.NewRequest(&nornv1.CreateScheduleRequest{Schedule: &nornv1.Schedule{Name: "nightly", Cron: "0 3 * * *",
		Template: &nornv1.TaskSpec{Queue: "mine"}}})
	req.Header().Set("Authorization", "Bearer "+admTok)
	if _, err := h.admin.CreateSchedule(ctx, req); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, h)
	b.origin = b.base
	b.session = tok
	page := b.page("/ui/schedules", "Schedules are for admins")
	for _, no := range []string{"/ui/schedules/new", "/edit", "/delete", "New schedule"} {
		if strings.Contains(page, no) {
			t.Fatalf("alice's schedules page shows %q\n%s", no, page)
		}
	}
	if form := b.page("/ui/schedules/new", "Schedules are for admins"); strings.Contains(form, `name="template.queue"`) {
		t.Fatalf("alice gets the schedule form\n%s", form)
	}
	csrf := b.csrf(page)
	code, _, body, _ := b.do("POST", "/ui/schedules", scheduleValues(csrf, "name", "hers", "template.queue", "mine", "interval", "1m"))
	if code != http.StatusForbidden || !strings.Contains(body, "permission_denied") {
		t.Fatalf("alice's create: %d, want 403 and the API's refusal\n%s", code, body)
	}
	code, _, body, _ = b.do("POST", "/ui/schedules/nightly", scheduleValues(csrf, "template.queue", "mine", "interval", "1m"))
	if code != http.StatusForbidden || !strings.Contains(body, "permission_denied") {
		t.Fatalf("alice's update: %d, want 403 and the API's refusal\n%s", code, body)
	}
	code, loc, _, _ := b.do("POST", "/ui/schedules/nightly/delete", url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	if code != http.StatusSeeOther || !strings.Contains(loc, "permission_denied") {
		t.Fatalf("alice's delete: %d to %q, want the API's refusal", code, loc)
	}
	get := connect.NewRequest(&nornv1.ListSchedulesRequest{})
	get.Header().Set("Authorization", "Bearer "+admTok)
	l, err := h.admin.ListSchedules(ctx, get)
	if err != nil || len(l.Msg.Schedules) != 1 || l.Msg.Schedules[0].GetCron() != "0 3 * * *" {
		t.Fatalf("the schedules after alice's refused posts: %v, %v", l, err)
	}

	b.session = admTok
	b.page("/ui/schedules", "nightly", `href="/ui/schedules/new"`, `href="/ui/schedules/nightly/edit"`, "yes, delete")
	b.page("/ui/schedules/nightly/edit", `value="0 3 * * *"`, `value="mine"`)
}
