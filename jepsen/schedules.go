package jepsen

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/jepsen/check"
)

// The schedules scenario (issue 44, session 29): before the workload, a
// schedule that ticks every second enqueues a task into a queue of its
// own; the nemesis kills and cuts off the meta group's leader, which
// runs the ticks, again and again. After the heal the schedule is paused
// and every task of its queue listed (from every node): check.Schedule
// wants one task per tick from the schedule's creation to its last
// recorded tick, none twice (the test hooks hold each tick's record half
// a second after its write, so that a leader lost in between leaves the
// next leader the tick to write again), missing ones only as many as the
// schedule says it skipped.

const (
	scheduleName   = "jepsen-beat"
	scheduledQueue = "jepsen-scheduled"
	scheduleEvery  = time.Second
	// scheduleCatchUp is the schedule's catch-up window: longer than any
	// meta leader outage of the run, so that no tick is skipped.
	scheduleCatchUp = 2 * time.Minute
)

// scheduleRun is the schedule's side of the run.
type scheduleRun struct {
	w       *Workload
	created time.Time // the schedule's creation, as the meta leader read it
}

// create makes the schedule, through any node that answers.
func (r *scheduleRun) create(ctx context.Context) error {
	s := &nornv1.Schedule{Name: scheduleName, Interval: durationpb.New(scheduleEvery), CatchUpWindow: durationpb.New(scheduleCatchUp),
		Template: &nornv1.TaskSpec{Queue: scheduledQueue, Payload: []byte("beat")}}
	return r.adminCall(ctx, "create the schedule", func(ctx context.Context, n *Node) error {
		_, err := n.Admin.CreateSchedule(ctx, connect.NewRequest(&nornv1.CreateScheduleRequest{Schedule: s}))
		if err != nil && connect.CodeOf(err) != connect.CodeAlreadyExists { // else an earlier attempt made it
			return err
		}
		resp, err := n.Admin.GetSchedule(ctx, connect.NewRequest(&nornv1.GetScheduleRequest{Name: scheduleName}))
		if err == nil {
			r.created = resp.Msg.Schedule.GetCreatedAt().AsTime()
		}
		return err
	})
}

// adminCall runs call on the active nodes in turn until one succeeds or
// 30 s pass.
func (r *scheduleRun) adminCall(ctx context.Context, what string, call func(context.Context, *Node) error) error {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for i := 0; time.Now().Before(deadline); i++ {
		a := r.w.C.Active()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		last = call(cctx, a[i%len(a)])
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("jepsen: %s: %w", what, last)
}

// final pauses the schedule, waits for a tick under way to be recorded,
// reads the schedule and lists its queue on every node, and judges them.
func (r *scheduleRun) final(ctx context.Context) check.Verdict {
	v := check.Verdict{Checker: "schedule"}
	err := r.adminCall(ctx, "pause the schedule", func(ctx context.Context, n *Node) error {
		_, err := n.Admin.PauseSchedule(ctx, connect.NewRequest(&nornv1.PauseScheduleRequest{Name: scheduleName, Paused: true}))
		return err
	})
	if err != nil {
		v.Addf("%v", err)
		return v
	}
	sleep(ctx, 2*time.Second) // a tick under way: written, then recorded
	var sc *nornv1.Schedule
	err = r.adminCall(ctx, "read the schedule", func(ctx context.Context, n *Node) error {
		resp, err := n.Admin.GetSchedule(ctx, connect.NewRequest(&nornv1.GetScheduleRequest{Name: scheduleName}))
		if err == nil {
			sc = resp.Msg.Schedule
		}
		return err
	})
	if err != nil {
		v.Addf("%v", err)
		return v
	}
	var ticks []int64
	created, every := sc.GetCreatedAt().AsTime().UnixMilli(), scheduleEvery.Milliseconds()
	if sc.GetLastTick() != nil {
		for t := created + every; t <= sc.GetLastTick().AsTime().UnixMilli(); t += every {
			ticks = append(ticks, t)
		}
	}
	seen := map[uint64]check.ScheduledTask{}
	for _, n := range r.w.C.Active() {
		for tok, pages := "", 0; pages < 10_000; pages++ {
			resp, err := n.Tasks.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{Queue: scheduledQueue, PageSize: 1000, PageToken: tok}))
			if err != nil {
				v.Addf("listing the queue on %s: %v", n.ID, err)
				return v
			}
			for _, t := range resp.Msg.Tasks {
				seen[t.Id] = check.ScheduledTask{ID: t.Id, CreatedMs: t.GetCreatedAt().AsTime().UnixMilli()}
			}
			if tok = resp.Msg.NextPageToken; tok == "" {
				break
			}
		}
	}
	tasks := make([]check.ScheduledTask, 0, len(seen))
	for _, t := range seen {
		tasks = append(tasks, t)
	}
	return check.Schedule(ticks, tasks, sc.GetSkippedTicks())
}

// nemesisMetaLeaderChurn kills the meta group's leader (even rounds) or
// cuts it off from the others (odd rounds) for 2-4 s, every 3-5 s, each
// time 300 ms after a tick of the run's schedule: after the leader wrote
// the tick's task, before it records the tick (the test hooks hold the
// record 500 ms), so that the next leader runs the tick again.
func nemesisMetaLeaderChurn(ctx context.Context, e *Env) {
	for round := 0; sleep(ctx, e.between(3*time.Second, 5*time.Second)); round++ {
		if !e.ScheduleCreated.IsZero() {
			since := time.Since(e.ScheduleCreated) % scheduleEvery
			if !sleep(ctx, (scheduleEvery+300*time.Millisecond-since)%scheduleEvery) {
				return
			}
		}
		n := e.C.MetaLeader()
		if n == nil {
			n = e.randomNode()
		}
		hold := e.between(2*time.Second, 4*time.Second)
		if round%2 == 0 {
			e.killFor(ctx, n, hold, "kill-meta-leader", n.ID)
		} else {
			e.isolate(ctx, n, hold, "isolate-meta-leader")
		}
	}
}
