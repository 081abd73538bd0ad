package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/robfig/cron/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/rebalance"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/transport"
)

// Schedules (docs/SCHEDULING.md, "Schedules"): AdminService's schedule
// calls run on the meta group's leader (rebalance.ToMetaLeader), which
// keeps the table (cluster.Schedules) and runs the ticks (scheduler.go).

// Bounds of a schedule's durations.
const (
	minScheduleInterval = time.Second
	maxScheduleInterval = 366 * 24 * time.Hour
	defaultCatchUp      = time.Minute
	maxCatchUp          = 7 * 24 * time.Hour
	// maxCronJitter bounds the jitter of a cron schedule (an interval's
	// is bounded by its interval).
	maxCronJitter = time.Hour
)

// cronParser reads five-field cron expressions and the descriptors
// (@hourly ...), as Kubernetes' CronJob does (robfig/cron/v3).
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// scheduleDefFromAPI validates s (at field) and converts it.
func (sv *Server) scheduleDefFromAPI(field string, s *nornv1.Schedule) (*cluster.ScheduleDef, error) {
	if s == nil {
		return nil, apierr.Invalid(field, "required")
	}
	if err := crdt.ValidateQueue(field+".name", s.GetName()); err != nil {
		return nil, apierr.From(err)
	}
	def := &cluster.ScheduleDef{Name: s.GetName(), Cron: strings.TrimSpace(s.GetCron()), TimeZone: s.GetTimeZone(),
		Paused: s.GetPaused(), OverlapSkip: s.GetOverlap() == nornv1.Schedule_OVERLAP_SKIP}
	switch {
	case def.Cron == "" && s.GetInterval() == nil:
		return nil, apierr.Invalid(field+".cron", "one of cron and interval is required")
	case def.Cron != "" && s.GetInterval() != nil:
		return nil, apierr.Invalid(field+".interval", "not with cron: a schedule has one of them")
	case def.Cron != "":
		if _, err := parseCron(def.Cron); err != nil {
			return nil, apierr.Invalid(field+".cron", "%v", err)
		}
		if _, err := time.LoadLocation(def.TimeZone); err != nil {
			return nil, apierr.Invalid(field+".timeZone", "%v", err)
		}
	default:
		if def.TimeZone != "" {
			return nil, apierr.Invalid(field+".timeZone", "only with cron: an interval counts from the schedule's creation")
		}
		d, err := durationArg(field+".interval", s.GetInterval(), minScheduleInterval, maxScheduleInterval)
		if err != nil {
			return nil, err
		}
		def.IntervalMs = d.Milliseconds()
	}
	maxJitter := maxCronJitter
	if def.IntervalMs != 0 {
		maxJitter = time.Duration(def.IntervalMs) * time.Millisecond
	}
	if j := s.GetJitter(); j != nil {
		d, err := durationArg(field+".jitter", j, 0, maxJitter)
		if err != nil {
			return nil, err
		}
		def.JitterMs = d.Milliseconds()
	}
	def.CatchUpMs = defaultCatchUp.Milliseconds()
	if c := s.GetCatchUpWindow(); c != nil {
		d, err := durationArg(field+".catchUpWindow", c, 0, maxCatchUp)
		if err != nil {
			return nil, err
		}
		if d > 0 {
			def.CatchUpMs = d.Milliseconds()
		}
	}
	t := s.GetTemplate()
	tf := field + ".template"
	if _, err := sv.specFromAPI(tf, t, false); err != nil {
		return nil, err
	}
	switch {
	case t.GetNotBefore() != nil:
		return nil, apierr.Invalid(tf+".notBefore", "must be unset: each tick's task is claimable from its tick (and jitter)")
	case t.GetDeadline() != nil:
		return nil, apierr.Invalid(tf+".deadline", "must be unset: a template's time would be past for every later tick")
	case len(t.GetDependsOn()) > 0:
		return nil, apierr.Invalid(tf+".dependsOn", "must be empty: each tick's task stands alone")
	case t.GetUniqueKey() != "":
		return nil, apierr.Invalid(tf+".uniqueKey", "must be empty: each tick's task has its own id (overlap says what a tick does while the last one runs)")
	}
	b, err := proto.Marshal(t)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	def.Template = b
	return def, nil
}

