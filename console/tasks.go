package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// searchBudget bounds how long the tasks page pages through ListTasks
// with a search filter (whose pages may come back empty while matches
// lie further on) before it shows what it found and a link that goes on.
const searchBudget = 2 * time.Second

// taskFilter is the tasks page's query: ListTasks' filters.
type taskFilter struct {
	Queue, Status, Page string
	Newest              bool
	Size                uint32 // page size, 10-500; 0: the default, 50
	// The search filters (ListTasksRequest's).
	DependsOn, Worker, ErrorText, Text string
}

// filterOf reads the tasks page's query.
func filterOf(q url.Values) taskFilter {
	f := taskFilter{Queue: q.Get("queue"), Status: q.Get("status"), Page: q.Get("page"), Newest: q.Get("newest") != "",
		DependsOn: strings.TrimSpace(q.Get("dependsOn")), Worker: q.Get("worker"), ErrorText: q.Get("errorText"), Text: q.Get("text")}
	if n, err := strconv.ParseUint(q.Get("size"), 10, 32); err == nil && n >= 10 && n <= 500 {
		f.Size = uint32(n)
	}
	return f
}

// Searching reports whether f has a search filter.
func (f taskFilter) Searching() bool {
	return f.DependsOn != "" || f.Worker != "" || f.ErrorText != "" || f.Text != ""
}

// Link is the tasks page of f from page on ("" for the first).
func (f taskFilter) Link(page string) string {
	q := url.Values{}
	for k, v := range map[string]string{"queue": f.Queue, "status": f.Status, "dependsOn": f.DependsOn, "worker": f.Worker,
		"errorText": f.ErrorText, "text": f.Text, "page": page} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.Newest {
		q.Set("newest", "1")
	}
	if f.Size != 0 {
		q.Set("size", strconv.Itoa(int(f.Size)))
	}
	return Prefix + "tasks?" + q.Encode()
}

// request is f's ListTasks request, or the error naming the field.
func (f taskFilter) request() (*nornv1.ListTasksRequest, error) {
	req := &nornv1.ListTasksRequest{Queue: f.Queue, PageSize: 50, PageToken: f.Page, NewestFirst: f.Newest,
		Worker: f.Worker, ErrorContains: f.ErrorText, PayloadContains: []byte(f.Text)}
	if f.Size != 0 {
		req.PageSize = f.Size
	}
	if f.Status != "" {
		st, ok := nornv1.TaskStatus_value["TASK_STATUS_"+f.Status]
		if !ok {
			return nil, fmt.Errorf("status: %q is not a status", f.Status)
		}
		req.Status = nornv1.TaskStatus(st)
	}
	if f.DependsOn != "" {
		id, err := strconv.ParseUint(f.DependsOn, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("depends on: %q is not a task id (a decimal number)", f.DependsOn)
		}
		req.DependsOn = id
	}
	return req, nil
}

// tasksData is the tasks page's.
type tasksData struct {
	F        taskFilter
	Tasks    []*nornv1.Task
	Next     string
	Statuses []string
	Queues   []string
	Cut      bool // a search stopped at its budget before the page filled
	// MayListAll: the caller may list every queue at once.
	MayListAll bool
}

// tasks lists tasks by ListTasks' filters, a page at a time. A search
// goes on through pages that hold fewer than the page size for up to
// searchBudget.
func (c *Console) tasks(ctx context.Context, r *http.Request, api clients, me rights, v *view) string {
	v.Title, v.Nav = "Tasks", "tasks"
	q := r.URL.Query()
	d := &tasksData{F: filterOf(q), Statuses: statusOrder, Queues: me.namedQueues(), MayListAll: me.mayList("*")}
	v.Data = d
	if d.F.Queue == "" && !d.MayListAll {
		return "tasks"
	}
	req, err := d.F.request()
	if err != nil {
		v.Errors = append(v.Errors, err.Error())
		return "tasks"
	}
	deadline := c.cfg.Now().Add(searchBudget)
	for {
		l, err := api.tasks.ListTasks(ctx, connect.NewRequest(req))
		if err != nil {
			v.Errors = append(v.Errors, "ListTasks: "+errText(err))
			return "tasks"
		}
		d.Tasks, d.Next = append(d.Tasks, l.Msg.Tasks...), l.Msg.NextPageToken
		if !d.F.Searching() || d.Next == "" || len(d.Tasks) >= int(req.PageSize) {
			return "tasks"
		}
		if c.cfg.Now().After(deadline) {
			d.Cut = true
			return "tasks"
		}
		// The next call's page holds at most what this one lacks.
		req.PageToken, req.PageSize = d.Next, req.PageSize-uint32(len(l.Msg.Tasks))
	}
}

// taskData is the task page's.
type taskData struct {
	T                   *nornv1.Task
	Payload, Result     previewed
	MayCancel, MayRetry bool
	Terminal            bool
	MayListAll          bool // the caller may search every queue for its dependents
}

func (c *Console) task(ctx context.Context, r *http.Request, api clients, me rights, v *view) string {
	v.Nav, v.Live = "tasks", true
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	v.Title = "Task " + r.PathValue("id")
	if err != nil {
		v.Errors = append(v.Errors, fmt.Sprintf("id: %q is not a task id (a decimal number)", r.PathValue("id")))
		return "task"
	}
	g, err := api.tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id}))
	if err != nil {
		v.Errors = append(v.Errors, "GetTask: "+errText(err))
		return "task"
	}
	t := g.Msg.Task
	queue := t.GetSpec().GetQueue()
	terminal := slices.Contains([]nornv1.TaskStatus{nornv1.TaskStatus_TASK_STATUS_COMPLETED, nornv1.TaskStatus_TASK_STATUS_ABORTED,
		nornv1.TaskStatus_TASK_STATUS_CANCELLED, nornv1.TaskStatus_TASK_STATUS_DEAD}, t.Status)
	v.Data = taskData{T: t, Payload: preview(t.GetSpec().GetPayload()), Result: preview(t.Result),
		MayCancel:  !terminal && me.mayCancel(queue),
		MayRetry:   terminal && t.Status != nornv1.TaskStatus_TASK_STATUS_COMPLETED && me.mayRetry(queue),
		Terminal:   terminal,
		MayListAll: me.mayList("*")}
	return "task"
}

// find is the search box: the page of the task with the id asked for.
func (c *Console) find(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimSpace(r.URL.Query().Get("id"))
	if _, err := strconv.ParseUint(id, 10, 64); err != nil {
		http.Redirect(w, r, addQuery(Prefix+"tasks", "error", fmt.Sprintf("id: %q is not a task id (a decimal number)", id)), http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, Prefix+"tasks/"+id, http.StatusSeeOther)
}

// act is the task page's cancel or retry button (the path's last part).
func (c *Console) act(ctx context.Context, _ http.ResponseWriter, r *http.Request, api clients) (string, error) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	back := Prefix + "tasks/" + url.PathEscape(r.PathValue("id"))
	if err != nil {
		return back, errors.New("id: not a task id")
	}
	switch r.PathValue("act") {
	case "cancel":
		_, err = api.tasks.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: id}))
	case "retry":
		_, err = api.tasks.Retry(ctx, connect.NewRequest(&nornv1.RetryRequest{Id: id}))
	default:
		err = fmt.Errorf("%q: not an action (cancel or retry)", r.PathValue("act"))
	}
	return back, err
}
