package console

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// pageNames are the templates under templates/, each with the layout.
var pageNames = []string{"login", "overview", "queues", "tasks", "task", "dead", "schedules", "schedule_form", "cluster", "workers"}

func parsePages() map[string]*template.Template {
	funcs := template.FuncMap{
		"ago":  ago,
		"when": when,
		"duration": func(d interface{ AsDuration() time.Duration }) string {
			return d.AsDuration().Round(time.Millisecond).String()
		},
		"status":  statusName,
		"preview": preview,
		"path":    url.PathEscape,
		"mul100":  func(f float64) float64 { return f * 100 },
		"add":     func(a, b int) int { return a + b },
		"last":    lastErrors,
	}
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		out[name] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html"))
	}
	return out
}

// view is what every page gets: the layout's fields and the page's own.
type view struct {
	Title  string
	Node   string
	Nav    string // the current section
	CSRF   string
	Who    string // the caller, for the header ("" without access control)
	Login  bool   // logged in by token: show Log out
	Live   bool   // the page refreshes itself
	Errors []string
	Data   any
}

// pageFunc fills a page's view; it returns the template's name.
type pageFunc func(ctx context.Context, r *http.Request, api clients, me rights, v *view) string

// page serves a GET page: the caller must have a session (else the
// login page); WhoAmI tells the page what it may show.
func (c *Console) page(fn pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok := c.sessionOf(r)
		if !ok {
			http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		api := c.clientsFor(r, s)
		ctx := r.Context()
		v := &view{Node: c.cfg.NodeID, CSRF: c.csrf(s), Login: s.token != ""}
		me, err := api.admin.WhoAmI(ctx, connect.NewRequest(&nornv1.WhoAmIRequest{}))
		if err != nil {
			if connect.CodeOf(err) == connect.CodeUnauthenticated {
				// A revoked token: log in again.
				clearSession(w)
				http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			v.Errors = append(v.Errors, "WhoAmI: "+errText(err))
		}
		var rt rights
		if me != nil {
			rt.me = me.Msg
			switch {
			case me.Msg.User != "":
				v.Who = me.Msg.User
			case me.Msg.Node != "":
				v.Who = "node " + me.Msg.Node
			}
		}
		// The notes an action's redirect left: what went wrong or was done.
		for _, k := range []string{"error", "done"} {
			if e := r.URL.Query().Get(k); e != "" {
				v.Errors = append(v.Errors, e)
			}
		}
		name := fn(ctx, r, api, rt, v)
		c.render(w, name, v)
	}
}

// render writes template name with v, or a plain error.
func (c *Console) render(w http.ResponseWriter, name string, v *view) {
	var b bytes.Buffer
	if err := c.pages[name].Execute(&b, v); err != nil {
		c.cfg.Logger.Error("console: rendering a page failed", "page", name, "err", err)
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b.Bytes()) //nolint:errcheck // the browser is gone
}

// action serves a POST: a session, its CSRF token and the same origin, or
// 403; fn acts and returns where to go next.
func (c *Console) action(fn func(ctx context.Context, w http.ResponseWriter, r *http.Request, api clients) (string, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		s, ok := c.sessionOf(r)
		if !ok {
			http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
			return
		}
		if !c.checkAction(r, s) {
			http.Error(w, "refused: the form's CSRF token is missing or wrong, or it came from another site (reload the page and try again)", http.StatusForbidden)
			return
		}
		next, err := fn(r.Context(), w, r, c.clientsFor(r, s))
		if err != nil {
			next = addQuery(next, "error", errText(err))
		}
		http.Redirect(w, r, next, http.StatusSeeOther)
	}
}

// addQuery adds key=value to the query of the path u.
func addQuery(u, key, value string) string {
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + key + "=" + url.QueryEscape(value)
}

// overviewData is the overview page's.
type overviewData struct {
	Status      *nornv1.StatusResponse
	Leaderless  []uint32
	Disagreeing []uint32
	Calls       *sparksView // this node's calls, from its metrics
}

func (c *Console) overview(ctx context.Context, r *http.Request, api clients, me rights, v *view) string {
	v.Title, v.Nav, v.Live = "Overview", "overview", true
	if !me.mayStatus() {
		v.Errors = append(v.Errors, "Your grants do not include the cluster's status (admin or reader): see Queues and Tasks.")
		return "overview"
	}
	d := overviewData{Calls: &sparksView{Off: true}}
	if c.sparks != nil {
		d.Calls = c.sparks.view()
	}
	st, err := api.admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{}))
	if err != nil {
		v.Errors = append(v.Errors, "Status: "+errText(err))
		v.Data = d
		return "overview"
	}
	d.Status = st.Msg
	for _, p := range st.Msg.Partitions {
		if p.Leader == "" {
			d.Leaderless = append(d.Leaderless, p.Id)
		}
		if len(p.ReplicaRoots) > 0 && !p.ReplicasAgree {
			d.Disagreeing = append(d.Disagreeing, p.Id)
		}
	}
	v.Data = d
	return "overview"
}

