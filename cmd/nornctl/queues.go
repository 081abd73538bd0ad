package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// retryPolicyFlags are the flags of a task retry policy (enqueue, queue
// set).
type retryPolicyFlags struct {
	maxAttempts             *uint
	backoff, maxBackoff     *time.Duration
	multiplier, jitterShare *float64
}

func retryFlags(fs *flag.FlagSet) retryPolicyFlags { return retryFlagsJitter(fs, "jitter") }

// retryFlagsJitter is retryFlags with the jitter share's flag named
// jitter (a schedule's --jitter is its ticks').
func retryFlagsJitter(fs *flag.FlagSet, jitter string) retryPolicyFlags {
	return retryPolicyFlags{
		maxAttempts: fs.Uint("max-attempts", 0, "retry policy: failed attempts after which the task is DEAD (0: unlimited)"),
		backoff:     fs.Duration("backoff", 0, "retry policy: the wait after the first failed attempt"),
		maxBackoff:  fs.Duration("max-backoff", 0, "retry policy: the longest wait (default: --backoff)"),
		multiplier:  fs.Float64("backoff-multiplier", 0, "retry policy: each wait's growth over the last, 1 to 100 (default 1)"),
		jitterShare: fs.Float64(jitter, 0, "retry policy: the largest share of a wait taken off it, 0 to 1"),
	}
}

// policy is the policy the flags give, nil when none was set. The server
// checks it and names the field it refuses.
func (f retryPolicyFlags) policy() (*nornv1.RetryPolicy, error) {
	if *f.maxAttempts == 0 && *f.backoff == 0 && *f.maxBackoff == 0 && *f.multiplier == 0 && *f.jitterShare == 0 {
		return nil, nil
	}
	if *f.maxAttempts > math.MaxUint32 {
		return nil, errors.New("--max-attempts: out of the uint32 range")
	}
	p := &nornv1.RetryPolicy{MaxAttempts: uint32(*f.maxAttempts), Multiplier: *f.multiplier, Jitter: *f.jitterShare}
	if *f.backoff != 0 {
		p.InitialBackoff = durationpb.New(*f.backoff)
	}
	if *f.maxBackoff != 0 {
		p.MaxBackoff = durationpb.New(*f.maxBackoff)
	}
	return p, nil
}

const queueHelp = `
Queues exist once they hold tasks or settings. Settings live in the
cluster's meta group and every node keeps them across restarts
(docs/JOBQUEUE.md, "Queues"):

  nornctl queue list                  every queue, its settings and tasks by status
  nornctl queue get emails            one queue
  nornctl queue pause emails          claims get nothing (long polls wait); enqueues go on
  nornctl queue resume emails
  nornctl queue set emails --default-lease 2m --max-attempts 5 --backoff 10s --backoff-multiplier 2
  nornctl queue set emails --max-claimed 20 --claim-rate 50   at most 20 held at once, 50 claims a second
  nornctl queue set emails --retention 48h   keep its finished tasks 2 days (1h to 366 days)
  nornctl queue set emails --clear default_retry,default_lease,max_claimed

A change answers once every live node applies it; nodes that had not
are named (they apply it from gossip). -o json prints the Queue, the
ListQueuesResponse or the SetQueueResponse.`

