package client_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// fakeServer is an in-memory, single-process stand-in for a Norn node, for
// the client's unit tests only: the task model of the API (enqueue, claim
// with long poll, renew, update, complete, abort, yield, cancel) without
// replication, Raft or lease expiry, served over real HTTP/2 cleartext on
// 127.0.0.1. Hooks inject failures and record what the client sent.
type fakeServer struct {
	// The placement calls answer UNIMPLEMENTED: the client library does
	// not make them.
	nornv1connect.UnimplementedAdminServiceHandler

	srv  *httptest.Server
	addr string

	mu        sync.Mutex
	nextID    uint64
	nextClaim uint64
	tasks     map[uint64]*fakeTask
	changed   chan struct{} // closed and replaced on every change
	calls     map[string]int
	batches   []int                            // sizes of EnqueueBatch requests
	reqIDs    [][]uint64                       // ids of every Enqueue / EnqueueBatch request
	renews    map[uint64][]time.Time           // renew times per task
	claimedAt map[uint64]time.Time             // claim time per task
	notH2     int                              // requests not made over HTTP/2
	acceptEnc []string                         // Grpc-Accept-Encoding of every request
	nodes     []*nornv1.NodeStatus             // what Status lists (setNodes)
	leader    bool                             // claims name this node as the tasks' leader
	queues    map[string]*nornv1.QueueSettings // SetQueue's (fake_queues_test.go)

	// inject, when set, runs before every call (without mu) with the
	// method name and request message; a non-nil error is the answer. It
	// also runs for each completion of a CompleteBatch (with mu held), as
	// method "CompleteBatch.item": a non-nil error is that item's answer.
	inject func(method string, req proto.Message) error
	// failWrite, when set, runs after an Enqueue or EnqueueBatch has
	// stored its tasks; true turns the answer into UNAVAILABLE with a
	// WriteFailure naming the ids (a write quorum not reached).
	failWrite func(method string) bool
}

type fakeTask struct {
	id       uint64
	spec     *nornv1.TaskSpec
	status   nornv1.TaskStatus
	claims   []*nornv1.ClaimInfo
	updates  []*nornv1.TaskUpdate
	errors   []*nornv1.TaskError
	result   []byte
	progress float64
	created  time.Time
	failed   uint32 // failed attempts (Abort{retry})
	life     uint32 // Retry calls taken
}

func newFake() *fakeServer {
	f := &fakeServer{
		nextID:    1,
		nextClaim: 100,
		tasks:     map[uint64]*fakeTask{},
		changed:   make(chan struct{}),
		calls:     map[string]int{},
		renews:    map[uint64][]time.Time{},
		claimedAt: map[uint64]time.Time{},
	}
	mux := http.NewServeMux()
	mux.Handle(nornv1connect.NewTaskServiceHandler(f))
	mux.Handle(nornv1connect.NewAdminServiceHandler(f))
	mux.Handle(nornv1connect.NewQueueServiceHandler(fakeQueues{f}))
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		if r.ProtoMajor != 2 {
			f.notH2++
		}
		f.acceptEnc = append(f.acceptEnc, r.Header.Get("Grpc-Accept-Encoding"))
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	f.srv.Config.Protocols = &p
	f.srv.Start()
	f.addr = f.srv.Listener.Addr().String()
	return f
}

func (f *fakeServer) Close() { f.srv.Close() }

// setInject and setFailWrite install hooks (nil removes them).
func (f *fakeServer) setInject(fn func(method string, req proto.Message) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inject = fn
}

func (f *fakeServer) setFailWrite(fn func(method string) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failWrite = fn
}

// setNodes sets the nodes Status lists, as a node of a cluster would.
func (f *fakeServer) setNodes(nodes ...*nornv1.NodeStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = nodes
}

// count returns how many times method was called.
func (f *fakeServer) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// task returns a copy of the view of task id, nil when unknown.
func (f *fakeServer) task(id uint64) *nornv1.Task {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tasks[id]
	if !ok {
		return nil
	}
	return t.view()
}

// begin counts the call and runs the inject hook.
func (f *fakeServer) begin(method string, req proto.Message) error {
	f.mu.Lock()
	f.calls[method]++
	inject := f.inject
	f.mu.Unlock()
	if inject != nil {
		return inject(method, req)
	}
	return nil
}

// notifyLocked wakes long-polling claims.
func (f *fakeServer) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func writeFailure(ids ...uint64) error {
	e := connect.NewError(connect.CodeUnavailable, errors.New("write quorum not reached"))
	d, err := connect.NewErrorDetail(&nornv1.WriteFailure{Ids: ids, Acks: 1, W: 2})
	if err != nil {
		panic(err)
	}
	e.AddDetail(d)
	return e
}