// queueRow is one queue on the queues page.
type queueRow struct {
	Q         *nornv1.Queue
	Paused    bool
	MayPause  bool
	Counts    []statusCount
	OldestAge string
}

type statusCount struct {
	Status string
	N      uint64
}

// statusOrder is the order of the counts' columns.
var statusOrder = []string{"READY", "DELAYED", "CLAIMED", "COMPLETED", "ABORTED", "CANCELLED", "DEAD"}

func (c *Console) queues(ctx context.Context, r *http.Request, api clients, me rights, v *view) string {
	v.Title, v.Nav, v.Live = "Queues", "queues", true
	var qs []*nornv1.Queue
	if me.mayList("*") {
		l, err := api.queues.ListQueues(ctx, connect.NewRequest(&nornv1.ListQueuesRequest{}))
		if err != nil {
			v.Errors = append(v.Errors, "ListQueues: "+errText(err))
		} else {
			qs = l.Msg.Queues
		}
	} else {
		// Only the queues the caller's grants name.
		for _, name := range me.namedQueues() {
			g, err := api.queues.GetQueue(ctx, connect.NewRequest(&nornv1.GetQueueRequest{Queue: name}))
			if err != nil {
				if connect.CodeOf(err) != connect.CodePermissionDenied {
					v.Errors = append(v.Errors, "GetQueue "+name+": "+errText(err))
				}
				continue
			}
			qs = append(qs, g.Msg.Queue)
		}
	}
	var rows []queueRow
	for _, q := range qs {
		row := queueRow{Q: q, Paused: q.GetSettings().GetPaused(), MayPause: me.mayAdmin(q.Name)}
		for _, st := range statusOrder {
			row.Counts = append(row.Counts, statusCount{st, q.ByStatus[st]})
		}
		if q.OldestReadyAge != nil {
			row.OldestAge = q.OldestReadyAge.AsDuration().Round(time.Second).String()
		}
		rows = append(rows, row)
	}
	v.Data = struct {
		Rows     []queueRow
		Statuses []string
	}{rows, statusOrder}
	return "queues"
}

func (c *Console) pause(ctx context.Context, w http.ResponseWriter, r *http.Request, api clients) (string, error) {
	queue := r.PathValue("queue")
	paused := r.PostFormValue("paused") == "true"
	_, err := api.queues.SetQueue(ctx, connect.NewRequest(&nornv1.SetQueueRequest{Queue: queue, Settings: &nornv1.QueueSettings{Paused: &paused}}))
	return Prefix + "queues", err
}

// previewed is a payload or result as the task page shows it.
type previewed struct {
	Kind string // "empty", "JSON", "text" or "hex"
	Text string
	Size int
}

// previewLimit is the most bytes of a payload the task page shows.
const previewLimit = 64 << 10

// preview shows b as pretty JSON, as text when it is UTF-8, else as hex.
func preview(b []byte) previewed {
	p := previewed{Size: len(b)}
	if len(b) == 0 {
		p.Kind = "empty"
		return p
	}
	cut := b[:min(len(b), previewLimit)]
	var out bytes.Buffer
	switch {
	case len(b) <= previewLimit && json.Valid(b) && json.Indent(&out, b, "", "  ") == nil:
		p.Kind, p.Text = "JSON", out.String()
	case utf8.Valid(cut):
		p.Kind, p.Text = "text", string(cut)
	default:
		p.Kind, p.Text = "hex", hex.Dump(cut)
	}
	return p
}

// statusName is a status without its prefix: READY.
func statusName(s nornv1.TaskStatus) string { return strings.TrimPrefix(s.String(), "TASK_STATUS_") }

// when formats a timestamp in UTC, "" when unset.
func when(t *timestamppb.Timestamp) string {
	if t == nil {
		return ""
	}
	return t.AsTime().UTC().Format("2006-01-02 15:04:05.000 MST")
}

// ago is how long ago t was, rounded.
func ago(t *timestamppb.Timestamp) string {
	if t == nil {
		return ""
	}
	d := time.Since(t.AsTime())
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return d.Round(time.Second).String() + " ago"
	case d < time.Hour:
		return d.Round(time.Minute).String() + " ago"
	}
	return d.Round(time.Hour).String() + " ago"
}

// lastErrors is the last n of errs, newest first (a DEAD task's last is
// the server's max_attempts_exceeded: the worker's error comes before).
func lastErrors(n int, errs []*nornv1.TaskError) []*nornv1.TaskError {
	out := slices.Clone(errs[max(len(errs)-n, 0):])
	slices.Reverse(out)
	return out
}