func runQueue(e *env, cmd *command, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return usagef(cmd, "want one of list, get, pause, resume, set")
	}
	sub, args := args[0], args[1:]
	fs := e.flagSet(cmd)
	var retry retryPolicyFlags
	var lease *time.Duration
	var clear *string
	var maxClaimed *uint
	var rate *float64
	var retention *time.Duration
	if sub == "set" {
		retry = retryFlags(fs)
		lease = fs.Duration("default-lease", 0, "the lease of a claim that names none")
		maxClaimed = fs.Uint("max-claimed", 0, "the most tasks of the queue claimed at once, cluster wide (clear max_claimed for no cap)")
		rate = fs.Float64("claim-rate", 0, "the most claims granted per second, cluster wide (clear claim_rate for no limit)")
		retention = fs.Duration("retention", 0, "how long a finished task of the queue is kept, from an hour to 366 days (clear retention for the node's)")
		clear = fs.String("clear", "", "comma-separated settings back to their defaults: paused, default_retry, default_lease, max_claimed, claim_rate, retention")
	}
	want := 1
	switch sub {
	case "list":
		want = 0
	case "get", "pause", "resume", "set":
	default:
		return usagef(cmd, "unknown queue command %q: want one of list, get, pause, resume, set", sub)
	}
	pos, err := e.parse(cmd, fs, args, want, want)
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	req := &nornv1.SetQueueRequest{Settings: &nornv1.QueueSettings{}}
	switch sub {
	case "list":
		qs, err := c.ListQueues(e.ctx)
		if err != nil {
			return err
		}
		return e.emit(&nornv1.ListQueuesResponse{Queues: qs}, func(w io.Writer) { writeQueues(w, qs) })
	case "get":
		q, err := c.GetQueue(e.ctx, pos[0])
		if err != nil {
			return err
		}
		return e.emit(q, func(w io.Writer) { writeQueue(w, q) })
	case "pause":
		req.Settings.Paused = new(true)
	case "resume":
		req.Settings, req.Clear = nil, []string{"paused"}
	case "set":
		if req.Settings.DefaultRetry, err = retry.policy(); err != nil {
			return usagef(cmd, "%v", err)
		}
		if *lease != 0 {
			req.Settings.DefaultLease = durationpb.New(*lease)
		}
		if *maxClaimed > math.MaxUint32 {
			return usagef(cmd, "--max-claimed %d: out of the uint32 range", *maxClaimed)
		}
		if *maxClaimed != 0 {
			req.Settings.MaxClaimed = new(uint32(*maxClaimed))
		}
		if *rate != 0 {
			req.Settings.ClaimRate = rate
		}
		if *retention != 0 {
			req.Settings.Retention = durationpb.New(*retention)
		}
		if *clear != "" {
			req.Clear = strings.Split(*clear, ",")
		}
	}
	req.Queue = pos[0]
	resp, err := c.SetQueue(e.ctx, req)
	if err != nil {
		return err
	}
	return e.emit(resp, func(w io.Writer) {
		writeQueue(w, resp.GetQueue())
		if len(resp.GetPendingNodes()) > 0 {
			fmt.Fprintf(w, "NOT YET APPLIED ON\t%s (they apply it from gossip)\n", strings.Join(resp.GetPendingNodes(), ", "))
		}
	})
}

// writeQueues prints one row per queue.
func writeQueues(w io.Writer, qs []*nornv1.Queue) {
	fmt.Fprintf(w, "QUEUE\tPAUSED\tMAX CLAIMED\tREADY\tOLDEST READY\tDELAYED\tCLAIMED\tCOMPLETED\tDEAD\tABORTED\tCANCELLED\tTOTAL\n")
	for _, q := range qs {
		b := q.GetByStatus()
		maxClaimed := "-"
		if q.GetSettings().MaxClaimed != nil {
			maxClaimed = fmt.Sprint(q.GetSettings().GetMaxClaimed())
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", q.GetName(), yesNo(q.GetSettings().GetPaused()), maxClaimed,
			b["READY"], oldestReady(q), b["DELAYED"], b["CLAIMED"], b["COMPLETED"], b["DEAD"], b["ABORTED"], b["CANCELLED"], q.GetTotal())
	}
}

// writeQueue prints one queue, a field per row.
func writeQueue(w io.Writer, q *nornv1.Queue) {
	s := q.GetSettings()
	fmt.Fprintf(w, "QUEUE\t%s\n", q.GetName())
	fmt.Fprintf(w, "PAUSED\t%s\n", yesNo(s.GetPaused()))
	lease := "the node's"
	if d := s.GetDefaultLease(); d != nil {
		lease = d.AsDuration().String()
	}
	fmt.Fprintf(w, "DEFAULT LEASE\t%s\n", lease)
	retry := "the node's"
	if p := s.GetDefaultRetry(); p != nil {
		retry = formatRetry(p)
	}
	fmt.Fprintf(w, "DEFAULT RETRY\t%s\n", retry)
	limit := func(set bool, v string) string {
		if !set {
			return "none"
		}
		return v
	}
	fmt.Fprintf(w, "MAX CLAIMED\t%s\n", limit(s.MaxClaimed != nil, fmt.Sprint(s.GetMaxClaimed())))
	fmt.Fprintf(w, "CLAIM RATE\t%s\n", limit(s.ClaimRate != nil, fmt.Sprintf("%g/s", s.GetClaimRate())))
	retention := "the node's"
	if d := s.GetRetention(); d != nil {
		retention = d.AsDuration().String()
	}
	fmt.Fprintf(w, "RETENTION\t%s\n", retention)
	fmt.Fprintf(w, "SETTINGS VERSION\t%d\n", q.GetSettingsVersion())
	if q.GetOldestReadyId() != 0 {
		fmt.Fprintf(w, "OLDEST READY\t%s ago (task %d)\n", oldestReady(q), q.GetOldestReadyId())
	}
	for _, st := range sortedStatuses(q.GetByStatus()) {
		fmt.Fprintf(w, "%s\t%d\n", st, q.GetByStatus()[st])
	}
	fmt.Fprintf(w, "TOTAL\t%d\n", q.GetTotal())
}

// oldestReady is how long q's oldest ready task has waited, "-" for none.
func oldestReady(q *nornv1.Queue) string {
	if q.GetOldestReadyAge() == nil {
		return "-"
	}
	return q.GetOldestReadyAge().AsDuration().Round(time.Second).String()
}
