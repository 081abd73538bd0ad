package client

import (
	"context"
	"iter"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// maxBatchTasks is the most tasks one EnqueueBatch request may hold.
const maxBatchTasks = 10_000

// EnqueueOption configures one Enqueue or EnqueueBatch call.
type EnqueueOption func(*enqueueOptions)

type enqueueOptions struct {
	ids  []uint64
	w    uint32
	wSet bool
	acks *uint32
	dup  *bool
	dups *[]bool
}

// WithID makes Enqueue store the task under id instead of letting the
// server assign one: to retry an enqueue whose outcome is unknown (with the
// id it returned along with its error), or to use an id the caller made.
// Enqueuing an id that exists with the same spec succeeds and changes
// nothing. For Enqueue only.
func WithID(id uint64) EnqueueOption {
	return func(o *enqueueOptions) { o.ids = []uint64{id} }
}

// WithIDs is WithID for EnqueueBatch: one id per spec, in order, 0 where
// the server should assign one.
func WithIDs(ids ...uint64) EnqueueOption {
	return func(o *enqueueOptions) { o.ids = ids }
}

// WithQuorum sets the write quorum W of this call, overriding the
// client's (WithDefaultQuorum). 0 means the server's default, a majority.
func WithQuorum(w uint32) EnqueueOption {
	return func(o *enqueueOptions) { o.w, o.wSet = w, true }
}

// WithAcks makes Enqueue set *acks to how many replicas stored the task
// (EnqueueResponse.acks) when it succeeds. Such a call is sent on its own,
// not batched with others.
func WithAcks(acks *uint32) EnqueueOption {
	return func(o *enqueueOptions) { o.acks = acks }
}

// WithDuplicate makes Enqueue set *dup to whether the task's unique key
// (TaskSpec.unique_key) was held by a task an earlier enqueue created:
// the id Enqueue returns is then that task's, and nothing was created
// (EnqueueResponse.duplicate). Such a call is sent on its own, not
// batched with others; so is every call whose spec has a unique key.
func WithDuplicate(dup *bool) EnqueueOption {
	return func(o *enqueueOptions) { o.dup = dup }
}

// WithDuplicates is WithDuplicate for EnqueueBatch: *dups gets one entry
// per spec, in order.
func WithDuplicates(dups *[]bool) EnqueueOption {
	return func(o *enqueueOptions) { o.dups = dups }
}

func (c *Client) enqueueOptions(opts []EnqueueOption) enqueueOptions {
	o := enqueueOptions{w: c.w}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Enqueue stores a new task and returns its id. With WithEnqueueBatching,
// the call may share an EnqueueBatch RPC with concurrent calls.
//
// Retries: with an id (WithID) the call retries every UNAVAILABLE or
// DEADLINE_EXCEEDED. Without one, it retries an UNAVAILABLE only when the
// error's WriteFailure detail names the id the server assigned, and then
// with that id, so a retry can never store the task twice; and errors that
// prove the request never reached the node.
//
// When the call fails but the id is known (the server assigned it before
// the write quorum failed), Enqueue returns that id with the error: the task
// may or may not be stored, and Enqueue(ctx, spec, WithID(id)) later is
// safe. Otherwise the id is 0.
func (c *Client) Enqueue(ctx context.Context, spec *nornv1.TaskSpec, opts ...EnqueueOption) (uint64, error) {
	o := c.enqueueOptions(opts)
	if spec == nil {
		return 0, invalidArg("enqueue", "nil task spec")
	}
	if len(o.ids) > 1 {
		return 0, invalidArg("enqueue", "more than one id: WithIDs is for EnqueueBatch")
	}
	var id uint64
	if len(o.ids) == 1 {
		id = o.ids[0]
	}
	if c.enqueues != nil && o.acks == nil && o.dup == nil && spec.GetUniqueKey() == "" {
		return c.enqueueCoalesced(ctx, spec, id, o.w)
	}
	return c.enqueueOne(ctx, spec, id, o)
}

// enqueueOne sends one Enqueue RPC, retried by the enqueue rules; o's
// acks and dup, when not nil, get the response's.
func (c *Client) enqueueOne(ctx context.Context, spec *nornv1.TaskSpec, id uint64, o enqueueOptions) (uint64, error) {
	w, acks := o.w, o.acks
	ctx, cancel := c.withTimeout(ctx, 0)
	defer cancel()
	req := &nornv1.EnqueueRequest{Task: spec, Id: id, W: w}
	var got uint64
	err := c.do(ctx, "enqueue", func(err error) bool {
		if wf, ok := WriteFailureOf(err); ok && len(wf.Ids) == 1 && wf.Ids[0] != 0 && req.Id == 0 {
			req.Id = wf.Ids[0]
		}
		if req.Id != 0 {
			return retryable(retryIdempotent, err)
		}
		return retryable(retryNoEffect, err)
	}, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.tasks.Enqueue(ctx, connect.NewRequest(req))
		if err == nil {
			got = resp.Msg.GetId()
			if acks != nil {
				*acks = resp.Msg.GetAcks()
			}
			if o.dup != nil {
				*o.dup = resp.Msg.GetDuplicate()
			}
		}
		return err
	})
	if err != nil {
		return req.Id, err
	}
	return got, nil
}

// EnqueueBatch stores up to 10,000 new tasks in one call and returns their
// ids in order. It succeeds only when every task reached the write
// quorum. WithIDs gives ids (0 entries: server-assigned); retries follow
// Enqueue's rules, with the ids of the WriteFailure detail. On failure
// with the ids known, EnqueueBatch returns them with the error (some of
// the tasks may be stored); otherwise nil.
//
// EnqueueBatch never goes through the client's enqueue batching.
func (c *Client) EnqueueBatch(ctx context.Context, specs []*nornv1.TaskSpec, opts ...EnqueueOption) ([]uint64, error) {
	o := c.enqueueOptions(opts)
	if len(specs) == 0 || len(specs) > maxBatchTasks {
		return nil, invalidArg("enqueue batch", "need 1 to 10,000 tasks")
	}
	if len(o.ids) != 0 && len(o.ids) != len(specs) {
		return nil, invalidArg("enqueue batch", "WithIDs needs one id per task")
	}
	for _, s := range specs {
		if s == nil {
			return nil, invalidArg("enqueue batch", "nil task spec")
		}
	}
	return c.enqueueBatch(ctx, specs, o.ids, o.w, o.dups)
}

// enqueueBatch sends one EnqueueBatch RPC, retried by the enqueue rules;
// ids is nil or parallel to specs. It returns the ids known on failure
// (nil when the server assigned none yet).
func (c *Client) enqueueBatch(ctx context.Context, specs []*nornv1.TaskSpec, ids []uint64, w uint32, dups *[]bool) ([]uint64, error) {
	ctx, cancel := c.withTimeout(ctx, 0)
	defer cancel()
	req := &nornv1.EnqueueBatchRequest{Tasks: specs, W: w}
	if len(ids) > 0 {
		req.Ids = append([]uint64(nil), ids...)
	}
	var got []uint64
	err := c.do(ctx, "enqueue batch", func(err error) bool {
		if wf, ok := WriteFailureOf(err); ok && consistentIDs(req.Ids, wf.Ids, len(specs)) {
			req.Ids = wf.Ids
		}
		if allKnown(req.Ids, len(specs)) {
			return retryable(retryIdempotent, err)
		}
		return retryable(retryNoEffect, err)
	}, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.tasks.EnqueueBatch(ctx, connect.NewRequest(req))
		if err == nil {
			got = resp.Msg.GetIds()
			if len(got) != len(specs) {
				return connect.NewError(connect.CodeInternal, errProtocol("EnqueueBatch answered a different number of ids than tasks"))
			}
			if dups != nil {
				*dups = resp.Msg.GetDuplicates()
				if len(*dups) == 0 {
					*dups = make([]bool, len(specs))
				}
			}
		}
		return err
	})
	if err != nil {
		if allKnown(req.Ids, len(specs)) {
			return req.Ids, err
		}
		return nil, err
	}
	return got, nil
}

