package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/testhooks"
)

// The scheduler: the meta group's leader runs each schedule's ticks. A
// pass takes, per schedule not paused, the ticks due since the last one
// run: those older than the catch-up window are skipped, the others run
// oldest first, at most maxTicksPerPass; each writes its task with the id
// cluster.ScheduleTaskID gives the tick (W a majority), then the group
// records the tick (cluster.ScheduleRan). A leader that dies between the
// two leaves the tick to the next, which writes the same id and the same
// spec again: the CRDT merges them into one task.

// maxTicksPerPass bounds the ticks one schedule runs in a pass (the rest
// wait for the next).
const maxTicksPerPass = 100

// maxTickScan bounds how many cron ticks a pass counts when it skips
// (a week of minutes is 10,080).
const maxTickScan = 100_000

// lastRun is when sc last ran a tick, or its creation.
func lastRun(sc *cluster.Schedule) int64 { return max(sc.LastTickMs, sc.CreatedMs) }

// nextTick returns sc's first tick after afterMs.
func nextTick(sc *cluster.Schedule, afterMs int64) (int64, error) {
	if sc.IntervalMs > 0 {
		k := (afterMs-sc.CreatedMs)/sc.IntervalMs + 1
		if afterMs < sc.CreatedMs {
			k = 1
		}
		return sc.CreatedMs + k*sc.IntervalMs, nil
	}
	c, err := parseCron(sc.Cron)
	if err != nil {
		return 0, err
	}
	loc, err := time.LoadLocation(sc.TimeZone)
	if err != nil {
		return 0, err
	}
	next := c.Next(time.UnixMilli(afterMs).In(loc))
	if next.IsZero() {
		return 0, errors.New("the cron expression has no later time")
	}
	return next.UnixMilli(), nil
}

// RunSchedulesOnce does one pass, on the meta group's leader (the node
// runs it every node.Config.SchedulePass).
func (sv *Server) RunSchedulesOnce() {
	meta := sv.host.Meta()
	if meta == nil || !meta.IsLeader() || meta.LeaderReady(replicas.ProposeTimeout) != nil {
		return
	}
	tab := meta.Schedules()
	for _, name := range tab.Names() {
		sc := tab.Get(name)
		if sc.Paused {
			continue
		}
		if err := sv.runTicks(meta, sc); err != nil {
			sv.cfg.Logger.Info("schedule's ticks not run yet; the next pass tries again", "schedule", name, "err", err)
		}
	}
}

// runTicks runs sc's due ticks.
func (sv *Server) runTicks(meta *cluster.Meta, sc *cluster.Schedule) error {
	nowMs := sv.cfg.Clock.Now().UnixMilli()
	next, err := nextTick(sc, lastRun(sc))
	if err != nil || next > nowMs {
		return err
	}
	// Skip what is older than the catch-up window.
	var skipped uint64
	lastSkipped := int64(0)
	for n := 0; next < nowMs-sc.CatchUpMs && n < maxTickScan; n++ {
		skipped++
		lastSkipped = next
		if next, err = nextTick(sc, next); err != nil {
			return err
		}
	}
	if skipped > 0 && (next > nowMs || next < nowMs-sc.CatchUpMs) {
		_, err := meta.ProposeSchedule(&cluster.ScheduleCommand{Op: cluster.ScheduleRan, Name: sc.Name, TickMs: lastSkipped, Skipped: skipped}, replicas.ProposeTimeout)
		return err
	}
	lastTask := sc.LastTaskID
	for n := 0; next <= nowMs && n < maxTicksPerPass; n++ {
		ran := &cluster.ScheduleCommand{Op: cluster.ScheduleRan, Name: sc.Name, TickMs: next, Skipped: skipped}
		skipped = 0
		busy, err := sv.stillRunning(sc, lastTask)
		if err != nil {
			return err
		}
		if busy {
			ran.Skipped++
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), sv.cfg.WriteTimeout)
			id, err := sv.enqueueTick(ctx, sc, next, true)
			cancel()
			if err != nil {
				return err
			}
			ran.TaskID, lastTask = id, id
		}
		sv.scheduleRanDelay()
		if _, err := meta.ProposeSchedule(ran, replicas.ProposeTimeout); err != nil {
			return err
		}
		if next, err = nextTick(sc, next); err != nil {
			return err
		}
	}
	return nil
}

// stillRunning reports whether sc skips its next tick for its last task
// (id, 0 for none): with the overlap policy skip, while that task is not
// finished.
func (sv *Server) stillRunning(sc *cluster.Schedule, id uint64) (bool, error) {
	if !sc.OverlapSkip || id == 0 {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), sv.cfg.WriteTimeout)
	defer cancel()
	ts, err := sv.coord.Read(ctx, id, 0)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return false, nil // deleted by retention long ago
	case err != nil:
		return false, err
	}
	ev, finished := ts.Task.Terminal()
	return !finished || ev.Life != ts.Life(), nil
}

// enqueueTick writes the task of sc's tick at tickMs and returns its id:
// the tick's (cluster.ScheduleTaskID), its spec the template's with the
// tick as its creation time and, for a tick (not a trigger), claimable
// from the tick plus its jitter; a pure function of the schedule and the
// tick, so that a second leader writing the tick writes the same task.
func (sv *Server) enqueueTick(ctx context.Context, sc *cluster.Schedule, tickMs int64, tick bool) (uint64, error) {
	t := &nornv1.TaskSpec{}
	if err := proto.Unmarshal(sc.Template, t); err != nil {
		return 0, connect.NewError(connect.CodeDataLoss, fmt.Errorf("schedule %q: template: %w", sc.Name, err))
	}
	spec, err := sv.specFromAPI("template", t, false)
	if err != nil {
		return 0, err
	}
	sv.queueDefaults(spec)
	spec.CreatedAt = crdt.Timestamp{WallMs: tickMs}
	if tick && sc.JitterMs > 0 {
		spec.NotBeforeMs = tickMs + tickJitter(sc.Name, tickMs, sc.JitterMs)
	}
	id := cluster.ScheduleTaskID(sc.Slot, tickMs)
	if testhooks.Built && sv.cfg.ScheduleRandomID {
		// The seeded bug: a fresh id per write of a tick.
		if id, err = sv.ids.NextID(); err != nil {
			return 0, connect.NewError(connect.CodeInternal, err)
		}
	}
	_, err = sv.coord.Write(ctx, []*crdt.Task{{ID: id, Spec: spec}}, 0, []uint64{id})
	if connect.CodeOf(err) == connect.CodeAlreadyExists {
		// Written before under another definition (the schedule was
		// updated between a leader's write and its record): the tick has
		// its task.
		return id, nil
	}
	if err != nil {
		return 0, err
	}
	sv.events.Enqueued(spec.Queue, 1)
	return id, nil
}

// tickJitter is how long after its tick a tick's task is claimable: a
// share of jitterMs that depends on the schedule and the tick alone.
func tickJitter(name string, tickMs, jitterMs int64) int64 {
	d := xxhash.New()
	d.WriteString(name)
	d.Write(binary.BigEndian.AppendUint64(nil, uint64(tickMs)))
	return int64(d.Sum64() % uint64(jitterMs+1))
}

// scheduleRanDelay waits Config.ScheduleRanDelay (a test hook) between
// a tick's write and its record.
func (sv *Server) scheduleRanDelay() {
	if testhooks.Built && sv.cfg.ScheduleRanDelay > 0 {
		time.Sleep(sv.cfg.ScheduleRanDelay)
	}
}