func failedPrecondition(msg string) error {
	return connect.NewError(connect.CodeFailedPrecondition, errors.New(msg))
}

func (t *fakeTask) view() *nornv1.Task {
	v := &nornv1.Task{
		Id: t.id, Spec: t.spec, Status: t.status, Progress: t.progress,
		CreatedAt: timestamppb.New(t.created), Claims: t.claims, Updates: t.updates,
		Errors: t.errors, Result: t.result, FailedAttempts: t.failed, Life: t.life,
	}
	if t.status == nornv1.TaskStatus_TASK_STATUS_CLAIMED {
		v.CurrentClaim = t.claims[len(t.claims)-1]
	}
	return proto.CloneOf(v)
}

// storeLocked stores one enqueued task.
func (f *fakeServer) storeLocked(spec *nornv1.TaskSpec, id uint64) (uint64, error) {
	if spec.GetQueue() == "" {
		return 0, connect.NewError(connect.CodeInvalidArgument, errors.New("spec.queue: required"))
	}
	if id == 0 { // the fake's ids count from 1; tests choose theirs from 1000
		for f.tasks[f.nextID] != nil {
			f.nextID++
		}
		id = f.nextID
		f.nextID++
	}
	if old, ok := f.tasks[id]; ok {
		if !proto.Equal(old.spec, spec) {
			return 0, connect.NewError(connect.CodeAlreadyExists, errors.New("id: in use by another spec"))
		}
		return id, nil
	}
	f.tasks[id] = &fakeTask{id: id, spec: proto.CloneOf(spec), status: nornv1.TaskStatus_TASK_STATUS_READY, created: time.Now()}
	return id, nil
}

func (f *fakeServer) Enqueue(_ context.Context, r *connect.Request[nornv1.EnqueueRequest]) (*connect.Response[nornv1.EnqueueResponse], error) {
	if err := f.begin("Enqueue", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqIDs = append(f.reqIDs, []uint64{r.Msg.GetId()})
	if holder := f.uniqueHolderLocked(r.Msg.GetTask(), r.Msg.GetId()); holder != 0 {
		return connect.NewResponse(&nornv1.EnqueueResponse{Id: holder, Duplicate: true}), nil
	}
	id, err := f.storeLocked(r.Msg.GetTask(), r.Msg.GetId())
	if err != nil {
		return nil, err
	}
	f.notifyLocked()
	if f.failWrite != nil && f.failWrite("Enqueue") {
		return nil, writeFailure(id)
	}
	return connect.NewResponse(&nornv1.EnqueueResponse{Id: id, Acks: 1}), nil
}

func (f *fakeServer) EnqueueBatch(_ context.Context, r *connect.Request[nornv1.EnqueueBatchRequest]) (*connect.Response[nornv1.EnqueueBatchResponse], error) {
	if err := f.begin("EnqueueBatch", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches = append(f.batches, len(r.Msg.GetTasks()))
	f.reqIDs = append(f.reqIDs, r.Msg.GetIds())
	if n := len(r.Msg.GetIds()); n != 0 && n != len(r.Msg.GetTasks()) {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("ids: not parallel to tasks"))
	}
	for _, s := range r.Msg.GetTasks() {
		if s.GetQueue() == "" {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("tasks.spec.queue: required"))
		}
	}
	ids := make([]uint64, len(r.Msg.GetTasks()))
	for i, s := range r.Msg.GetTasks() {
		var id uint64
		if len(r.Msg.GetIds()) > 0 {
			id = r.Msg.GetIds()[i]
		}
		var err error
		if ids[i], err = f.storeLocked(s, id); err != nil {
			return nil, err
		}
	}
	f.notifyLocked()
	if f.failWrite != nil && f.failWrite("EnqueueBatch") {
		return nil, writeFailure(ids...)
	}
	return connect.NewResponse(&nornv1.EnqueueBatchResponse{Ids: ids, Acks: 1}), nil
}

func (f *fakeServer) GetTask(_ context.Context, r *connect.Request[nornv1.GetTaskRequest]) (*connect.Response[nornv1.GetTaskResponse], error) {
	if err := f.begin("GetTask", r.Msg); err != nil {
		return nil, err
	}
	t := f.task(r.Msg.GetId())
	if t == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("id: no such task"))
	}
	return connect.NewResponse(&nornv1.GetTaskResponse{Task: t}), nil
}

