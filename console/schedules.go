package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// Schedules (docs/CONSOLE.md): the list, with pause, resume, trigger and
// delete, and the form that creates and edits one. AdminService's
// schedule calls need admin (docs/SECURITY.md).

// schedulesData is the schedules page's.
type schedulesData struct {
	Schedules []*nornv1.Schedule
	MayAdmin  bool // create, edit, pause, trigger, delete
}

// schedules lists every schedule (AdminService.ListSchedules).
func (c *Console) schedules(ctx context.Context, r *http.Request, api clients, me rights, v *view) string {
	v.Title, v.Nav, v.Live = "Schedules", "schedules", true
	d := &schedulesData{MayAdmin: me.mayAdmin("*")}
	v.Data = d
	if !d.MayAdmin {
		v.Errors = append(v.Errors, "Schedules are for admins (docs/SECURITY.md).")
		return "schedules"
	}
	l, err := api.admin.ListSchedules(ctx, connect.NewRequest(&nornv1.ListSchedulesRequest{}))
	if err != nil {
		v.Errors = append(v.Errors, "ListSchedules: "+errText(err))
		return "schedules"
	}
	d.Schedules = l.Msg.Schedules
	return "schedules"
}

// schedulePause pauses or resumes a schedule (PauseSchedule).
func (c *Console) schedulePause(ctx context.Context, _ http.ResponseWriter, r *http.Request, api clients) (string, error) {
	_, err := api.admin.PauseSchedule(ctx, connect.NewRequest(&nornv1.PauseScheduleRequest{Name: r.PathValue("name"), Paused: r.PostFormValue("paused") == "true"}))
	return Prefix + "schedules", err
}

// scheduleTrigger enqueues a schedule's task now (TriggerSchedule).
func (c *Console) scheduleTrigger(ctx context.Context, _ http.ResponseWriter, r *http.Request, api clients) (string, error) {
	res, err := api.admin.TriggerSchedule(ctx, connect.NewRequest(&nornv1.TriggerScheduleRequest{Name: r.PathValue("name")}))
	if err != nil {
		return Prefix + "schedules", err
	}
	return addQuery(Prefix+"schedules", "done", fmt.Sprintf("triggered %s: task %d", r.PathValue("name"), res.Msg.TaskId)), nil
}

// scheduleDelete deletes a schedule (DeleteSchedule) when the form's
// "yes, delete" box is checked: one click does not delete.
func (c *Console) scheduleDelete(ctx context.Context, _ http.ResponseWriter, r *http.Request, api clients) (string, error) {
	name, back := r.PathValue("name"), Prefix+"schedules"
	if r.PostFormValue("confirm") != "yes" {
		return back, fmt.Errorf("delete %s: check \"yes, delete\" to confirm", name)
	}
	if _, err := api.admin.DeleteSchedule(ctx, connect.NewRequest(&nornv1.DeleteScheduleRequest{Name: name})); err != nil {
		return back, err
	}
	return addQuery(back, "done", "deleted schedule "+name+" (the tasks it enqueued stay)"), nil
}

// scheduleForm is the schedule form: its fields as typed (kept when the
// API refuses them). The inputs are named as the API names the fields in
// its errors, after "schedule.".
type scheduleForm struct {
	New      bool // create; else edit the schedule Name
	Name     string
	Queue    string // template.queue
	Payload  string // template.payload, as text
	Binary   int    // edit: the payload's size when it is not text the form can hold; kept as it is
	Interval string // a Go duration
	Cron     string
	TimeZone string
	Priority string // template.priority
	Jitter   string
	CatchUp  string // catchUpWindow
	Overlap  string // "allow" or "skip"
	Paused   bool   // create it paused (an edit keeps the schedule's state)
	Bad      string // the field the error names: its input is marked
	MayAdmin bool
}

// scheduleNew shows the empty form.
func (c *Console) scheduleNew(_ context.Context, _ *http.Request, _ clients, me rights, v *view) string {
	return showForm(v, me, &scheduleForm{New: true, Overlap: "allow"}, nil)
}

// scheduleEdit shows the form filled from GetSchedule.
func (c *Console) scheduleEdit(ctx context.Context, r *http.Request, api clients, me rights, v *view) string {
	name := r.PathValue("name")
	if !me.mayAdmin("*") {
		return showForm(v, me, &scheduleForm{Name: name}, nil)
	}
	g, err := api.admin.GetSchedule(ctx, connect.NewRequest(&nornv1.GetScheduleRequest{Name: name}))
	if err != nil {
		v.Title, v.Nav = "Schedule "+name, "schedules"
		v.Errors = append(v.Errors, "GetSchedule: "+errText(err))
		return "schedule_form"
	}
	return showForm(v, me, formFrom(g.Msg.Schedule), nil)
}