// consistentIDs reports whether the ids of a WriteFailure (next) may
// replace the request's (cur): n non-zero ids that keep every id the
// request already had.
func consistentIDs(cur, next []uint64, n int) bool {
	if len(next) != n {
		return false
	}
	for i, id := range next {
		if id == 0 || len(cur) > 0 && cur[i] != 0 && cur[i] != id {
			return false
		}
	}
	return true
}

// allKnown reports whether ids holds n non-zero ids.
func allKnown(ids []uint64, n int) bool {
	if len(ids) != n {
		return false
	}
	for _, id := range ids {
		if id == 0 {
			return false
		}
	}
	return true
}

type errProtocol string

func (e errProtocol) Error() string { return "norn: protocol error: " + string(e) }

// GetTask returns the task with its full history, read from a majority of
// its replicas. Retried (a read).
func (c *Client) GetTask(ctx context.Context, id uint64) (*nornv1.Task, error) {
	var t *nornv1.Task
	err := c.call(ctx, "get task", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.tasks.GetTask(ctx, connect.NewRequest(&nornv1.GetTaskRequest{Id: id}))
		if err == nil {
			t = resp.Msg.GetTask()
		}
		return err
	})
	return t, err
}

// ListTasks returns one page of tasks (see nornv1.ListTasksRequest for
// the filters and the page token). Retried (a read). Tasks iterates over
// every page.
func (c *Client) ListTasks(ctx context.Context, req *nornv1.ListTasksRequest) (*nornv1.ListTasksResponse, error) {
	var out *nornv1.ListTasksResponse
	err := c.call(ctx, "list tasks", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.tasks.ListTasks(ctx, connect.NewRequest(req))
		if err == nil {
			out = resp.Msg
		}
		return err
	})
	return out, err
}

