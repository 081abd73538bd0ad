package console

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// workersBudget bounds how long the workers page reads a queue's CLAIMED
// tasks; maxWorkerTasks bounds how many it reads.
const (
	workersBudget  = 2 * time.Second
	maxWorkerTasks = 20_000
)

// workerRow is a worker as the workers page shows it: what it holds now.
type workerRow struct {
	Name     string
	Held     int                    // CLAIMED tasks whose live claim is this worker's
	Since    *timestamppb.Timestamp // the oldest of those claims' starts
	LeaseEnd *timestamppb.Timestamp // the latest of their leases
}

// workersData is the workers page's.
type workersData struct {
	Queue   string
	Queues  []string
	Workers []workerRow
	Tasks   int  // CLAIMED tasks read
	Cut     bool // the page stopped before the end (budget or count)
}

// workers lists the workers holding claims on a queue's tasks now, from
// its CLAIMED tasks (ListTasks): Norn keeps no registry of workers, so a
// worker that holds nothing is not listed; each links to every task it
// ever claimed (ListTasks' worker search).
func (c *Console) workers(ctx context.Context, r *http.Request, api clients, me rights, v *view) string {
	v.Title, v.Nav, v.Live = "Workers", "workers", true
	d := &workersData{Queue: r.URL.Query().Get("queue"), Queues: me.namedQueues()}
	v.Data = d
	if d.Queue == "" && !me.mayList("*") {
		return "workers"
	}
	byName := map[string]*workerRow{}
	req := &nornv1.ListTasksRequest{Queue: d.Queue, Status: nornv1.TaskStatus_TASK_STATUS_CLAIMED, PageSize: 1000}
	deadline := c.cfg.Now().Add(workersBudget)
	for {
		l, err := api.tasks.ListTasks(ctx, connect.NewRequest(req))
		if err != nil {
			v.Errors = append(v.Errors, "ListTasks: "+errText(err))
			break
		}
		for _, t := range l.Msg.Tasks {
			cl := t.GetCurrentClaim()
			if cl == nil {
				continue
			}
			d.Tasks++
			w := byName[cl.GetWorker()]
			if w == nil {
				w = &workerRow{Name: cl.GetWorker()}
				byName[w.Name] = w
			}
			w.Held++
			if w.Since == nil || cl.GetStart().AsTime().Before(w.Since.AsTime()) {
				w.Since = cl.GetStart()
			}
			if w.LeaseEnd == nil || cl.GetExpiry().AsTime().After(w.LeaseEnd.AsTime()) {
				w.LeaseEnd = cl.GetExpiry()
			}
		}
		if req.PageToken = l.Msg.NextPageToken; req.PageToken == "" {
			break
		}
		if d.Tasks >= maxWorkerTasks || c.cfg.Now().After(deadline) {
			d.Cut = true
			break
		}
	}
	for _, w := range byName {
		d.Workers = append(d.Workers, *w)
	}
	slices.SortFunc(d.Workers, func(a, b workerRow) int {
		return cmp.Or(cmp.Compare(b.Held, a.Held), cmp.Compare(a.Name, b.Name))
	})
	return "workers"
}
