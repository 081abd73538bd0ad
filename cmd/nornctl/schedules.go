package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

const scheduleHelp = `
Schedules enqueue a task from a template at every tick of a cron
expression (read in --tz) or an interval; the cluster's meta leader runs
each tick once (docs/SCHEDULING.md):

  nornctl schedule create nightly --cron "0 3 * * *" --tz Europe/Paris --queue reports '{"kind":"nightly"}'
  nornctl schedule create heartbeat --every 30s --queue pings --overlap skip
  nornctl schedule list
  nornctl schedule get nightly
  nornctl schedule pause nightly          its ticks pass (caught up within --catch-up on resume)
  nornctl schedule resume nightly
  nornctl schedule trigger nightly        enqueue its task now, as an extra tick
  nornctl schedule update nightly --cron "0 4 * * *" --queue reports '{"kind":"nightly"}'
  nornctl schedule delete nightly         its tasks stay

create and update take the whole definition (update replaces it). The
tasks take the retry policy of --max-attempts, --backoff,
--backoff-multiplier, --max-backoff and --backoff-jitter (as enqueue's,
whose --jitter is named so here), else their queue's default (nornctl
queue set); the API's Schedule.template takes every TaskSpec field. -o json prints the
Schedule, or the ListSchedulesResponse.`

// scheduleFlags are the definition flags of create and update.
type scheduleFlags struct {
	cron, tz, queue, overlap, payloadFile *string
	every, jitter, catchUp                *time.Duration
	priority                              *int
	paused                                *bool
	retry                                 retryPolicyFlags
}

func newScheduleFlags(fs *flag.FlagSet) *scheduleFlags {
	return &scheduleFlags{
		cron:        fs.String("cron", "", `cron expression: minute hour day-of-month month day-of-week ("0 3 * * *"), or @hourly, @daily, @weekly, @monthly, @yearly`),
		tz:          fs.String("tz", "", "IANA time zone the cron expression is read in (default UTC)"),
		every:       fs.Duration("every", 0, "tick at this interval from the schedule's creation, instead of --cron (1s to 8784h)"),
		queue:       fs.String("queue", "", "the queue of each tick's task (required)"),
		priority:    fs.Int("priority", 0, "the priority of each tick's task"),
		payloadFile: fs.String("payload-file", "", "read the tasks' payload from this file (-: standard input)"),
		jitter:      fs.Duration("jitter", 0, "each tick's task is claimable from its tick plus up to this much (the same for a tick whatever the leader)"),
		overlap:     fs.String("overlap", "allow", "a tick while the last tick's task is not finished: allow (enqueue anyway) or skip"),
		catchUp:     fs.Duration("catch-up", 0, "ticks missed (no leader, paused) are run when at most this old, else skipped (default 1m, at most 168h)"),
		paused:      fs.Bool("paused", false, "store the schedule paused"),
		retry:       retryFlagsJitter(fs, "backoff-jitter"),
	}
}

// schedule returns the definition the flags and the payload give.
func (f *scheduleFlags) schedule(cmd *command, e *env, name string, payload []string) (*nornv1.Schedule, error) {
	if *f.priority < math.MinInt32 || *f.priority > math.MaxInt32 {
		return nil, usagef(cmd, "--priority %d: out of the int32 range", *f.priority)
	}
	s := &nornv1.Schedule{Name: name, Cron: *f.cron, TimeZone: *f.tz, Paused: *f.paused,
		Template: &nornv1.TaskSpec{Queue: *f.queue, Priority: int32(*f.priority)}}
	switch *f.overlap {
	case "allow":
		s.Overlap = nornv1.Schedule_OVERLAP_ALLOW
	case "skip":
		s.Overlap = nornv1.Schedule_OVERLAP_SKIP
	default:
		return nil, usagef(cmd, "--overlap %q: want allow or skip", *f.overlap)
	}
	for _, d := range []struct {
		v   time.Duration
		dst **durationpb.Duration
	}{{*f.every, &s.Interval}, {*f.jitter, &s.Jitter}, {*f.catchUp, &s.CatchUpWindow}} {
		if d.v != 0 {
			*d.dst = durationpb.New(d.v)
		}
	}
	var err error
	if s.Template.Retry, err = f.retry.policy(); err != nil {
		return nil, usagef(cmd, "%v", err)
	}
	if len(payload) == 1 && *f.payloadFile != "" {
		return nil, usagef(cmd, "give the payload as an argument or with --payload-file, not both")
	}
	arg := ""
	if len(payload) == 1 {
		arg = payload[0]
	}
	if s.Template.Payload, err = readPayload(arg, len(payload) == 1, *f.payloadFile, e.stdin); err != nil {
		return nil, err
	}
	return s, nil
}