// Tasks iterates over the tasks of queue (every queue when empty) with
// status (every status when TASK_STATUS_UNSPECIFIED), in ascending id
// order, a page of at most 1,000 at a time. It stops after the first
// error, which it yields with a nil task.
func (c *Client) Tasks(ctx context.Context, queue string, status nornv1.TaskStatus) iter.Seq2[*nornv1.Task, error] {
	return func(yield func(*nornv1.Task, error) bool) {
		req := &nornv1.ListTasksRequest{Queue: queue, Status: status, PageSize: 1000}
		for {
			page, err := c.ListTasks(ctx, req)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, t := range page.GetTasks() {
				if !yield(t, nil) {
					return
				}
			}
			if page.GetNextPageToken() == "" {
				return
			}
			req.PageToken = page.GetNextPageToken()
		}
	}
}

// CountTasks counts the tasks of queue (every queue when empty) by
// status. Retried (a read).
func (c *Client) CountTasks(ctx context.Context, queue string) (*nornv1.CountTasksResponse, error) {
	var out *nornv1.CountTasksResponse
	err := c.call(ctx, "count tasks", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.tasks.CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{Queue: queue}))
		if err == nil {
			out = resp.Msg
		}
		return err
	})
	return out, err
}

// ClaimRequest says what to claim.
type ClaimRequest struct {
	// Queue to claim from. Required.
	Queue string

	// Worker is recorded in the claim history (for example
	// "host-3/pid-812"). Optional.
	Worker string

	// Lease is the claim's length unless renewed, at millisecond
	// precision. 0 means the server's default (30 s).
	Lease time.Duration

	// Max is the most tasks to claim. 0 means 1; at most 1,000.
	Max int

	// Wait is the long poll: how long the server may wait for a claimable
	// task when there is none now. 0 answers at once. The client's timeout
	// (WithTimeout) is added to it for the call's deadline.
	Wait time.Duration
}

// Claim leases up to r.Max tasks of r.Queue, highest priority then oldest
// first; after r.Wait with none claimable it returns an empty slice.
//
// Claim is not idempotent: a claim whose answer was lost holds its tasks
// until their leases expire. So it is retried only when the request
// provably never reached a node (connection refused, unknown host), never
// on UNAVAILABLE or DEADLINE_EXCEEDED answers; the caller (Worker does)
// tries again later.
func (c *Client) Claim(ctx context.Context, r ClaimRequest) ([]*nornv1.ClaimedTask, error) {
	if r.Max < 0 || r.Lease < 0 || r.Wait < 0 {
		return nil, invalidArg("claim", "negative max, lease or wait")
	}
	ctx, cancel := c.withTimeout(ctx, r.Wait)
	defer cancel()
	req := &nornv1.ClaimRequest{Queue: r.Queue, Worker: r.Worker, Max: uint32(r.Max)}
	if r.Lease > 0 {
		req.Lease = durationpb.New(r.Lease)
	}
	if r.Wait > 0 {
		req.Wait = durationpb.New(r.Wait)
	}
	var out []*nornv1.ClaimedTask
	err := c.do(ctx, "claim", func(err error) bool { return retryable(retryNoEffect, err) }, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.tasks.Claim(ctx, connect.NewRequest(req))
		if err == nil {
			out = resp.Msg.GetTasks()
		}
		return err
	})
	for _, ct := range out {
		var expiry time.Time
		if ct.GetExpiry() != nil {
			expiry = ct.GetExpiry().AsTime()
		}
		c.hints.note(ct.GetTask().GetId(), ct.GetLeader(), expiry)
	}
	return out, err
}

