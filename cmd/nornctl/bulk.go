package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// bulkFilter selects the tasks of a bulk retry or cancel: the server
// filters by queue and status (ListTasks), the rest is checked here.
type bulkFilter struct {
	queue, status, createdAfter, createdBefore, errorText *string
}

// bulkFlags adds the filter flags to fs.
func bulkFlags(fs *flag.FlagSet) bulkFilter {
	return bulkFilter{
		queue:         fs.String("queue", "", "act on every task of this queue that matches the other filters"),
		status:        fs.String("status", "", "only tasks of this status (dead, aborted, cancelled, ready, ...)"),
		createdAfter:  fs.String("created-after", "", "only tasks enqueued after this time: RFC 3339, or a duration ago such as 24h"),
		createdBefore: fs.String("created-before", "", "only tasks enqueued before this time: RFC 3339, or a duration ago"),
		errorText:     fs.String("error-contains", "", "only tasks with an error whose code or description contains this text"),
	}
}

// set reports whether any filter is given (a bulk action).
func (f bulkFilter) set() bool {
	return *f.queue != "" || *f.status != "" || *f.createdAfter != "" || *f.createdBefore != "" || *f.errorText != ""
}

// bulk runs the server-side bulk action (TaskService.BulkAction) on
// every task the filter selects, a page per call, and reports its
// progress on stderr every second and its counts at the end. What the
// task no longer admits (retried or cancelled already) counts as
// skipped: running a bulk action again is safe, and it goes on where an
// interrupted one stopped (what it did no longer matches).
func (e *env) bulk(cmd *command, what string, f bulkFilter, action nornv1.BulkActionRequest_Action) error {
	if *f.queue == "" {
		return usagef(cmd, "--queue is required for a bulk %s", what)
	}
	status, err := parseStatus(*f.status)
	if err != nil {
		return usagef(cmd, "%v", err)
	}
	req := &nornv1.BulkActionRequest{Action: action, Queue: *f.queue, Status: status, ErrorContains: *f.errorText, PageSize: 100}
	now := time.Now()
	if *f.createdAfter != "" {
		after, err := parseWhen(*f.createdAfter, now)
		if err != nil {
			return usagef(cmd, "--created-after: %v", err)
		}
		req.CreatedAfter = timestamppb.New(after)
	}
	if *f.createdBefore != "" {
		before, err := parseWhen(*f.createdBefore, now)
		if err != nil {
			return usagef(cmd, "--created-before: %v", err)
		}
		req.CreatedBefore = timestamppb.New(before)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	var matched, done, skipped, failed int
	last := time.Now()
	for {
		r, err := c.BulkAction(e.ctx, req)
		if err != nil {
			return fmt.Errorf("%s (after %d matched, %d done): %w", what, matched, done, err)
		}
		matched, done, skipped = matched+int(r.GetMatched()), done+int(r.GetDone()), skipped+int(r.GetSkipped())
		for _, f := range r.GetFailures() {
			failed++
			fmt.Fprintf(e.stderr, "nornctl: %s of task %d: %s\n", what, f.GetId(), f.GetError())
		}
		if req.PageToken = r.GetNextPageToken(); req.PageToken == "" {
			break
		}
		if time.Since(last) >= time.Second {
			last = time.Now()
			fmt.Fprintf(e.stderr, "nornctl: %s: %d matched, %d done, %d skipped, %d failed so far\n", what, matched, done, skipped, failed)
		}
	}
	res, _ := structpb.NewStruct(map[string]any{"action": what, "matched": matched, "done": done, "skipped": skipped, "failed": failed})
	if err := e.emit(res, func(w io.Writer) {
		fmt.Fprintf(w, "%s: %d tasks matched, %d done, %d skipped (changed meanwhile), %d failed\n", what, matched, done, skipped, failed)
	}); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%s failed for %d tasks (run it again: what was done is not done twice)", what, failed)
	}
	return nil
}

// parseWhen parses a time filter: an RFC 3339 time, or a duration before
// now (24h: a day ago).
func parseWhen(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%q: negative duration", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time (2006-01-02T15:04:05Z) or a duration ago (24h)", s)
	}
	return t, nil
}

// idOrBulk starts a command that takes one task id or bulk filters: with
// filters it runs the bulk action what (done), else it parses the id.
func (e *env) idOrBulk(cmd *command, f bulkFilter, pos []string, what string, action nornv1.BulkActionRequest_Action) (id uint64, done bool, err error) {
	switch {
	case f.set() && len(pos) != 0:
		return 0, true, usagef(cmd, "give a task id or --queue filters, not both")
	case f.set():
		return 0, true, e.bulk(cmd, what, f, action)
	case len(pos) != 1:
		return 0, true, usagef(cmd, "a task id, or --queue filters, is required")
	}
	id, err = parseID("id", pos[0])
	if err != nil {
		return 0, true, usagef(cmd, "%v", err)
	}
	return id, false, nil
}