// parseCron reads a cron expression; the time zone is its own field, and
// @every is an interval's.
func parseCron(expr string) (cron.Schedule, error) {
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, errors.New("a time zone prefix is not taken: set timeZone")
	}
	if strings.HasPrefix(expr, "@every") {
		return nil, errors.New("@every is not taken: set interval")
	}
	return cronParser.Parse(expr)
}

// durationArg validates a Duration at field: from lo to hi.
func durationArg(field string, d *durationpb.Duration, lo, hi time.Duration) (time.Duration, error) {
	if err := d.CheckValid(); err != nil {
		return 0, apierr.Invalid(field, "%v", err)
	}
	v := d.AsDuration()
	if v < lo || v > hi {
		return 0, apierr.Invalid(field, "must be %s to %s, got %s", lo, hi, v)
	}
	return v, nil
}

// schedulesGate refuses schedules while a ring member has not said it
// applies them (cluster.FeatureSchedules): a meta replica of an older
// build would refuse the table's entries and lose it as leader.
func (sv *Server) schedulesGate(field string) error {
	return sv.featureGate(field, cluster.FeatureSchedules, "schedules")
}

// scheduleToAPI renders sc.
func scheduleToAPI(sc *cluster.Schedule) *nornv1.Schedule {
	s := &nornv1.Schedule{Name: sc.Name, Cron: sc.Cron, TimeZone: sc.TimeZone, Paused: sc.Paused,
		Overlap: nornv1.Schedule_OVERLAP_ALLOW, CatchUpWindow: durationpb.New(time.Duration(sc.CatchUpMs) * time.Millisecond),
		CreatedAt: timestamppb.New(time.UnixMilli(sc.CreatedMs)), LastTaskId: sc.LastTaskID, SkippedTicks: sc.Skipped}
	if sc.OverlapSkip {
		s.Overlap = nornv1.Schedule_OVERLAP_SKIP
	}
	if sc.IntervalMs != 0 {
		s.Interval = durationpb.New(time.Duration(sc.IntervalMs) * time.Millisecond)
	}
	if sc.JitterMs != 0 {
		s.Jitter = durationpb.New(time.Duration(sc.JitterMs) * time.Millisecond)
	}
	t := &nornv1.TaskSpec{}
	if proto.Unmarshal(sc.Template, t) == nil {
		s.Template = t
	}
	if sc.LastTickMs != 0 {
		s.LastTick = timestamppb.New(time.UnixMilli(sc.LastTickMs))
	}
	if next, err := nextTick(sc, lastRun(sc)); err == nil {
		s.NextTick = timestamppb.New(time.UnixMilli(next))
	}
	return s
}

// onMetaLeader runs local on the meta group's leader, once it has
// applied every entry before its term (cluster.Meta.LeaderReady).
func onMetaLeader[Req, Resp any](sv *Server, ctx context.Context, req *connect.Request[Req],
	call func(*transport.Peer) func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
	local func(*Req, *cluster.Meta) (*Resp, error)) (*connect.Response[Resp], error) {
	return rebalance.ToMetaLeader(sv.rebalance, ctx, req, call, func(m *Req) (*Resp, error) {
		meta := sv.host.Meta()
		if err := meta.LeaderReady(replicas.ProposeTimeout); err != nil {
			return nil, connect.NewError(connect.CodeUnavailable, err)
		}
		return local(m, meta)
	})
}