// Renew extends the lease of a live claim to lease from now (0: the
// server's default, 30 s) and returns the new expiry on the server's
// clock. ErrSuperseded (FAILED_PRECONDITION) means the claim has ended or
// the task was cancelled: stop working on it. Retried (idempotent).
func (c *Client) Renew(ctx context.Context, id, claimID uint64, lease time.Duration) (time.Time, error) {
	if lease < 0 {
		return time.Time{}, invalidArg("renew", "negative lease")
	}
	req := &nornv1.RenewRequest{Id: id, ClaimId: claimID}
	if lease > 0 {
		req.Lease = durationpb.New(lease)
	}
	var expiry time.Time
	err := c.callClaim(ctx, id, false, "renew", func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.tasks.Renew(ctx, connect.NewRequest(req))
		if err == nil {
			expiry = resp.Msg.GetExpiry().AsTime()
		}
		return err
	})
	if err == nil {
		c.hints.renewed(id, expiry)
	}
	return expiry, err
}

// Update records a progress report under a live claim. req.Seq must grow
// with every update of the claim (a Worker's Task does that for you); a
// zero req.W takes the client's default quorum. Retried (idempotent by
// (claim, seq)). req is not modified.
func (c *Client) Update(ctx context.Context, req *nornv1.UpdateRequest) error {
	if req == nil {
		return invalidArg("update", "nil request")
	}
	if req.GetW() == 0 && c.w != 0 {
		req = proto.CloneOf(req)
		req.W = c.w
	}
	return c.callClaim(ctx, req.GetId(), false, "update", func(ctx context.Context, ep *endpoint) error {
		_, err := ep.tasks.Update(ctx, connect.NewRequest(req))
		return err
	})
}

// Complete ends the claim and the task as COMPLETED with result. A retry
// of a complete that took effect succeeds, so it is retried. The first
// terminal event wins: a complete racing a cancel may succeed and still
// leave the task CANCELLED.
//
// With WithCompleteBatching, concurrent calls share CompleteBatch RPCs.
func (c *Client) Complete(ctx context.Context, id, claimID uint64, result []byte) error {
	hint := c.hints.get(id, true)
	if c.completes != nil {
		req := &nornv1.CompleteRequest{Id: id, ClaimId: claimID, Result: result}
		_, err := c.completes.do(ctx, batchKey{w: c.w, leader: hint.leader}, req, proto.Size(req))
		if err != nil && ctx.Err() == nil && retryable(retryIdempotent, err) && (hint.expiry.IsZero() || time.Now().Before(hint.expiry)) {
			// The batch's own attempts ran out, or this completion alone
			// failed (its partition had no leader), while the claim lasts:
			// on its own, for as long as it lasts (callClaim).
			return c.completeOne(ctx, hint, &nornv1.CompleteRequest{Id: id, ClaimId: claimID, Result: result, W: c.w})
		}
		return err
	}
	return c.completeOne(ctx, hint, &nornv1.CompleteRequest{Id: id, ClaimId: claimID, Result: result, W: c.w})
}

// completeOne sends one Complete RPC, first to the hint's leader if it
// can, retried as a call on a claim.
func (c *Client) completeOne(ctx context.Context, hint claimHint, req *nornv1.CompleteRequest) error {
	return c.callHinted(ctx, hint, "complete", func(ctx context.Context, ep *endpoint) error {
		_, err := ep.tasks.Complete(ctx, connect.NewRequest(req))
		return err
	})
}

