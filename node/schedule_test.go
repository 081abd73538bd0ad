package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cluster"
)

func (h *harness) createSchedule(s *nornv1.Schedule) *nornv1.Schedule {
	h.t.Helper()
	r, err := h.admin.CreateSchedule(context.Background(), connect.NewRequest(&nornv1.CreateScheduleRequest{Schedule: s}))
	if err != nil {
		h.t.Fatal(err)
	}
	return r.Msg.Schedule
}

func (h *harness) getSchedule(name string) *nornv1.Schedule {
	h.t.Helper()
	r, err := h.admin.GetSchedule(context.Background(), connect.NewRequest(&nornv1.GetScheduleRequest{Name: name}))
	if err != nil {
		h.t.Fatal(err)
	}
	return r.Msg.Schedule
}

// queueTasks lists every task of queue.
func (h *harness) queueTasks(queue string) []*nornv1.Task {
	h.t.Helper()
	r, err := h.api.ListTasks(context.Background(), connect.NewRequest(&nornv1.ListTasksRequest{Queue: queue, PageSize: 1000}))
	if err != nil {
		h.t.Fatal(err)
	}
	return r.Msg.Tasks
}

// An interval schedule enqueues one task per tick, with the id the
// schedule and the tick make and the tick as its creation time; a pass
// runs what is due and nothing twice; ticks older than the catch-up
// window are skipped and counted.
func TestScheduleInterval(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	sc := h.createSchedule(&nornv1.Schedule{Name: "tick", Interval: durationpb.New(10 * time.Second),
		Template: &nornv1.TaskSpec{Queue: "sched", Payload: []byte("p"), Priority: 3}})
	created := sc.CreatedAt.AsTime()
	if !sc.NextTick.AsTime().Equal(created.Add(10*time.Second)) || sc.CatchUpWindow.AsDuration() != time.Minute {
		t.Fatalf("created: %v", sc)
	}
	pass := h.node.server.RunSchedulesOnce
	pass()
	if n := len(h.queueTasks("sched")); n != 0 {
		t.Fatalf("%d tasks before the first tick", n)
	}
	h.clock.advance(10 * time.Second)
	pass()
	pass()
	tasks := h.queueTasks("sched")
	if len(tasks) != 1 {
		t.Fatalf("%d tasks after one tick and two passes", len(tasks))
	}
	tick := created.Add(10 * time.Second)
	if want := cluster.ScheduleTaskID(0, tick.UnixMilli()); tasks[0].Id != want || !tasks[0].CreatedAt.AsTime().Equal(tick) ||
		tasks[0].Spec.Priority != 3 || string(tasks[0].Spec.Payload) != "p" || tasks[0].Status != nornv1.TaskStatus_TASK_STATUS_READY {
		t.Fatalf("the tick's task: %v (want id %d, created %v)", tasks[0], want, tick)
	}
	if got := h.getSchedule("tick"); got.LastTaskId != tasks[0].Id || !got.LastTick.AsTime().Equal(tick) || !got.NextTick.AsTime().Equal(tick.Add(10*time.Second)) {
		t.Fatalf("after the tick: %v", got)
	}
	// Three ticks late: all three run, in one pass.
	h.clock.advance(35 * time.Second)
	pass()
	if n := len(h.queueTasks("sched")); n != 4 {
		t.Fatalf("%d tasks after four ticks", n)
	}
	// Five minutes without a pass: the ticks older than the minute's
	// window are skipped.
	h.clock.advance(5 * time.Minute)
	pass()
	got := h.getSchedule("tick")
	ran := len(h.queueTasks("sched")) - 4
	if ran < 5 || ran > 7 || got.SkippedTicks+uint64(ran) != 30 {
		t.Fatalf("after 5 min: %d ticks ran, %d skipped; want the last minute's (6) run and the rest of 30 skipped", ran, got.SkippedTicks)
	}
}