// proposeSchedule proposes c and returns the schedule after it (nil
// when deleted), with the table errors as API codes.
func proposeSchedule(meta *cluster.Meta, c *cluster.ScheduleCommand) (*nornv1.Schedule, error) {
	if _, err := meta.ProposeSchedule(c, replicas.ProposeTimeout); err != nil {
		switch {
		case errors.Is(err, cluster.ErrScheduleExists):
			return nil, connect.NewError(connect.CodeAlreadyExists, err)
		case errors.Is(err, cluster.ErrNoSchedule):
			return nil, connect.NewError(connect.CodeNotFound, err)
		case errors.Is(err, cluster.ErrTooManySchedules):
			return nil, connect.NewError(connect.CodeResourceExhausted, err)
		}
		return nil, apierr.From(err)
	}
	name := c.Name
	if c.Def != nil {
		name = c.Def.Name
	}
	if sc := meta.Schedules().Get(name); sc != nil {
		return scheduleToAPI(sc), nil
	}
	return nil, nil
}

// scheduleOf returns the schedule name of meta's table, or NOT_FOUND.
func scheduleOf(meta *cluster.Meta, name string) (*cluster.Schedule, error) {
	if sc := meta.Schedules().Get(name); sc != nil {
		return sc, nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("name: no schedule %q", name))
}

func (a adminService) CreateSchedule(ctx context.Context, req *connect.Request[nornv1.CreateScheduleRequest]) (*connect.Response[nornv1.CreateScheduleResponse], error) {
	sv := a.sv
	def, err := sv.scheduleDefFromAPI("schedule", req.Msg.GetSchedule())
	if err != nil {
		return nil, err
	}
	if err := sv.schedulesGate("schedule"); err != nil {
		return nil, err
	}
	return onMetaLeader(sv, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.CreateScheduleRequest]) (*connect.Response[nornv1.CreateScheduleResponse], error) {
		return p.Admin.CreateSchedule
	}, func(_ *nornv1.CreateScheduleRequest, meta *cluster.Meta) (*nornv1.CreateScheduleResponse, error) {
		s, err := proposeSchedule(meta, &cluster.ScheduleCommand{Op: cluster.ScheduleCreate, Def: def, NowMs: sv.cfg.Clock.Now().UnixMilli()})
		return &nornv1.CreateScheduleResponse{Schedule: s}, err
	})
}

func (a adminService) UpdateSchedule(ctx context.Context, req *connect.Request[nornv1.UpdateScheduleRequest]) (*connect.Response[nornv1.UpdateScheduleResponse], error) {
	sv := a.sv
	def, err := sv.scheduleDefFromAPI("schedule", req.Msg.GetSchedule())
	if err != nil {
		return nil, err
	}
	if err := sv.schedulesGate("schedule"); err != nil {
		return nil, err
	}
	return onMetaLeader(sv, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.UpdateScheduleRequest]) (*connect.Response[nornv1.UpdateScheduleResponse], error) {
		return p.Admin.UpdateSchedule
	}, func(_ *nornv1.UpdateScheduleRequest, meta *cluster.Meta) (*nornv1.UpdateScheduleResponse, error) {
		s, err := proposeSchedule(meta, &cluster.ScheduleCommand{Op: cluster.ScheduleUpdate, Def: def})
		return &nornv1.UpdateScheduleResponse{Schedule: s}, err
	})
}

func (a adminService) GetSchedule(ctx context.Context, req *connect.Request[nornv1.GetScheduleRequest]) (*connect.Response[nornv1.GetScheduleResponse], error) {
	if err := crdt.ValidateQueue("name", req.Msg.GetName()); err != nil {
		return nil, apierr.From(err)
	}
	return onMetaLeader(a.sv, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.GetScheduleRequest]) (*connect.Response[nornv1.GetScheduleResponse], error) {
		return p.Admin.GetSchedule
	}, func(m *nornv1.GetScheduleRequest, meta *cluster.Meta) (*nornv1.GetScheduleResponse, error) {
		sc, err := scheduleOf(meta, m.GetName())
		if err != nil {
			return nil, err
		}
		return &nornv1.GetScheduleResponse{Schedule: scheduleToAPI(sc)}, nil
	})
}