// Abort ends the claim and the task as ABORTED with errs (each with a
// non-empty code). The task is not claimed again; to give it back, Yield.
// Retried (idempotent).
func (c *Client) Abort(ctx context.Context, id, claimID uint64, errs ...*nornv1.TaskError) error {
	req := &nornv1.AbortRequest{Id: id, ClaimId: claimID, Errors: errs, W: c.w}
	return c.callClaim(ctx, id, true, "abort", func(ctx context.Context, ep *endpoint) error {
		_, err := ep.tasks.Abort(ctx, connect.NewRequest(req))
		return err
	})
}

// Fail ends the claim as a failed attempt with errs (each with a
// non-empty code; kept in Task.errors with the attempt): the task waits
// its retry backoff (TaskSpec.retry, or the server's default policy) as
// DELAYED, then is READY again, or is DEAD when this was its last
// attempt. Retried (idempotent).
func (c *Client) Fail(ctx context.Context, id, claimID uint64, errs ...*nornv1.TaskError) error {
	req := &nornv1.AbortRequest{Id: id, ClaimId: claimID, Errors: errs, W: c.w, Retry: true}
	return c.callClaim(ctx, id, true, "fail", func(ctx context.Context, ep *endpoint) error {
		_, err := ep.tasks.Abort(ctx, connect.NewRequest(req))
		return err
	})
}

// Retry gives a DEAD, ABORTED or CANCELLED task a new life: it is READY
// again with a fresh budget of attempts, its history kept. life is the
// life the caller read terminal (Task.Life): a Retry of a life retried
// already succeeds without change, so the call is retried safely. It
// returns the task's life now. A COMPLETED task, or one that is not
// terminal, is FAILED_PRECONDITION.
func (c *Client) Retry(ctx context.Context, id uint64, life uint32) (uint32, error) {
	req := &nornv1.RetryRequest{Id: id, Life: &life, W: c.w}
	var now uint32
	err := c.call(ctx, "retry", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		r, err := ep.tasks.Retry(ctx, connect.NewRequest(req))
		if err == nil {
			now = r.Msg.GetLife()
		}
		return err
	})
	return now, err
}

// BulkAction runs one page of a server-side bulk retry or cancel
// (TaskService.BulkAction: admin only) and returns its counts and the
// token of the next page (req.PageToken for the next call; empty at the
// end). Retried on UNAVAILABLE: a page acted on twice skips what it did.
func (c *Client) BulkAction(ctx context.Context, req *nornv1.BulkActionRequest) (*nornv1.BulkActionResponse, error) {
	var out *nornv1.BulkActionResponse
	err := c.call(ctx, "bulk action", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.tasks.BulkAction(ctx, connect.NewRequest(req))
		if err == nil {
			out = resp.Msg
		}
		return err
	})
	return out, err
}

// Yield ends the claim and puts the task back to READY, with progress (0
// to 1) as its progress. Retried on UNAVAILABLE: a retry of a yield that
// took effect fails with ErrSuperseded, which then means the claim ended
// one way or another.
func (c *Client) Yield(ctx context.Context, id, claimID uint64, progress float64) error {
	req := &nornv1.YieldRequest{Id: id, ClaimId: claimID, Progress: progress}
	return c.callClaim(ctx, id, true, "yield", func(ctx context.Context, ep *endpoint) error {
		_, err := ep.tasks.Yield(ctx, connect.NewRequest(req))
		return err
	})
}

// Cancel ends a task that has not ended yet as CANCELLED; its worker
// learns of it on its next renew. Cancelling a cancelled task succeeds;
// a completed or aborted one fails with ErrSuperseded. Retried
// (idempotent).
func (c *Client) Cancel(ctx context.Context, id uint64) error {
	req := &nornv1.CancelRequest{Id: id, W: c.w}
	return c.call(ctx, "cancel", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		_, err := ep.tasks.Cancel(ctx, connect.NewRequest(req))
		return err
	})
}

// Status returns the answering node's view of itself, its partitions and
// the cluster's nodes (AdminService.Status). The node is whichever the
// client picks, as for any call (NodeId names it); for one given node, use
// a Client of that address alone with WithDiscovery(0). Retried (a read).
func (c *Client) Status(ctx context.Context) (*nornv1.StatusResponse, error) {
	var out *nornv1.StatusResponse
	err := c.call(ctx, "status", retryIdempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{}))
		if err == nil {
			out = resp.Msg
		}
		return err
	})
	return out, err
}