func (f *fakeServer) ListTasks(_ context.Context, r *connect.Request[nornv1.ListTasksRequest]) (*connect.Response[nornv1.ListTasksResponse], error) {
	if err := f.begin("ListTasks", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var after uint64
	if tok := r.Msg.GetPageToken(); tok != "" {
		var err error
		if after, err = strconv.ParseUint(tok, 10, 64); err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("pageToken: malformed"))
		}
	}
	size := int(cmp.Or(r.Msg.GetPageSize(), 100))
	var ids []uint64
	for id, t := range f.tasks {
		if id > after && (r.Msg.GetQueue() == "" || t.spec.GetQueue() == r.Msg.GetQueue()) &&
			(r.Msg.GetStatus() == nornv1.TaskStatus_TASK_STATUS_UNSPECIFIED || t.status == r.Msg.GetStatus()) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	resp := &nornv1.ListTasksResponse{}
	if len(ids) > size {
		ids = ids[:size]
		resp.NextPageToken = strconv.FormatUint(ids[size-1], 10)
	}
	for _, id := range ids {
		resp.Tasks = append(resp.Tasks, f.tasks[id].view())
	}
	return connect.NewResponse(resp), nil
}

func (f *fakeServer) BulkAction(_ context.Context, r *connect.Request[nornv1.BulkActionRequest]) (*connect.Response[nornv1.BulkActionResponse], error) {
	if err := f.begin("BulkAction", r.Msg); err != nil {
		return nil, err
	}
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("not in the fake"))
}

func (f *fakeServer) CountTasks(_ context.Context, r *connect.Request[nornv1.CountTasksRequest]) (*connect.Response[nornv1.CountTasksResponse], error) {
	if err := f.begin("CountTasks", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &nornv1.CountTasksResponse{ByStatus: map[string]uint64{}}
	for _, t := range f.tasks {
		if r.Msg.GetQueue() == "" || t.spec.GetQueue() == r.Msg.GetQueue() {
			resp.Total++
			resp.ByStatus[t.status.String()[len("TASK_STATUS_"):]]++
		}
	}
	return connect.NewResponse(resp), nil
}

func (f *fakeServer) Claim(ctx context.Context, r *connect.Request[nornv1.ClaimRequest]) (*connect.Response[nornv1.ClaimResponse], error) {
	if err := f.begin("Claim", r.Msg); err != nil {
		return nil, err
	}
	if r.Msg.GetQueue() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("queue: required"))
	}
	lease := 30 * time.Second
	if r.Msg.GetLease() != nil {
		lease = r.Msg.GetLease().AsDuration()
	}
	n := int(cmp.Or(r.Msg.GetMax(), 1))
	wait := time.NewTimer(r.Msg.GetWait().AsDuration())
	defer wait.Stop()
	for {
		f.mu.Lock()
		var ready []*fakeTask
		for _, t := range f.tasks {
			if t.status == nornv1.TaskStatus_TASK_STATUS_READY && t.spec.GetQueue() == r.Msg.GetQueue() && !f.queues[t.spec.GetQueue()].GetPaused() {
				ready = append(ready, t)
			}
		}
		slices.SortFunc(ready, func(a, b *fakeTask) int {
			return cmp.Or(cmp.Compare(b.spec.GetPriority(), a.spec.GetPriority()), cmp.Compare(a.id, b.id))
		})
		if len(ready) > 0 {
			resp := &nornv1.ClaimResponse{}
			now := time.Now()
			for _, t := range ready[:min(n, len(ready))] {
				f.nextClaim++
				ci := &nornv1.ClaimInfo{
					ClaimId: f.nextClaim, Seq: uint32(len(t.claims) + 1), Worker: r.Msg.GetWorker(),
					Start: timestamppb.New(now), Expiry: timestamppb.New(now.Add(lease)),
				}
				t.claims = append(t.claims, ci)
				t.status = nornv1.TaskStatus_TASK_STATUS_CLAIMED
				f.claimedAt[t.id] = now
				ct := &nornv1.ClaimedTask{Task: t.view(), ClaimId: ci.ClaimId, Expiry: ci.Expiry}
				if f.leader {
					ct.Leader = f.addr
				}
				resp.Tasks = append(resp.Tasks, ct)
			}
			f.mu.Unlock()
			return connect.NewResponse(resp), nil
		}
		changed := f.changed
		f.mu.Unlock()
		select {
		case <-changed:
		case <-wait.C:
			return connect.NewResponse(&nornv1.ClaimResponse{}), nil
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
	}
}