// Pausing stops the ticks; resuming catches up within the window. A
// trigger enqueues at once, paused or not. Delete removes the schedule,
// not its tasks.
func TestSchedulePauseTriggerDelete(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	h.createSchedule(&nornv1.Schedule{Name: "s", Interval: durationpb.New(10 * time.Second), Template: &nornv1.TaskSpec{Queue: "q"}})
	pause := func(p bool) {
		if _, err := h.admin.PauseSchedule(ctx, connect.NewRequest(&nornv1.PauseScheduleRequest{Name: "s", Paused: p})); err != nil {
			t.Fatal(err)
		}
	}
	pause(true)
	h.clock.advance(35 * time.Second)
	h.node.server.RunSchedulesOnce()
	if n := len(h.queueTasks("q")); n != 0 || !h.getSchedule("s").Paused {
		t.Fatalf("paused: %d tasks", n)
	}
	tr, err := h.admin.TriggerSchedule(ctx, connect.NewRequest(&nornv1.TriggerScheduleRequest{Name: "s"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := h.get(tr.Msg.TaskId); got.Spec.Queue != "q" {
		t.Fatalf("the triggered task: %v", got)
	}
	pause(false)
	h.node.server.RunSchedulesOnce()
	if n := len(h.queueTasks("q")); n != 4 {
		t.Fatalf("resumed: %d tasks, want the trigger's and the 3 paused ticks'", n)
	}
	if _, err := h.admin.DeleteSchedule(ctx, connect.NewRequest(&nornv1.DeleteScheduleRequest{Name: "s"})); err != nil {
		t.Fatal(err)
	}
	_, err = h.admin.GetSchedule(ctx, connect.NewRequest(&nornv1.GetScheduleRequest{Name: "s"}))
	wantCode(t, err, connect.CodeNotFound)
	h.clock.advance(time.Minute)
	h.node.server.RunSchedulesOnce()
	if n := len(h.queueTasks("q")); n != 4 {
		t.Fatalf("after the delete: %d tasks", n)
	}
	l, err := h.admin.ListSchedules(ctx, connect.NewRequest(&nornv1.ListSchedulesRequest{}))
	if err != nil || len(l.Msg.Schedules) != 0 {
		t.Fatalf("list after the delete: %v, %v", l, err)
	}
}

// With overlap skip a tick passes while the last tick's task is not
// finished.
func TestScheduleOverlapSkip(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	h.createSchedule(&nornv1.Schedule{Name: "s", Interval: durationpb.New(10 * time.Second), Overlap: nornv1.Schedule_OVERLAP_SKIP,
		Template: &nornv1.TaskSpec{Queue: "q"}})
	h.clock.advance(10 * time.Second)
	h.node.server.RunSchedulesOnce()
	c := h.claim("q", 1, time.Hour)
	h.clock.advance(10 * time.Second)
	h.node.server.RunSchedulesOnce()
	if n := len(h.queueTasks("q")); n != 1 || h.getSchedule("s").SkippedTicks != 1 {
		t.Fatalf("a tick while the last task runs: %d tasks, %d skipped", n, h.getSchedule("s").SkippedTicks)
	}
	h.complete(c[0].Task.Id, c[0].ClaimId)
	h.clock.advance(10 * time.Second)
	h.node.server.RunSchedulesOnce()
	if n := len(h.queueTasks("q")); n != 2 {
		t.Fatalf("a tick after the last task completed: %d tasks", n)
	}
}

// A cron schedule ticks at the expression's times in its time zone, and
// its tasks are claimable from the tick plus their jitter.
func TestScheduleCron(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{t: time.Date(2026, 7, 1, 8, 58, 0, 0, paris)}
	h := newHarness(t, t.TempDir(), clock)
	sc := h.createSchedule(&nornv1.Schedule{Name: "nine", Cron: "0 9 * * *", TimeZone: "Europe/Paris", Jitter: durationpb.New(time.Minute),
		Template: &nornv1.TaskSpec{Queue: "q"}})
	nine := time.Date(2026, 7, 1, 9, 0, 0, 0, paris)
	if !sc.NextTick.AsTime().Equal(nine) {
		t.Fatalf("next tick %v, want %v", sc.NextTick.AsTime(), nine)
	}
	h.clock.advance(2 * time.Minute)
	h.node.server.RunSchedulesOnce()
	tasks := h.queueTasks("q")
	if len(tasks) != 1 {
		t.Fatalf("%d tasks at nine", len(tasks))
	}
	nb := tasks[0].Spec.GetNotBefore()
	if nb != nil && (nb.AsTime().Before(nine) || nb.AsTime().After(nine.Add(time.Minute))) {
		t.Fatalf("not before %v: not within the jitter after nine", nb.AsTime())
	}
	if next := h.getSchedule("nine").NextTick.AsTime(); !next.Equal(nine.AddDate(0, 0, 1)) {
		t.Fatalf("next tick %v", next)
	}
}

func TestScheduleBadInput(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	tmpl := &nornv1.TaskSpec{Queue: "q"}
	every := durationpb.New(time.Minute)
	for _, c := range []struct {
		s     *nornv1.Schedule
		field string
	}{
		{&nornv1.Schedule{Name: "bad name", Interval: every, Template: tmpl}, "schedule.name"},
		{&nornv1.Schedule{Name: "s", Template: tmpl}, "schedule.cron"},
		{&nornv1.Schedule{Name: "s", Cron: "@daily", Interval: every, Template: tmpl}, "schedule.interval"},
		{&nornv1.Schedule{Name: "s", Cron: "61 * * * *", Template: tmpl}, "schedule.cron"},
		{&nornv1.Schedule{Name: "s", Cron: "@every 1m", Template: tmpl}, "schedule.cron"},
		{&nornv1.Schedule{Name: "s", Cron: "CRON_TZ=UTC 0 * * * *", Template: tmpl}, "schedule.cron"},
		{&nornv1.Schedule{Name: "s", Cron: "@hourly", TimeZone: "Mars/Olympus", Template: tmpl}, "schedule.timeZone"},
		{&nornv1.Schedule{Name: "s", Interval: every, TimeZone: "UTC", Template: tmpl}, "schedule.timeZone"},
		{&nornv1.Schedule{Name: "s", Interval: durationpb.New(time.Second / 2), Template: tmpl}, "schedule.interval"},
		{&nornv1.Schedule{Name: "s", Interval: every, Jitter: durationpb.New(2 * time.Minute), Template: tmpl}, "schedule.jitter"},
		{&nornv1.Schedule{Name: "s", Interval: every, CatchUpWindow: durationpb.New(8 * 24 * time.Hour), Template: tmpl}, "schedule.catchUpWindow"},
		{&nornv1.Schedule{Name: "s", Interval: every}, "schedule.template"},
		{&nornv1.Schedule{Name: "s", Interval: every, Template: &nornv1.TaskSpec{}}, "schedule.template.queue"},
		{&nornv1.Schedule{Name: "s", Interval: every, Template: &nornv1.TaskSpec{Queue: "q", NotBefore: timestamppb.Now()}}, "schedule.template.notBefore"},
		{&nornv1.Schedule{Name: "s", Interval: every, Template: &nornv1.TaskSpec{Queue: "q", UniqueKey: "k"}}, "schedule.template.uniqueKey"},
	} {
		_, err := h.admin.CreateSchedule(ctx, connect.NewRequest(&nornv1.CreateScheduleRequest{Schedule: c.s}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%v: %v, want INVALID_ARGUMENT naming %s", c.s, err, c.field)
		}
	}
	h.createSchedule(&nornv1.Schedule{Name: "s", Interval: every, Template: tmpl})
	_, err := h.admin.CreateSchedule(ctx, connect.NewRequest(&nornv1.CreateScheduleRequest{Schedule: &nornv1.Schedule{Name: "s", Interval: every, Template: tmpl}}))
	wantCode(t, err, connect.CodeAlreadyExists)
	_, err = h.admin.UpdateSchedule(ctx, connect.NewRequest(&nornv1.UpdateScheduleRequest{Schedule: &nornv1.Schedule{Name: "none", Interval: every, Template: tmpl}}))
	wantCode(t, err, connect.CodeNotFound)
	up, err := h.admin.UpdateSchedule(ctx, connect.NewRequest(&nornv1.UpdateScheduleRequest{Schedule: &nornv1.Schedule{Name: "s", Cron: "@hourly", Template: tmpl}}))
	if err != nil || up.Msg.Schedule.Cron != "@hourly" || up.Msg.Schedule.Interval != nil {
		t.Fatalf("update: %v, %v", up, err)
	}
}
