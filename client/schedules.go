package client

import (
	"context"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// Schedules (docs/SCHEDULING.md): periodic tasks, kept by the cluster's
// meta group, whose leader enqueues each tick's task once. Every call
// goes to any node, which passes it to that leader; admin role.

// scheduleCall makes one schedule call, retried as rc allows.
func scheduleCall[Req, Resp any](c *Client, ctx context.Context, what string, rc retryClass, req *Req,
	call func(nornv1connect.AdminServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) (*Resp, error) {
	var out *Resp
	err := c.call(ctx, what, rc, func(ctx context.Context, ep *endpoint) error {
		resp, err := call(ep.admin, ctx, connect.NewRequest(req))
		if err == nil {
			out = resp.Msg
		}
		return err
	})
	return out, err
}

// CreateSchedule stores a new schedule and returns it as stored, with its
// next tick (ALREADY_EXISTS when one has its name). Not retried after an
// ambiguous failure: a retry would meet the first attempt's schedule.
func (c *Client) CreateSchedule(ctx context.Context, s *nornv1.Schedule) (*nornv1.Schedule, error) {
	resp, err := scheduleCall(c, ctx, "create schedule", retryNoEffect, &nornv1.CreateScheduleRequest{Schedule: s},
		nornv1connect.AdminServiceClient.CreateSchedule)
	return resp.GetSchedule(), err
}

// UpdateSchedule replaces a schedule's definition (s.Name picks it).
func (c *Client) UpdateSchedule(ctx context.Context, s *nornv1.Schedule) (*nornv1.Schedule, error) {
	resp, err := scheduleCall(c, ctx, "update schedule", retryIdempotent, &nornv1.UpdateScheduleRequest{Schedule: s},
		nornv1connect.AdminServiceClient.UpdateSchedule)
	return resp.GetSchedule(), err
}

// GetSchedule returns a schedule with its last and next ticks.
func (c *Client) GetSchedule(ctx context.Context, name string) (*nornv1.Schedule, error) {
	resp, err := scheduleCall(c, ctx, "get schedule", retryIdempotent, &nornv1.GetScheduleRequest{Name: name},
		nornv1connect.AdminServiceClient.GetSchedule)
	return resp.GetSchedule(), err
}

// ListSchedules returns every schedule, by name.
func (c *Client) ListSchedules(ctx context.Context) ([]*nornv1.Schedule, error) {
	resp, err := scheduleCall(c, ctx, "list schedules", retryIdempotent, &nornv1.ListSchedulesRequest{},
		nornv1connect.AdminServiceClient.ListSchedules)
	return resp.GetSchedules(), err
}

// PauseSchedule pauses (paused true) or resumes a schedule.
func (c *Client) PauseSchedule(ctx context.Context, name string, paused bool) (*nornv1.Schedule, error) {
	resp, err := scheduleCall(c, ctx, "pause schedule", retryIdempotent, &nornv1.PauseScheduleRequest{Name: name, Paused: paused},
		nornv1connect.AdminServiceClient.PauseSchedule)
	return resp.GetSchedule(), err
}

// DeleteSchedule removes a schedule; its tasks stay.
func (c *Client) DeleteSchedule(ctx context.Context, name string) error {
	_, err := scheduleCall(c, ctx, "delete schedule", retryIdempotent, &nornv1.DeleteScheduleRequest{Name: name},
		nornv1connect.AdminServiceClient.DeleteSchedule)
	return err
}

// TriggerSchedule enqueues a schedule's task now, as an extra tick, and
// returns its id. Not retried after an ambiguous failure (a retry would
// make a second task).
func (c *Client) TriggerSchedule(ctx context.Context, name string) (uint64, error) {
	resp, err := scheduleCall(c, ctx, "trigger schedule", retryNoEffect, &nornv1.TriggerScheduleRequest{Name: name},
		nornv1connect.AdminServiceClient.TriggerSchedule)
	return resp.GetTaskId(), err
}