// liveClaimLocked returns the task if claimID is its live claim, or the
// error the server answers otherwise.
func (f *fakeServer) liveClaimLocked(id, claimID uint64) (*fakeTask, error) {
	t, ok := f.tasks[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("id: no such task"))
	}
	if t.status != nornv1.TaskStatus_TASK_STATUS_CLAIMED || t.claims[len(t.claims)-1].GetClaimId() != claimID {
		return t, failedPrecondition("claimId: claim ended or superseded, or task terminal")
	}
	return t, nil
}

func (t *fakeTask) endClaim(end nornv1.ClaimEnd) {
	if t.status == nornv1.TaskStatus_TASK_STATUS_CLAIMED {
		c := t.claims[len(t.claims)-1]
		c.EndReason = end
		c.EndedAt = timestamppb.Now()
	}
}

func (f *fakeServer) Renew(_ context.Context, r *connect.Request[nornv1.RenewRequest]) (*connect.Response[nornv1.RenewResponse], error) {
	if err := f.begin("Renew", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.liveClaimLocked(r.Msg.GetId(), r.Msg.GetClaimId())
	if err != nil {
		return nil, err
	}
	f.renews[t.id] = append(f.renews[t.id], time.Now())
	exp := timestamppb.New(time.Now().Add(r.Msg.GetLease().AsDuration()))
	t.claims[len(t.claims)-1].Expiry = exp
	return connect.NewResponse(&nornv1.RenewResponse{Expiry: exp}), nil
}

func (f *fakeServer) Update(_ context.Context, r *connect.Request[nornv1.UpdateRequest]) (*connect.Response[nornv1.UpdateResponse], error) {
	if err := f.begin("Update", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.liveClaimLocked(r.Msg.GetId(), r.Msg.GetClaimId())
	if err != nil {
		return nil, err
	}
	t.updates = append(t.updates, &nornv1.TaskUpdate{
		ClaimId: r.Msg.GetClaimId(), Seq: r.Msg.GetSeq(), At: timestamppb.Now(),
		Progress: r.Msg.GetProgress(), Message: r.Msg.GetMessage(), Data: r.Msg.GetData(),
	})
	t.progress = r.Msg.GetProgress()
	return connect.NewResponse(&nornv1.UpdateResponse{Acks: 1}), nil
}

// endLocked ends task id with a terminal status under claimID; a repeat of
// the same end succeeds.
func (f *fakeServer) endLocked(id, claimID uint64, status nornv1.TaskStatus, end nornv1.ClaimEnd) (*fakeTask, error) {
	t, err := f.liveClaimLocked(id, claimID)
	if err != nil {
		if t != nil && t.status == status && t.claims[len(t.claims)-1].GetClaimId() == claimID {
			return nil, nil // a retry
		}
		return nil, err
	}
	t.endClaim(end)
	t.status = status
	f.notifyLocked()
	return t, nil
}

func (f *fakeServer) Complete(_ context.Context, r *connect.Request[nornv1.CompleteRequest]) (*connect.Response[nornv1.CompleteResponse], error) {
	if err := f.begin("Complete", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.completeLocked(r.Msg); err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.CompleteResponse{Acks: 1}), nil
}

// completeLocked completes a task with the request's result.
func (f *fakeServer) completeLocked(r *nornv1.CompleteRequest) error {
	t, err := f.endLocked(r.GetId(), r.GetClaimId(), nornv1.TaskStatus_TASK_STATUS_COMPLETED, nornv1.ClaimEnd_CLAIM_END_COMPLETED)
	if err == nil && t != nil {
		t.result = r.GetResult()
	}
	return err
}

func (f *fakeServer) CompleteBatch(_ context.Context, r *connect.Request[nornv1.CompleteBatchRequest]) (*connect.Response[nornv1.CompleteBatchResponse], error) {
	if err := f.begin("CompleteBatch", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	results := make([]*nornv1.CompletionResult, len(r.Msg.GetCompletions()))
	for i, c := range r.Msg.GetCompletions() {
		results[i] = &nornv1.CompletionResult{Acks: 1}
		var ce *connect.Error
		if f.inject != nil && errors.As(f.inject("CompleteBatch.item", c), &ce) {
			results[i] = &nornv1.CompletionResult{Code: ce.Code().String(), Message: fmt.Sprintf("completions[%d]: %s", i, ce.Message())}
			continue
		}
		if errors.As(f.completeLocked(c), &ce) {
			results[i] = &nornv1.CompletionResult{Code: ce.Code().String(), Message: fmt.Sprintf("completions[%d]: %s", i, ce.Message())}
		}
	}
	return connect.NewResponse(&nornv1.CompleteBatchResponse{Results: results}), nil
}

func (f *fakeServer) Abort(_ context.Context, r *connect.Request[nornv1.AbortRequest]) (*connect.Response[nornv1.AbortResponse], error) {
	if err := f.begin("Abort", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Msg.GetRetry() {
		// A failed attempt: READY again at once (the fake has no
		// backoff), or DEAD after the spec's max attempts.
		t, err := f.liveClaimLocked(r.Msg.GetId(), r.Msg.GetClaimId())
		if err != nil {
			return nil, err
		}
		t.endClaim(nornv1.ClaimEnd_CLAIM_END_FAILED)
		t.failed++
		for _, e := range r.Msg.GetErrors() {
			e = proto.CloneOf(e)
			e.Attempt = t.claims[len(t.claims)-1].GetSeq()
			t.errors = append(t.errors, e)
		}
		t.status = nornv1.TaskStatus_TASK_STATUS_READY
		if m := t.spec.GetRetry().GetMaxAttempts(); m > 0 && t.failed >= m {
			t.status = nornv1.TaskStatus_TASK_STATUS_DEAD
		}
		f.notifyLocked()
		return connect.NewResponse(&nornv1.AbortResponse{Acks: 1}), nil
	}
	t, err := f.endLocked(r.Msg.GetId(), r.Msg.GetClaimId(), nornv1.TaskStatus_TASK_STATUS_ABORTED, nornv1.ClaimEnd_CLAIM_END_ABORTED)
	if err != nil {
		return nil, err
	}
	if t != nil {
		t.errors = append(t.errors, r.Msg.GetErrors()...) // after the failed attempts'
	}
	return connect.NewResponse(&nornv1.AbortResponse{Acks: 1}), nil
}

func (f *fakeServer) Yield(_ context.Context, r *connect.Request[nornv1.YieldRequest]) (*connect.Response[nornv1.YieldResponse], error) {
	if err := f.begin("Yield", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.liveClaimLocked(r.Msg.GetId(), r.Msg.GetClaimId())
	if err != nil {
		return nil, err
	}
	t.endClaim(nornv1.ClaimEnd_CLAIM_END_YIELDED)
	t.status = nornv1.TaskStatus_TASK_STATUS_READY
	t.progress = r.Msg.GetProgress()
	f.notifyLocked()
	return connect.NewResponse(&nornv1.YieldResponse{}), nil
}

func (f *fakeServer) Cancel(_ context.Context, r *connect.Request[nornv1.CancelRequest]) (*connect.Response[nornv1.CancelResponse], error) {
	if err := f.begin("Cancel", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tasks[r.Msg.GetId()]
	switch {
	case !ok:
		return nil, connect.NewError(connect.CodeNotFound, errors.New("id: no such task"))
	case t.status == nornv1.TaskStatus_TASK_STATUS_COMPLETED || t.status == nornv1.TaskStatus_TASK_STATUS_ABORTED:
		return nil, failedPrecondition("id: task already ended")
	}
	t.endClaim(nornv1.ClaimEnd_CLAIM_END_CANCELLED)
	t.status = nornv1.TaskStatus_TASK_STATUS_CANCELLED
	f.notifyLocked()
	return connect.NewResponse(&nornv1.CancelResponse{Acks: 1}), nil
}

func (f *fakeServer) Retry(_ context.Context, r *connect.Request[nornv1.RetryRequest]) (*connect.Response[nornv1.RetryResponse], error) {
	if err := f.begin("Retry", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tasks[r.Msg.GetId()]
	switch {
	case !ok:
		return nil, connect.NewError(connect.CodeNotFound, errors.New("id: no such task"))
	case t.status != nornv1.TaskStatus_TASK_STATUS_DEAD && t.status != nornv1.TaskStatus_TASK_STATUS_ABORTED &&
		t.status != nornv1.TaskStatus_TASK_STATUS_CANCELLED:
		return nil, failedPrecondition("id: task is not DEAD, ABORTED or CANCELLED")
	}
	t.status, t.failed, t.life = nornv1.TaskStatus_TASK_STATUS_READY, 0, t.life+1
	f.notifyLocked()
	return connect.NewResponse(&nornv1.RetryResponse{Life: t.life, Acks: 1}), nil
}

func (f *fakeServer) Status(_ context.Context, r *connect.Request[nornv1.StatusRequest]) (*connect.Response[nornv1.StatusResponse], error) {
	if err := f.begin("Status", r.Msg); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return connect.NewResponse(&nornv1.StatusResponse{NodeId: "fake-1", Version: "test", Nodes: f.nodes}), nil
}
