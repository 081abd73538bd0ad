package client

import (
	"context"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// ImportTasks writes whole task states, as an export holds them
// (AdminService.ImportTasks: ids kept, terminal tasks kept terminal, no
// claims). Retried like a read: importing the same tasks again changes
// nothing.
func (c *Client) ImportTasks(ctx context.Context, req *nornv1.ImportTasksRequest) (*nornv1.ImportTasksResponse, error) {
	var out *nornv1.ImportTasksResponse
	err := c.call(ctx, "import tasks", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.admin.ImportTasks(ctx, connect.NewRequest(req))
		if err == nil {
			out = resp.Msg
		}
		return err
	})
	return out, err
}