func (a adminService) ListSchedules(ctx context.Context, req *connect.Request[nornv1.ListSchedulesRequest]) (*connect.Response[nornv1.ListSchedulesResponse], error) {
	return onMetaLeader(a.sv, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.ListSchedulesRequest]) (*connect.Response[nornv1.ListSchedulesResponse], error) {
		return p.Admin.ListSchedules
	}, func(_ *nornv1.ListSchedulesRequest, meta *cluster.Meta) (*nornv1.ListSchedulesResponse, error) {
		tab := meta.Schedules()
		resp := &nornv1.ListSchedulesResponse{}
		for _, name := range tab.Names() {
			resp.Schedules = append(resp.Schedules, scheduleToAPI(tab.Get(name)))
		}
		return resp, nil
	})
}

func (a adminService) PauseSchedule(ctx context.Context, req *connect.Request[nornv1.PauseScheduleRequest]) (*connect.Response[nornv1.PauseScheduleResponse], error) {
	if err := crdt.ValidateQueue("name", req.Msg.GetName()); err != nil {
		return nil, apierr.From(err)
	}
	return onMetaLeader(a.sv, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.PauseScheduleRequest]) (*connect.Response[nornv1.PauseScheduleResponse], error) {
		return p.Admin.PauseSchedule
	}, func(m *nornv1.PauseScheduleRequest, meta *cluster.Meta) (*nornv1.PauseScheduleResponse, error) {
		s, err := proposeSchedule(meta, &cluster.ScheduleCommand{Op: cluster.SchedulePause, Name: m.GetName(), Paused: m.GetPaused()})
		return &nornv1.PauseScheduleResponse{Schedule: s}, err
	})
}

func (a adminService) DeleteSchedule(ctx context.Context, req *connect.Request[nornv1.DeleteScheduleRequest]) (*connect.Response[nornv1.DeleteScheduleResponse], error) {
	if err := crdt.ValidateQueue("name", req.Msg.GetName()); err != nil {
		return nil, apierr.From(err)
	}
	return onMetaLeader(a.sv, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.DeleteScheduleRequest]) (*connect.Response[nornv1.DeleteScheduleResponse], error) {
		return p.Admin.DeleteSchedule
	}, func(m *nornv1.DeleteScheduleRequest, meta *cluster.Meta) (*nornv1.DeleteScheduleResponse, error) {
		if _, err := scheduleOf(meta, m.GetName()); err != nil {
			return nil, err
		}
		_, err := proposeSchedule(meta, &cluster.ScheduleCommand{Op: cluster.ScheduleDelete, Name: m.GetName()})
		return &nornv1.DeleteScheduleResponse{}, err
	})
}

func (a adminService) TriggerSchedule(ctx context.Context, req *connect.Request[nornv1.TriggerScheduleRequest]) (*connect.Response[nornv1.TriggerScheduleResponse], error) {
	sv := a.sv
	if err := crdt.ValidateQueue("name", req.Msg.GetName()); err != nil {
		return nil, apierr.From(err)
	}
	return onMetaLeader(sv, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.TriggerScheduleRequest]) (*connect.Response[nornv1.TriggerScheduleResponse], error) {
		return p.Admin.TriggerSchedule
	}, func(m *nornv1.TriggerScheduleRequest, meta *cluster.Meta) (*nornv1.TriggerScheduleResponse, error) {
		sc, err := scheduleOf(meta, m.GetName())
		if err != nil {
			return nil, err
		}
		id, err := sv.enqueueTick(ctx, sc, sv.cfg.Clock.Now().UnixMilli(), false)
		if err != nil {
			return nil, err
		}
		return &nornv1.TriggerScheduleResponse{TaskId: id}, nil
	})
}
