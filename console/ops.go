package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// bulkBudget bounds how long one bulk action of the dead page runs
// before it answers with its progress and a link that goes on.
const bulkBudget = 20 * time.Second

// deadData is the dead tasks page's.
type deadData struct {
	Queue    string
	Queues   []string
	Tasks    []*nornv1.Task
	Next     string
	MayAct   bool // retry or cancel, one by one or all
	MayBulk  bool // BulkAction: admin on the queue
	Progress string
}

// dead lists a queue's DEAD tasks, newest first, with their last error.
func (c *Console) dead(ctx context.Context, r *http.Request, api clients, me rights, v *view) string {
	v.Title, v.Nav = "Dead tasks", "dead"
	q := r.URL.Query()
	d := deadData{Queue: q.Get("queue"), Queues: me.namedQueues()}
	v.Data = &d
	if d.Queue == "" && !me.mayList("*") {
		return "dead"
	}
	scope := d.Queue
	if scope == "" {
		scope = "*"
	}
	d.MayAct, d.MayBulk = me.mayRetry(scope), d.Queue != "" && me.mayAdmin(d.Queue)
	l, err := api.tasks.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{Queue: d.Queue,
		Status: nornv1.TaskStatus_TASK_STATUS_DEAD, NewestFirst: true, PageSize: 50, PageToken: q.Get("page")}))
	if err != nil {
		v.Errors = append(v.Errors, "ListTasks: "+errText(err))
		return "dead"
	}
	d.Tasks, d.Next = l.Msg.Tasks, l.Msg.NextPageToken
	return "dead"
}

// deadAct retries or cancels the tasks checked on the dead page, one by
// one (TaskService.Retry, Cancel), or, with all, every DEAD task of the
// queue (TaskService.BulkAction, a page per call, for at most
// bulkBudget; the answer links to the rest).
func (c *Console) deadAct(ctx context.Context, _ http.ResponseWriter, r *http.Request, api clients) (string, error) {
	queue := r.PostFormValue("queue")
	back := Prefix + "dead?queue=" + url.QueryEscape(queue)
	what := r.PostFormValue("action")
	if what != "retry" && what != "cancel" {
		return back, errors.New("action: retry or cancel")
	}
	if r.PostFormValue("all") != "" {
		action := nornv1.BulkActionRequest_ACTION_RETRY
		if what == "cancel" {
			action = nornv1.BulkActionRequest_ACTION_CANCEL
		}
		var done, matched, failed uint32
		tok := r.PostFormValue("page")
		deadline := time.Now().Add(bulkBudget)
		for {
			res, err := api.tasks.BulkAction(ctx, connect.NewRequest(&nornv1.BulkActionRequest{Action: action, Queue: queue,
				Status: nornv1.TaskStatus_TASK_STATUS_DEAD, PageToken: tok}))
			if err != nil {
				return back, err
			}
			done, matched, failed = done+res.Msg.Done, matched+res.Msg.Matched, failed+uint32(len(res.Msg.Failures))
			tok = res.Msg.NextPageToken
			if tok == "" || time.Now().After(deadline) {
				break
			}
		}
		msg := fmt.Sprintf("%s: %d of %d DEAD tasks of %s done, %d failed", what, done, matched, queue, failed)
		if tok != "" {
			msg += "; not finished: press the button again to go on"
		}
		return addQuery(back, "done", msg), nil
	}
	ids := r.PostForm["id"]
	if len(ids) == 0 {
		return back, errors.New("id: check at least one task")
	}
	var failures []string
	n := 0
	for _, s := range ids {
		id, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			failures = append(failures, fmt.Sprintf("%q: not a task id", s))
			continue
		}
		if what == "retry" {
			_, err = api.tasks.Retry(ctx, connect.NewRequest(&nornv1.RetryRequest{Id: id}))
		} else {
			_, err = api.tasks.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: id}))
		}
		if err != nil {
			failures = append(failures, fmt.Sprintf("%d: %s", id, errText(err)))
			continue
		}
		n++
	}
	msg := fmt.Sprintf("%s: %d of %d done", what, n, len(ids))
	for _, f := range failures {
		msg += "; " + f
	}
	return addQuery(back, "done", msg), nil
}

// clusterData is the cluster operations page's.
type clusterData struct {
	Plan   *nornv1.Plan
	Status *nornv1.StatusResponse
}

// cluster shows the rebalance plan (a dry run: nothing moves) and the
// moves under way, with apply, cancel and drain.
func (c *Console) cluster(ctx context.Context, r *http.Request, api clients, me rights, v *view) string {
	v.Title, v.Nav, v.Live = "Cluster", "cluster", true
	if !me.mayAdmin("*") {
		v.Errors = append(v.Errors, "Cluster operations are for admins (docs/SECURITY.md).")
		return "cluster"
	}
	d := &clusterData{}
	v.Data = d
	if st, err := api.admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{})); err != nil {
		v.Errors = append(v.Errors, "Status: "+errText(err))
	} else {
		d.Status = st.Msg
	}
	plan, err := api.admin.Rebalance(ctx, connect.NewRequest(&nornv1.RebalanceRequest{}))
	if err != nil {
		v.Errors = append(v.Errors, "Rebalance (dry run): "+errText(err))
		return "cluster"
	}
	d.Plan = plan.Msg.Plan
	return "cluster"
}

// rebalance applies the plan, or cancels the moves not yet promoted.
func (c *Console) rebalance(ctx context.Context, _ http.ResponseWriter, r *http.Request, api clients) (string, error) {
	req := &nornv1.RebalanceRequest{Apply: r.PostFormValue("cancel") == "", Cancel: r.PostFormValue("cancel") != ""}
	res, err := api.admin.Rebalance(ctx, connect.NewRequest(req))
	if err != nil {
		return Prefix + "cluster", err
	}
	what := "applied the plan"
	if req.Cancel {
		what = "cancelled the moves not yet promoted"
	}
	return addQuery(Prefix+"cluster", "done", fmt.Sprintf("%s: %d moves", what, len(res.Msg.GetPlan().GetMoves()))), nil
}

// drain moves every replica off a node (AdminService.Drain, applied).
func (c *Console) drain(ctx context.Context, _ http.ResponseWriter, r *http.Request, api clients) (string, error) {
	node := r.PostFormValue("node")
	if node == "" {
		return Prefix + "cluster", errors.New("node: required")
	}
	res, err := api.admin.Drain(ctx, connect.NewRequest(&nornv1.DrainRequest{Node: node, Apply: true}))
	if err != nil {
		return Prefix + "cluster", err
	}
	return addQuery(Prefix+"cluster", "done", fmt.Sprintf("draining %s: %d moves", node, len(res.Msg.GetPlan().GetMoves()))), nil
}