func runSchedule(e *env, cmd *command, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return usagef(cmd, "want one of create, update, list, get, pause, resume, trigger, delete")
	}
	sub, args := args[0], args[1:]
	fs := e.flagSet(cmd)
	var def *scheduleFlags
	lo, hi := 1, 1
	switch sub {
	case "list":
		lo, hi = 0, 0
	case "create", "update":
		def = newScheduleFlags(fs)
		hi = 2
	case "get", "pause", "resume", "trigger", "delete":
	default:
		return usagef(cmd, "unknown schedule command %q: want one of create, update, list, get, pause, resume, trigger, delete", sub)
	}
	pos, err := e.parse(cmd, fs, args, lo, hi)
	if err != nil {
		return err
	}
	var s *nornv1.Schedule
	if def != nil {
		if s, err = def.schedule(cmd, e, pos[0], pos[1:]); err != nil {
			return err
		}
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	switch sub {
	case "list":
		all, err := c.ListSchedules(e.ctx)
		if err != nil {
			return err
		}
		return e.emit(&nornv1.ListSchedulesResponse{Schedules: all}, func(w io.Writer) { writeSchedules(w, all) })
	case "trigger":
		id, err := c.TriggerSchedule(e.ctx, pos[0])
		if err != nil {
			return err
		}
		return e.emit(&nornv1.TriggerScheduleResponse{TaskId: id}, func(w io.Writer) { fmt.Fprintln(w, id) })
	case "delete":
		if err := c.DeleteSchedule(e.ctx, pos[0]); err != nil {
			return err
		}
		return e.emit(&nornv1.DeleteScheduleResponse{}, func(w io.Writer) { fmt.Fprintf(w, "deleted %s\n", pos[0]) })
	case "create":
		s, err = c.CreateSchedule(e.ctx, s)
	case "update":
		s, err = c.UpdateSchedule(e.ctx, s)
	case "get":
		s, err = c.GetSchedule(e.ctx, pos[0])
	case "pause", "resume":
		s, err = c.PauseSchedule(e.ctx, pos[0], sub == "pause")
	}
	if err != nil {
		return err
	}
	return e.emit(s, func(w io.Writer) { writeSchedule(w, s) })
}

// when is a schedule's cron expression (with its zone) or interval.
func when(s *nornv1.Schedule) string {
	if s.GetInterval() != nil {
		return "every " + s.GetInterval().AsDuration().String()
	}
	tz := s.GetTimeZone()
	if tz == "" {
		tz = "UTC"
	}
	return fmt.Sprintf("%q %s", s.GetCron(), tz)
}

// writeSchedules prints one row per schedule.
func writeSchedules(w io.Writer, all []*nornv1.Schedule) {
	fmt.Fprintf(w, "NAME\tWHEN\tQUEUE\tPAUSED\tLAST TICK\tNEXT TICK\tLAST TASK\tSKIPPED\n")
	for _, s := range all {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", s.GetName(), when(s), s.GetTemplate().GetQueue(), yesNo(s.GetPaused()),
			orDash(s.GetLastTick() != nil, formatTS(s.GetLastTick())), orDash(s.GetNextTick() != nil, formatTS(s.GetNextTick())),
			s.GetLastTaskId(), s.GetSkippedTicks())
	}
}

// writeSchedule prints one schedule, a field per row.
func writeSchedule(w io.Writer, s *nornv1.Schedule) {
	fmt.Fprintf(w, "NAME:\t%s\n", s.GetName())
	fmt.Fprintf(w, "WHEN:\t%s\n", when(s))
	fmt.Fprintf(w, "QUEUE:\t%s\n", s.GetTemplate().GetQueue())
	fmt.Fprintf(w, "PAUSED:\t%s\n", yesNo(s.GetPaused()))
	fmt.Fprintf(w, "OVERLAP:\t%s\n", strings.ToLower(strings.TrimPrefix(s.GetOverlap().String(), "OVERLAP_")))
	fmt.Fprintf(w, "JITTER:\t%s\n", s.GetJitter().AsDuration())
	fmt.Fprintf(w, "CATCH UP:\t%s\n", s.GetCatchUpWindow().AsDuration())
	fmt.Fprintf(w, "CREATED:\t%s\n", formatTS(s.GetCreatedAt()))
	fmt.Fprintf(w, "LAST TICK:\t%s\n", orDash(s.GetLastTick() != nil, formatTS(s.GetLastTick())))
	fmt.Fprintf(w, "NEXT TICK:\t%s\n", orDash(s.GetNextTick() != nil, formatTS(s.GetNextTick())))
	fmt.Fprintf(w, "LAST TASK:\t%d\n", s.GetLastTaskId())
	fmt.Fprintf(w, "SKIPPED TICKS:\t%d\n", s.GetSkippedTicks())
}

func orDash(ok bool, v string) string {
	if !ok {
		return "-"
	}
	return v
}