// showForm fills v with the form f and err (if any): its text shown, the
// field it names marked.
func showForm(v *view, me rights, f *scheduleForm, err error) string {
	v.Nav, v.Title = "schedules", "Schedule "+f.Name
	if f.New {
		v.Title = "New schedule"
	}
	f.MayAdmin = me.mayAdmin("*")
	if !f.MayAdmin {
		v.Errors = append(v.Errors, "Schedules are for admins (docs/SECURITY.md).")
	}
	if err != nil {
		v.Errors = append(v.Errors, errText(err))
		f.Bad = badField(err)
	}
	v.Data = f
	return "schedule_form"
}

// badField is the field of the form an error names ("schedule.cron:
// ..." names cron), or "".
func badField(err error) string {
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	field, _, ok := strings.Cut(msg, ":")
	if !ok || !strings.HasPrefix(field, "schedule.") {
		return ""
	}
	return strings.TrimPrefix(field, "schedule.")
}

// formFrom is the form of the stored schedule s.
func formFrom(s *nornv1.Schedule) *scheduleForm {
	t := s.GetTemplate()
	f := &scheduleForm{Name: s.GetName(), Queue: t.GetQueue(), Cron: s.GetCron(), TimeZone: s.GetTimeZone(),
		Priority: strconv.Itoa(int(t.GetPriority())), Overlap: "allow", Interval: shortDuration(s.GetInterval()),
		Jitter: shortDuration(s.GetJitter()), CatchUp: shortDuration(s.GetCatchUpWindow())}
	if s.GetOverlap() == nornv1.Schedule_OVERLAP_SKIP {
		f.Overlap = "skip"
	}
	if p := t.GetPayload(); textPayload(p) {
		f.Payload = string(p)
	} else {
		f.Binary = len(p)
	}
	return f
}

// textPayload reports whether a payload can go through the form's text
// area unchanged: UTF-8 without control characters but \n and \t (a
// browser sends line breaks as \r\n, which the form reads as \n).
func textPayload(p []byte) bool {
	if !utf8.Valid(p) {
		return false
	}
	for _, r := range string(p) {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return false
		}
	}
	return true
}

// shortDuration is d as the form shows it ("1h30m", not "1h30m0s"), ""
// when unset.
func shortDuration(d *durationpb.Duration) string {
	if d == nil {
		return ""
	}
	s := d.AsDuration().String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// formOf reads the posted form; name is the edited schedule's ("" to
// create).
func formOf(r *http.Request, name string) *scheduleForm {
	v := func(k string) string { return strings.TrimSpace(r.PostFormValue(k)) }
	f := &scheduleForm{New: name == "", Name: name, Queue: v("template.queue"),
		Payload:  strings.ReplaceAll(r.PostFormValue("template.payload"), "\r\n", "\n"),
		Interval: v("interval"), Cron: v("cron"), TimeZone: v("timeZone"), Priority: v("template.priority"),
		Jitter: v("jitter"), CatchUp: v("catchUpWindow"), Overlap: v("overlap"), Paused: r.PostFormValue("paused") == "yes"}
	if f.New {
		f.Name = v("name")
	}
	return f
}

// invalid is an error of the form's own reading, as the API words its
// own: INVALID_ARGUMENT naming the field.
func invalid(field, format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("schedule.%s: %s", field, fmt.Sprintf(format, args...)))
}

// schedule is the definition f gives, for CreateSchedule or, on base
// (the stored schedule), for UpdateSchedule, which replaces it whole:
// base's paused state and the template's fields the form does not show
// (retry policy, max claims, fairness key...) stay, and so does its
// payload when the form has none (f.Binary). The API validates the rest.
func (f *scheduleForm) schedule(base *nornv1.Schedule) (*nornv1.Schedule, error) {
	s := &nornv1.Schedule{Name: f.Name, Cron: f.Cron, TimeZone: f.TimeZone, Paused: f.Paused, Template: &nornv1.TaskSpec{}}
	if base != nil {
		s.Paused = base.GetPaused()
		if base.GetTemplate() != nil {
			s.Template = proto.Clone(base.GetTemplate()).(*nornv1.TaskSpec)
		}
	}
	s.Template.Queue = f.Queue
	if f.Binary == 0 {
		s.Template.Payload = []byte(f.Payload)
	}
	s.Template.Priority = 0
	if f.Priority != "" {
		p, err := strconv.ParseInt(f.Priority, 10, 32)
		if err != nil {
			return nil, invalid("template.priority", "%q is not a whole number from -2147483648 to 2147483647", f.Priority)
		}
		s.Template.Priority = int32(p)
	}
	switch f.Overlap {
	case "", "allow":
		s.Overlap = nornv1.Schedule_OVERLAP_ALLOW
	case "skip":
		s.Overlap = nornv1.Schedule_OVERLAP_SKIP
	default:
		return nil, invalid("overlap", "%q: want allow or skip", f.Overlap)
	}
	for _, d := range []struct {
		field, text string
		dst         **durationpb.Duration
	}{{"interval", f.Interval, &s.Interval}, {"jitter", f.Jitter, &s.Jitter}, {"catchUpWindow", f.CatchUp, &s.CatchUpWindow}} {
		if d.text == "" {
			continue
		}
		v, err := time.ParseDuration(d.text)
		if err != nil {
			return nil, invalid(d.field, "%q is not a duration (like 90s, 15m or 1h30m)", d.text)
		}
		*d.dst = durationpb.New(v)
	}
	return s, nil
}

