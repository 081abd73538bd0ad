package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
)

const enqueueHelp = `
The payload is the second argument, or the contents of --payload-file
(- reads standard input), or empty. The table output is the new task's id;
-o json prints the EnqueueResponse ({"id": "..."}).

  nornctl enqueue emails '{"to":"a@b.c"}' --priority 5 --not-before 10m
  nornctl enqueue reports --payload-file - --depends-on 1234,5678 < job.json
  nornctl enqueue invoices '{"n":7}' --deadline 1h   # CANCELLED (error deadline) if not completed within the hour
  nornctl enqueue webhooks '{"url":"..."}' --max-attempts 8 --backoff 1s --backoff-multiplier 2 --max-backoff 10m --jitter 0.2
  nornctl enqueue reports '{"month":"2026-11"}' --unique-key monthly:2026-11   # one live task per key
  nornctl enqueue reports '{"report":7}' --fairness-key acme --fairness-weight 3   # claims take tenants in turn

With --unique-key, an enqueue whose key is held by a task of the queue
that is not finished (or, with --unique-for, was enqueued less than that
long ago) creates nothing: it prints the holder's id and says so on
standard error (-o json: "duplicate": true).

A retry flag gives the task a retry policy (docs/API.md, "Retries"):
--max-attempts failed attempts make it DEAD; after the n-th it waits
--backoff x --backoff-multiplier^(n-1), at most --max-backoff, less up
to --jitter of it.`

