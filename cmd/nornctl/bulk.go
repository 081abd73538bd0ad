package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
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

// bulk runs act on every task the filter selects, paging through
// ListTasks, and reports its progress on stderr every second and its
// counts at the end. act's FAILED_PRECONDITION (the task changed since it
// was listed: retried or cancelled already) counts as skipped: running a
// bulk action again is safe, and it goes on where an interrupted one
// stopped (what it did no longer matches).
func (e *env) bulk(cmd *command, what string, f bulkFilter, act func(c *client.Client, t *nornv1.Task) error) error {
	if *f.queue == "" {
		return usagef(cmd, "--queue is required for a bulk %s", what)
	}
	status, err := parseStatus(*f.status)
	if err != nil {
		return usagef(cmd, "%v", err)
	}
	now := time.Now()
	var after, before time.Time
	if *f.createdAfter != "" {
		if after, err = parseWhen(*f.createdAfter, now); err != nil {
			return usagef(cmd, "--created-after: %v", err)
		}
	}
	if *f.createdBefore != "" {
		if before, err = parseWhen(*f.createdBefore, now); err != nil {
			return usagef(cmd, "--created-before: %v", err)
		}
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	var matched, done, skipped, failed int
	last := time.Now()
	for t, err := range c.Tasks(e.ctx, *f.queue, status) {
		if err != nil {
			return fmt.Errorf("listing the tasks (after %d matched, %d done): %w", matched, done, err)
		}
		created := t.GetCreatedAt().AsTime()
		if (!after.IsZero() && !created.After(after)) || (!before.IsZero() && !created.Before(before)) || !hasError(t, *f.errorText) {
			continue
		}
		matched++
		switch err := act(c, t); {
		case err == nil:
			done++
		case client.IsSuperseded(err):
			skipped++
		default:
			failed++
			fmt.Fprintf(e.stderr, "nornctl: %s of task %d: %v\n", what, t.GetId(), err)
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

// hasError reports whether t has an error whose code or description
// contains text ("" matches every task).
func hasError(t *nornv1.Task, text string) bool {
	if text == "" {
		return true
	}
	for _, e := range t.GetErrors() {
		if strings.Contains(e.GetCode(), text) || strings.Contains(e.GetDescription(), text) {
			return true
		}
	}
	return false
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
func (e *env) idOrBulk(cmd *command, f bulkFilter, pos []string, what string, act func(c *client.Client, t *nornv1.Task) error) (id uint64, done bool, err error) {
	switch {
	case f.set() && len(pos) != 0:
		return 0, true, usagef(cmd, "give a task id or --queue filters, not both")
	case f.set():
		return 0, true, e.bulk(cmd, what, f, act)
	case len(pos) != 1:
		return 0, true, usagef(cmd, "a task id, or --queue filters, is required")
	}
	id, err = parseID("id", pos[0])
	if err != nil {
		return 0, true, usagef(cmd, "%v", err)
	}
	return id, false, nil
}