// formFunc acts on a posted schedule form: where to go next, or the form
// to show again with err.
type formFunc func(ctx context.Context, r *http.Request, api clients) (next string, again *scheduleForm, err error)

// formPost serves a form's POST through c.action (a session, its CSRF
// token, the same origin, or 403): fn's redirect (303), or, when fn
// returns a form to show again, that form as a page with the error and
// the values as typed, under the error's status.
func (c *Console) formPost(fn formFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		fw := &formWriter{ResponseWriter: w}
		c.action(func(ctx context.Context, _ http.ResponseWriter, r *http.Request, api clients) (string, error) {
			next, again, err := fn(ctx, r, api)
			if again == nil {
				return next, err
			}
			fw.status = formStatus(err)
			c.page(func(_ context.Context, _ *http.Request, _ clients, me rights, v *view) string {
				return showForm(v, me, again, err)
			})(fw, r)
			return next, nil
		})(fw, r)
	}
}

// formStatus is the HTTP status of a form shown again after err.
func formStatus(err error) int {
	switch connect.CodeOf(err) {
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists:
		return http.StatusConflict
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusUnprocessableEntity
}

// formWriter is the ResponseWriter of a form's POST: once the form is
// shown again, its page goes out with status, and the redirect c.action
// writes after it is dropped.
type formWriter struct {
	http.ResponseWriter
	status int  // the status of a form shown again
	wrote  bool // the header is out: a later one is dropped
}

// WriteHeader writes the first header only, with status for a page (200).
func (w *formWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote = true
	if w.status != 0 && code == http.StatusOK {
		code = w.status
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write writes the header first, as http.ResponseWriter's Write does.
func (w *formWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

// scheduleCreate creates the schedule the form gives (CreateSchedule).
func (c *Console) scheduleCreate(ctx context.Context, r *http.Request, api clients) (string, *scheduleForm, error) {
	f := formOf(r, "")
	s, err := f.schedule(nil)
	if err != nil {
		return "", f, err
	}
	res, err := api.admin.CreateSchedule(ctx, connect.NewRequest(&nornv1.CreateScheduleRequest{Schedule: s}))
	if err != nil {
		return "", f, err
	}
	return addQuery(Prefix+"schedules", "done", "created schedule "+f.Name+nextTick(res.Msg.Schedule)), nil, nil
}

// scheduleUpdate replaces the definition of the schedule of the path by
// the form's (UpdateSchedule takes the whole schedule), on the one
// stored now (GetSchedule): see scheduleForm.schedule.
func (c *Console) scheduleUpdate(ctx context.Context, r *http.Request, api clients) (string, *scheduleForm, error) {
	f := formOf(r, r.PathValue("name"))
	g, err := api.admin.GetSchedule(ctx, connect.NewRequest(&nornv1.GetScheduleRequest{Name: f.Name}))
	if err != nil {
		return "", f, err
	}
	if _, ok := r.PostForm["template.payload"]; !ok {
		// The form had no text area: a payload that is not text stays.
		f.Binary = len(g.Msg.Schedule.GetTemplate().GetPayload())
	}
	s, err := f.schedule(g.Msg.Schedule)
	if err != nil {
		return "", f, err
	}
	res, err := api.admin.UpdateSchedule(ctx, connect.NewRequest(&nornv1.UpdateScheduleRequest{Schedule: s}))
	if err != nil {
		return "", f, err
	}
	return addQuery(Prefix+"schedules", "done", "updated schedule "+f.Name+nextTick(res.Msg.Schedule)), nil, nil
}

// nextTick is ": next tick at ..." for the done note, "" when s has none.
func nextTick(s *nornv1.Schedule) string {
	if s.GetNextTick() == nil {
		return ""
	}
	return ": next tick " + when(s.GetNextTick())
}