func runEnqueue(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	priority := fs.Int("priority", 0, "priority: higher is claimed first; may be negative (int32)")
	notBefore := fs.String("not-before", "", "earliest claim time: RFC 3339, or a duration from now such as 5m")
	deadline := fs.String("deadline", "", "cancel the task if it is not completed by then: RFC 3339, or a duration from now such as 1h")
	dependsOn := fs.String("depends-on", "", "comma-separated ids of tasks that must be COMPLETED first")
	maxClaims := fs.Uint("max-claims", 0, "abort the task after this many claims ended by lease expiry (0: unlimited)")
	retry := retryFlags(fs)
	idFlag := fs.String("id", "", "store the task under this id, for an idempotent retry (default: the server assigns one)")
	quorum := fs.Uint("w", 0, "write quorum: replicas that must store the task (0: the server's default, a majority)")
	payloadFile := fs.String("payload-file", "", "read the payload from this file (-: standard input)")
	uniqueKey := fs.String("unique-key", "", "unique key in the queue: no second task with it while one holds it (docs/SCHEDULING.md)")
	uniqueFor := fs.Duration("unique-for", 0, "with --unique-key: hold the key this long after the enqueue, finished or not (0: until the task is finished)")
	fairKey := fs.String("fairness-key", "", "fairness key (a tenant, say): claims serve a queue's keys in turn (docs/SCHEDULING.md)")
	fairWeight := fs.Uint("fairness-weight", 0, "with --fairness-key: the key's turns to a weight-1 key's one, 1-1000 (0: 1)")
	pos, err := e.parse(cmd, fs, args, 1, 2)
	if err != nil {
		return err
	}
	if *priority < math.MinInt32 || *priority > math.MaxInt32 {
		return usagef(cmd, "--priority %d: out of the int32 range", *priority)
	}
	if *maxClaims > math.MaxUint32 || *quorum > math.MaxUint32 {
		return usagef(cmd, "--max-claims or --w: out of the uint32 range")
	}
	spec := &nornv1.TaskSpec{Queue: pos[0], Priority: int32(*priority), MaxClaims: uint32(*maxClaims)}
	if spec.Retry, err = retry.policy(); err != nil {
		return usagef(cmd, "%v", err)
	}
	now := time.Now()
	nb, err := parseNotBefore(*notBefore, now)
	if err != nil {
		return usagef(cmd, "%v", err)
	}
	if !nb.IsZero() {
		spec.NotBefore = timestamppb.New(nb)
	}
	dl, err := parseTimeFlag("--deadline", *deadline, now)
	if err != nil {
		return usagef(cmd, "%v", err)
	}
	if !dl.IsZero() {
		spec.Deadline = timestamppb.New(dl)
	}
	if spec.DependsOn, err = parseIDs("--depends-on", *dependsOn); err != nil {
		return usagef(cmd, "%v", err)
	}
	spec.UniqueKey = *uniqueKey
	if *fairWeight > 0 && *fairKey == "" {
		return usagef(cmd, "--fairness-weight needs --fairness-key")
	}
	if *fairWeight > math.MaxUint32 {
		return usagef(cmd, "--fairness-weight: out of the uint32 range")
	}
	spec.FairnessKey, spec.FairnessWeight = *fairKey, uint32(*fairWeight)
	switch {
	case *uniqueFor < 0:
		return usagef(cmd, "--unique-for %s: must be positive", *uniqueFor)
	case *uniqueFor > 0 && *uniqueKey == "":
		return usagef(cmd, "--unique-for needs --unique-key")
	case *uniqueFor > 0:
		spec.UniqueFor = durationpb.New(*uniqueFor)
	}
	var opts []client.EnqueueOption
	if *idFlag != "" {
		id, err := parseID("--id", *idFlag)
		if err != nil {
			return usagef(cmd, "%v", err)
		}
		opts = append(opts, client.WithID(id))
	}
	if *quorum != 0 {
		opts = append(opts, client.WithQuorum(uint32(*quorum)))
	}
	arg := ""
	if len(pos) == 2 {
		arg = pos[1]
	}
	if len(pos) == 2 && *payloadFile != "" {
		return usagef(cmd, "give the payload as an argument or with --payload-file, not both")
	}
	if spec.Payload, err = readPayload(arg, len(pos) == 2, *payloadFile, e.stdin); err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	var acks uint32
	var dup bool
	id, err := c.Enqueue(e.ctx, spec, append(opts, client.WithAcks(&acks), client.WithDuplicate(&dup))...)
	if err != nil {
		if id != 0 {
			return fmt.Errorf("%w (the task may be stored; retry with --id %d)", err, id)
		}
		return err
	}
	if dup {
		fmt.Fprintf(e.stderr, "unique key %q is held by task %d: nothing enqueued\n", spec.UniqueKey, id)
	}
	return e.emit(&nornv1.EnqueueResponse{Id: id, Acks: acks, Duplicate: dup}, func(w io.Writer) {
		fmt.Fprintln(w, id)
	})
}

