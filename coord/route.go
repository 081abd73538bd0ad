package coord

import (
	"context"
	"errors"
	"math/rand/v2"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/transport"
)

// maxHops bounds how often a request is forwarded: a node that does not
// replicate a task's partition forwards to a replica, which forwards to
// the leader.
const maxHops = 2

// RouteTarget is where a call on partition p should run: "" for here (this
// node leads p; or it replicates p and no leader is known, or the call
// may not travel further), else the API address of the leader or, when
// this node does not replicate p, of a replica.
func (c *Coordinator) RouteTarget(p uint16, hopsSoFar int) string {
	r := c.host.Ring()
	if r == nil || hopsSoFar >= maxHops {
		return ""
	}
	g := c.host.Group(p)
	if g != nil {
		if g.IsLeader() {
			return ""
		}
		if id := string(g.Leader()); id != "" && id != c.cfg.NodeID {
			if nd, ok := r.Node(id); ok {
				return nd.APIAddr
			}
		}
		return ""
	}
	cohort := r.Cohort(int(p))
	alive := c.host.Alive()
	start := rand.IntN(len(cohort))
	for i := range cohort {
		id := string(cohort[(start+i)%len(cohort)])
		if nd, ok := r.Node(id); ok && alive[id] {
			return nd.APIAddr
		}
	}
	nd, _ := r.Node(string(cohort[start]))
	return nd.APIAddr
}

// Forward runs a TaskService call on the node that should answer it for
// task id (see RouteTarget). It reports whether it did; when it did not,
// the caller handles the call here. A Forward that cannot reach its
// target falls back to here when this node replicates the partition.
func Forward[Req, Resp any](c *Coordinator, ctx context.Context, req *connect.Request[Req], id uint64,
	call func(nornv1connect.TaskServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
) (*connect.Response[Resp], bool, error) {
	if id == 0 || c.host.Ring() == nil {
		return nil, false, nil
	}
	p := c.host.Partition(id)
	target := c.RouteTarget(p, transport.Hops(req))
	if target == "" {
		return nil, false, nil
	}
	resp, err := call(c.peers.Get(target).Tasks, ctx, transport.Forwarded(req.Msg, transport.Hops(req)))
	if err != nil && Unreachable(err) && c.host.Group(p) != nil {
		c.cfg.Logger.DebugContext(ctx, "forward failed; handling here", "id", id, "to", target, "err", err)
		return nil, false, nil
	}
	if err != nil {
		return nil, true, err
	}
	return connect.NewResponse(resp.Msg), true, nil
}

// Unreachable reports an error that says the other node was not reached
// (or did not answer), as opposed to an answer.
func Unreachable(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return true
	}
	if ce.Code() == connect.CodeUnavailable {
		_, quorum := WriteFailure(ce)
		return !quorum
	}
	return ce.Code() == connect.CodeDeadlineExceeded || ce.Code() == connect.CodeCanceled
}

// WriteFailure returns the WriteFailure detail of an error, if any.
func WriteFailure(ce *connect.Error) (*nornv1.WriteFailure, bool) {
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if wf, ok := v.(*nornv1.WriteFailure); ok {
				return wf, true
			}
		}
	}
	return nil, false
}