func runGet(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	pos, err := e.parse(cmd, fs, args, 1, 1)
	if err != nil {
		return err
	}
	id, err := parseID("id", pos[0])
	if err != nil {
		return usagef(cmd, "%v", err)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	t, err := c.GetTask(e.ctx, id)
	if err != nil {
		return err
	}
	return e.emit(&nornv1.GetTaskResponse{Task: t}, func(w io.Writer) { writeTask(w, t) })
}

const listHelp = `
Without --all, one page is listed; when more follow, the token of the next
page is printed on standard error (table) or is the response's
nextPageToken (-o json). With --all every page is fetched, and -o json
prints them as one ListTasksResponse. The search filters (--depends-on,
--worker, --error, --payload) look into each task a page examines, so a
page may be empty while more follow.`

func runList(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	queue := fs.String("queue", "", "only tasks of this queue (default: every queue)")
	statusFlag := fs.String("status", "", "only tasks with this status: READY, DELAYED, CLAIMED, COMPLETED, ABORTED, CANCELLED or DEAD")
	pageSize := fs.Uint("page-size", 100, "tasks per page, 1 to 1000")
	pageToken := fs.String("page-token", "", "continue from this page token (from an earlier list)")
	all := fs.Bool("all", false, "list every page")
	newest := fs.Bool("newest-first", false, "newest tasks first across the cluster (for example the latest DEAD ones), rather than partition by partition")
	dependsOn := fs.String("depends-on", "", "only tasks that depend on this task id")
	worker := fs.String("worker", "", "only tasks claimed at least once by this worker")
	errorText := fs.String("error", "", "only tasks with an error whose code or description contains this text")
	payload := fs.String("payload", "", "only tasks whose payload contains this text")
	if _, err := e.parse(cmd, fs, args, 0, 0); err != nil {
		return err
	}
	var dep uint64
	if *dependsOn != "" {
		var err error
		if dep, err = parseID("--depends-on", *dependsOn); err != nil {
			return usagef(cmd, "%v", err)
		}
	}
	status, err := parseStatus(*statusFlag)
	if err != nil {
		return usagef(cmd, "%v", err)
	}
	if *pageSize < 1 || *pageSize > 1000 {
		return usagef(cmd, "--page-size %d: want 1 to 1000", *pageSize)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	req := &nornv1.ListTasksRequest{Queue: *queue, Status: status, PageSize: uint32(*pageSize), PageToken: *pageToken, NewestFirst: *newest,
		DependsOn: dep, Worker: *worker, ErrorContains: *errorText, PayloadContains: []byte(*payload)}
	out := &nornv1.ListTasksResponse{}
	for {
		page, err := c.ListTasks(e.ctx, req)
		if err != nil {
			return err
		}
		out.Tasks = append(out.Tasks, page.GetTasks()...)
		out.NextPageToken = page.GetNextPageToken()
		if !*all || out.NextPageToken == "" {
			break
		}
		req.PageToken = out.NextPageToken
	}
	if err := e.emit(out, func(w io.Writer) { writeTaskList(w, out.Tasks) }); err != nil {
		return err
	}
	if !e.json() && out.NextPageToken != "" {
		fmt.Fprintf(e.stderr, "more tasks follow: --page-token %s (or --all)\n", out.NextPageToken)
	}
	return nil
}

func runCount(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	queue := fs.String("queue", "", "only tasks of this queue (default: every queue)")
	if _, err := e.parse(cmd, fs, args, 0, 0); err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	resp, err := c.CountTasks(e.ctx, *queue)
	if err != nil {
		return err
	}
	return e.emit(resp, func(w io.Writer) { writeCounts(w, resp) })
}

const claimHelp = `
Each claimed task is printed with its claim id, which renew, update,
complete, abort and yield need. With -o json the ClaimResponse is printed
({"tasks": [{"task": {...}, "claimId": "...", "expiry": "..."}]}); no task
claimable after --wait prints no rows, or {} with -o json, and succeeds.`

func runClaim(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	worker := fs.String("worker", "", "worker name recorded in the claim history (default <hostname>-<pid>)")
	lease := fs.Duration("lease", 0, "lease of each claim (0: the server's default, 30s)")
	maxTasks := fs.Int("max", 1, "most tasks to claim, 1 to 1000")
	wait := fs.Duration("wait", 0, "long poll: how long to wait for a claimable task (0: answer at once)")
	pos, err := e.parse(cmd, fs, args, 1, 1)
	if err != nil {
		return err
	}
	if *maxTasks < 1 || *maxTasks > 1000 {
		return usagef(cmd, "--max %d: want 1 to 1000", *maxTasks)
	}
	if *lease < 0 || *wait < 0 {
		return usagef(cmd, "--lease and --wait must not be negative")
	}
	if *worker == "" {
		*worker = defaultWorker()
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	tasks, err := c.Claim(e.ctx, client.ClaimRequest{Queue: pos[0], Worker: *worker, Lease: *lease, Max: *maxTasks, Wait: *wait})
	if err != nil {
		return err
	}
	return e.emit(&nornv1.ClaimResponse{Tasks: tasks}, func(w io.Writer) { writeClaimed(w, tasks) })
}

// defaultWorker is the default --worker of claim: "<hostname>-<pid>".
func defaultWorker() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "nornctl"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// parseClaimArgs parses the "<id> <claim-id>" arguments of the commands
// that act under a claim.
func parseClaimArgs(cmd *command, pos []string) (id, claimID uint64, err error) {
	if id, err = parseID("id", pos[0]); err != nil {
		return 0, 0, usagef(cmd, "%v", err)
	}
	if claimID, err = parseID("claim-id", pos[1]); err != nil {
		return 0, 0, usagef(cmd, "%v", err)
	}
	return id, claimID, nil
}

func runRenew(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	lease := fs.Duration("lease", 0, "new lease, counted from now; a renew never shortens a lease (0: the server's default, 30s)")
	pos, err := e.parse(cmd, fs, args, 2, 2)
	if err != nil {
		return err
	}
	id, claimID, err := parseClaimArgs(cmd, pos)
	if err != nil {
		return err
	}
	if *lease < 0 {
		return usagef(cmd, "--lease must not be negative")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	expiry, err := c.Renew(e.ctx, id, claimID, *lease)
	if err != nil {
		return err
	}
	return e.emit(&nornv1.RenewResponse{Expiry: timestamppb.New(expiry)}, func(w io.Writer) {
		fmt.Fprintf(w, "renewed task %d claim %d: expires %s\n", id, claimID, formatTime(expiry))
	})
}

const updateHelp = `
Updates of one claim are keyed by --seq, which must grow with every update
(a repeated seq is an idempotent retry).`

func runUpdate(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	seq := fs.Uint64("seq", 1, "sequence number of this update within the claim, from 1")
	progress := fs.Float64("progress", 0, "fraction of the work done, 0 to 1")
	message := fs.String("message", "", "status line")
	data := fs.String("data", "", "opaque data, for example a checkpoint")
	pos, err := e.parse(cmd, fs, args, 2, 2)
	if err != nil {
		return err
	}
	id, claimID, err := parseClaimArgs(cmd, pos)
	if err != nil {
		return err
	}
	if *seq == 0 {
		return usagef(cmd, "--seq must be at least 1")
	}
	if *progress < 0 || *progress > 1 || math.IsNaN(*progress) {
		return usagef(cmd, "--progress %v: want 0 to 1", *progress)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	req := &nornv1.UpdateRequest{Id: id, ClaimId: claimID, Seq: *seq, Progress: *progress, Message: *message}
	if *data != "" {
		req.Data = []byte(*data)
	}
	if err := c.Update(e.ctx, req); err != nil {
		return err
	}
	return e.emit(&nornv1.UpdateResponse{}, func(w io.Writer) {
		fmt.Fprintf(w, "updated task %d claim %d seq %d\n", id, claimID, *seq)
	})
}

func runComplete(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	result := fs.String("result", "", "the task's result")
	pos, err := e.parse(cmd, fs, args, 2, 2)
	if err != nil {
		return err
	}
	id, claimID, err := parseClaimArgs(cmd, pos)
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	var res []byte
	if *result != "" {
		res = []byte(*result)
	}
	if err := c.Complete(e.ctx, id, claimID, res); err != nil {
		return err
	}
	return e.emit(&nornv1.CompleteResponse{}, func(w io.Writer) {
		fmt.Fprintf(w, "completed task %d\n", id)
	})
}

func runAbort(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	code := fs.String("code", "", "machine-readable error code, for example bad_payload (required)")
	description := fs.String("description", "", "human-readable description")
	retry := fs.Bool("retry", false, "fail the attempt instead: the task is retried after its backoff (DEAD after its last attempt)")
	var errArgs stringList
	fs.Var(&errArgs, "arg", "a value the description refers to (repeatable)")
	pos, err := e.parse(cmd, fs, args, 2, 2)
	if err != nil {
		return err
	}
	id, claimID, err := parseClaimArgs(cmd, pos)
	if err != nil {
		return err
	}
	if *code == "" {
		return usagef(cmd, "--code is required")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	te := &nornv1.TaskError{Code: *code, Description: *description, Args: errArgs}
	if *retry {
		if err := c.Fail(e.ctx, id, claimID, te); err != nil {
			return err
		}
		return e.emit(&nornv1.AbortResponse{}, func(w io.Writer) {
			fmt.Fprintf(w, "failed the attempt of task %d: it is retried after its backoff, or DEAD after its last attempt\n", id)
		})
	}
	if err := c.Abort(e.ctx, id, claimID, te); err != nil {
		return err
	}
	return e.emit(&nornv1.AbortResponse{}, func(w io.Writer) {
		fmt.Fprintf(w, "aborted task %d\n", id)
	})
}

func runYield(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	progress := fs.Float64("progress", 0, "the task's progress, 0 to 1, for the next claim to see")
	pos, err := e.parse(cmd, fs, args, 2, 2)
	if err != nil {
		return err
	}
	id, claimID, err := parseClaimArgs(cmd, pos)
	if err != nil {
		return err
	}
	if *progress < 0 || *progress > 1 || math.IsNaN(*progress) {
		return usagef(cmd, "--progress %v: want 0 to 1", *progress)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	if err := c.Yield(e.ctx, id, claimID, *progress); err != nil {
		return err
	}
	return e.emit(&nornv1.YieldResponse{}, func(w io.Writer) {
		fmt.Fprintf(w, "yielded task %d\n", id)
	})
}

func runCancel(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	filter := bulkFlags(fs)
	pos, err := e.parse(cmd, fs, args, 0, 1)
	if err != nil {
		return err
	}
	id, done, err := e.idOrBulk(cmd, filter, pos, "cancel", nornv1.BulkActionRequest_ACTION_CANCEL)
	if done || err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	if err := c.Cancel(e.ctx, id); err != nil {
		return err
	}
	return e.emit(&nornv1.CancelResponse{}, func(w io.Writer) {
		fmt.Fprintf(w, "cancelled task %d\n", id)
	})
}

const retryHelp = `
The task is READY again (or DELAYED by its not-before time) with a fresh
budget of attempts; its claims, updates and errors stay. --life names the
life retried (the LIFE of nornctl get): run again, the command then
succeeds without retrying twice. A COMPLETED task is not retried.

  nornctl retry 153915228713648141
  nornctl retry 153915228713648141 --life 0

With --queue (and --status, --created-after, --created-before,
--error-contains) instead of an id, it retries every task that matches,
page by page, with progress on stderr; run again, it does nothing twice.

  nornctl retry --queue webhooks --status dead --error-contains 503`

func runRetry(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	life := fs.Int64("life", -1, "the life retried (nornctl get's LIFE); default: the task's current one")
	filter := bulkFlags(fs)
	pos, err := e.parse(cmd, fs, args, 0, 1)
	if err != nil {
		return err
	}
	id, done, err := e.idOrBulk(cmd, filter, pos, "retry", nornv1.BulkActionRequest_ACTION_RETRY)
	if done || err != nil {
		return err
	}
	if *life < -1 || *life > math.MaxUint32 {
		return usagef(cmd, "--life %d: out of the uint32 range", *life)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	if *life < 0 {
		t, err := c.GetTask(e.ctx, id)
		if err != nil {
			return err
		}
		*life = int64(t.GetLife())
	}
	now, err := c.Retry(e.ctx, id, uint32(*life))
	if err != nil {
		return err
	}
	return e.emit(&nornv1.RetryResponse{Life: now}, func(w io.Writer) {
		fmt.Fprintf(w, "task %d is in its life %d\n", id, now)
	})
}

func runStatus(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	if _, err := e.parse(cmd, fs, args, 0, 0); err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	st, err := c.Status(e.ctx)
	if err != nil {
		return err
	}
	return e.emit(st, func(w io.Writer) { writeStatus(w, st) })
}
