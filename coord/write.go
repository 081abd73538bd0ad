package coord

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// The spans of a quorum write (docs/OPERATIONS.md, Tracing), made when
// Config.Tracer is set.
const (
	// SpanWrite is one quorum write: attributes norn.tasks, norn.w,
	// norn.partition (when every task is of one partition), and at the
	// end norn.acks (the least over the tasks).
	SpanWrite = "norn.coord.write"
	// SpanReplicaWrite is one replica's share of a write, from the
	// coordinator's side: sent, then synced and acked (or failed).
	// Attributes norn.replica (its node id), norn.tasks, norn.local
	// (this node's own replica). A remote replica's server span
	// (norn.v1.PeerService/Replicate) is its child, or, when a call
	// carried the writes of several requests, the child of the first
	// traced one's.
	SpanReplicaWrite = "norn.replica.write"
)

// The attributes of the write spans.
const (
	AttrTasks     = attribute.Key("norn.tasks")
	AttrW         = attribute.Key("norn.w")
	AttrAcks      = attribute.Key("norn.acks")
	AttrPartition = attribute.Key("norn.partition")
	AttrReplica   = attribute.Key("norn.replica")
	AttrLocal     = attribute.Key("norn.local")
)

// Quorum resolves a request's write quorum: 0 is the majority of N.
func (c *Coordinator) Quorum(w uint32) (uint32, error) {
	r := c.host.Ring()
	if r == nil {
		return 0, apierr.NotFormed
	}
	N := uint32(r.Replication)
	if w > N {
		return 0, apierr.Invalid("w", "%d exceeds the replication factor %d", w, N)
	}
	if w == 0 {
		w = N/2 + 1
	}
	return w, nil
}

// Write stores task states (deltas or whole states) on their cohorts:
// every cohort member gets them in parallel, this node through its store
// and the others through their replica senders, and write answers once
// every task has w synced acks. Fewer than w before the deadline (or the
// request's context) is UNAVAILABLE with a WriteFailure naming ids (the
// request's task ids, for the client to retry with). It returns the acks:
// the least over the tasks at the moment each reached w.
func (c *Coordinator) Write(ctx context.Context, tasks []*crdt.Task, w uint32, ids []uint64) (uint32, error) {
	acks, w, lastErr, err := c.WriteEach(ctx, tasks, w)
	if err != nil {
		return 0, err
	}
	least := slices.Min(acks)
	if least >= w {
		return least, nil
	}
	return least, c.QuorumError(ids, least, w, lastErr)
}

// QuorumError is the error of a write that did not reach w acks: the
// refusal of a replica when one refused the write itself (no retry will
// help), else UNAVAILABLE with a WriteFailure.
func (c *Coordinator) QuorumError(ids []uint64, acks, w uint32, lastErr error) error {
	var ce *connect.Error
	if lastErr != nil && errors.As(lastErr, &ce) && ce.Code() != connect.CodeUnavailable &&
		ce.Code() != connect.CodeDeadlineExceeded && ce.Code() != connect.CodeCanceled &&
		ce.Code() != connect.CodeUnknown {
		return ce
	}
	msg := fmt.Sprintf("write quorum not reached: %d acks of w=%d", acks, w)
	if lastErr != nil {
		msg += ": " + apierr.Message(lastErr)
	}
	e := connect.NewError(connect.CodeUnavailable, errors.New(msg))
	if d, err := connect.NewErrorDetail(&nornv1.WriteFailure{Ids: ids, Acks: acks, W: w}); err == nil {
		e.AddDetail(d)
	}
	return e
}

// WriteEach is write's fan-out: it returns each task's acks when every
// task has w of them, every replica answered, or the deadline passed;
// the resolved w; and the last error a replica gave.
func (c *Coordinator) WriteEach(ctx context.Context, tasks []*crdt.Task, w uint32) (acks []uint32, quorum uint32, lastErr, err error) {
	r := c.host.Ring()
	if r == nil {
		return nil, 0, nil, apierr.NotFormed
	}
	w, err = c.Quorum(w)
	if err != nil {
		return nil, 0, nil, err
	}
	if c.cfg.Tracer != nil {
		var span trace.Span
		ctx, span = c.cfg.Tracer.Start(ctx, SpanWrite, trace.WithAttributes(AttrTasks.Int(len(tasks)), AttrW.Int64(int64(w))))
		if span.IsRecording() {
			if p, ok := onePartition(tasks, r.Partitions); ok {
				span.SetAttributes(AttrPartition.Int(p))
			}
		}
		defer func() {
			spanErr := err
			if len(acks) > 0 {
				least := slices.Min(acks)
				span.SetAttributes(AttrAcks.Int64(int64(least)))
				if err == nil && least < w {
					spanErr = c.QuorumError(nil, least, w, lastErr)
				}
			}
			transport.EndSpan(span, spanErr)
		}()
	}
	for attempt := 0; ; attempt++ {
		var stale string
		acks, stale, lastErr = c.writeOnce(ctx, r, tasks, w)
		if stale == "" || slices.Min(acks) >= w || attempt == 2 || ctx.Err() != nil {
			return acks, w, lastErr, nil
		}
		// A replica refused the write for a move or a cohort change this
		// node's ring does not have yet (checkEpoch): take the replica's
		// ring and write again (a merge is idempotent).
		nd, ok := r.Node(stale)
		if !ok {
			return acks, w, lastErr, nil
		}
		if err := c.host.PullRing(nd.APIAddr); err != nil {
			return acks, w, lastErr, nil
		}
		next := c.host.Ring()
		if next.Epoch <= r.Epoch {
			return acks, w, lastErr, nil
		}
		r = next
	}
}

// onePartition returns the partition of tasks when they all have the same
// one.
func onePartition(tasks []*crdt.Task, partitions int) (int, bool) {
	if len(tasks) == 0 {
		return 0, false
	}
	p := ring.Partition(tasks[0].ID, partitions)
	for _, t := range tasks[1:] {
		if ring.Partition(t.ID, partitions) != p {
			return 0, false
		}
	}
	return int(p), true
}

// staleRingRefusal is in the message of a replica's refusal of a write
// from a coordinator whose ring predates a move under way or the last
// change of the partition's cohort (checkEpoch). The words are the
// wire contract: a coordinator of any version pulls the refusing
// replica's ring and writes again when it finds them.
const staleRingRefusal = "the writer's ring is older"

// writeOnce sends tasks to their replicas as ring r places them and waits
// as writeEach says. stale names a replica that refused the write because
// r is older than its ring ("" when none did).
func (c *Coordinator) writeOnce(ctx context.Context, r *cluster.Ring, tasks []*crdt.Task, w uint32) (acks []uint32, stale string, lastErr error) {
	// Group by destination: every replica of each task's partition, a
	// move's target included.
	tr := &ackTracker{acks: make([]uint32, len(tasks)), w: w, left: len(tasks), done: make(chan struct{})}
	byDest := map[string][]int{}
	moving := r.MovesUnderway()
	for i, t := range tasks {
		p := ring.Partition(t.ID, r.Partitions)
		replicas := r.Cohort(p)
		if m := moving[p]; m != nil {
			replicas = r.Replicas(p)
			tr.addMove(i, m)
		}
		for _, id := range replicas {
			byDest[string(id)] = append(byDest[string(id)], i)
		}
	}
	tr.pending = len(byDest)
	// Each state is encoded once, for every replica: the peers get the
	// bytes and store them as they are (a new task), and so does this node.
	encs := make([][]byte, len(tasks))
	for i, t := range tasks {
		encs[i] = t.Encode()
	}
	traced := c.cfg.Tracer != nil && trace.SpanFromContext(ctx).IsRecording()
	for dest, idx := range byDest {
		subEnc := make([][]byte, len(idx))
		for j, i := range idx {
			subEnc[j] = encs[i]
		}
		// The replica's span, when traced, and the trace context its
		// call carries (a caller's, when this node does not trace).
		var span trace.Span
		sc := trace.SpanContextFromContext(ctx)
		if traced {
			_, span = c.cfg.Tracer.Start(ctx, SpanReplicaWrite, trace.WithAttributes(
				AttrReplica.String(dest), AttrTasks.Int(len(idx)), AttrLocal.Bool(dest == c.cfg.NodeID)))
			sc = span.SpanContext()
		}
		if dest == c.cfg.NodeID {
			sub := make([]*crdt.Task, len(idx))
			for j, i := range idx {
				sub[j] = tasks[i]
			}
			transport.Go(func() { tr.answerTraced(span, dest, idx, c.mergeEncoded(sub, subEnc)) })
			continue
		}
		answer := func(err error) { tr.answerTraced(span, dest, idx, err) }
		nd, ok := r.Node(dest)
		if !ok {
			answer(fmt.Errorf("node %s is not in the ring", dest))
			continue
		}
		c.sender(nd.APIAddr, nd.RaftAddr).send(sc, subEnc, answer)
	}
	timer := time.NewTimer(c.cfg.WriteTimeout)
	defer timer.Stop()
	select {
	case <-tr.done:
	case <-timer.C:
	case <-ctx.Done():
	}
	acks, lastErr = tr.result()
	return acks, tr.staleFrom(), lastErr
}

// ackTracker counts the synced acks of each task of a write. A task whose
// partition is moving (From hands its replica over to To) is written to
// the cohort and To, and needs w acks from the cohort and w from the
// cohort to be (To in place of From), so that it survives the handoff
// like any other write.
type ackTracker struct {
	mu      sync.Mutex
	acks    []uint32 // acks of each task from its partition's cohort
	w       uint32
	left    int // tasks below w
	pending int // destinations not answered
	lastErr error
	done    chan struct{} // closed when every task has w acks or every destination answered
	closed  bool

	moving map[int]*movingTask // by task index; nil when nothing moves
	stale  string              // a destination that refused the writer's ring as stale
}

func (t *ackTracker) staleFrom() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stale
}

// movingTask is the quorum state of a task whose partition moves.
type movingTask struct {
	from, to string
	nextAcks uint32 // acks from the cohort to be
}

func (t *ackTracker) addMove(i int, m *cluster.Move) {
	if t.moving == nil {
		t.moving = map[int]*movingTask{}
	}
	t.moving[i] = &movingTask{from: m.From, to: m.To}
}

// count adds dest's ack to task i and reports whether it reached w.
func (t *ackTracker) count(dest string, i int) (reached bool) {
	mt := t.moving[i]
	if mt == nil {
		t.acks[i]++
		return t.acks[i] == t.w
	}
	before := min(t.acks[i], mt.nextAcks) >= t.w
	if dest != mt.to {
		t.acks[i]++
	}
	if dest != mt.from {
		mt.nextAcks++
	}
	return !before && min(t.acks[i], mt.nextAcks) >= t.w
}

// answerTraced is answer that first ends dest's span (nil: untraced).
func (t *ackTracker) answerTraced(span trace.Span, dest string, idx []int, err error) {
	if span != nil {
		transport.EndSpan(span, err)
	}
	t.answer(dest, idx, err)
}

func (t *ackTracker) answer(dest string, idx []int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending--
	if err != nil {
		t.lastErr = err
		if strings.Contains(err.Error(), staleRingRefusal) {
			t.stale = dest
		}
	} else {
		for _, i := range idx {
			if t.count(dest, i) {
				t.left--
			}
		}
	}
	if !t.closed && (t.left == 0 || t.pending == 0) {
		t.closed = true
		close(t.done)
	}
}

// result returns a copy of each task's acks so far (for a moving task,
// the lesser of its two counts) and the last error a destination gave.
func (t *ackTracker) result() ([]uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := slices.Clone(t.acks)
	for i, mt := range t.moving {
		out[i] = min(out[i], mt.nextAcks)
	}
	return out, t.lastErr
}

// MergeLocal writes task states to this node's replicas (one synced
// commit) and tells OnEnded of the tasks that arrived terminal.
func (c *Coordinator) MergeLocal(tasks []*crdt.Task) error { return c.mergeEncoded(tasks, nil) }

// mergeEncoded is MergeLocal with the tasks' canonical encodings (encs[i]
// of tasks[i]; encs nil: none), which a new task is stored as.
func (c *Coordinator) mergeEncoded(tasks []*crdt.Task, encs [][]byte) error {
	items := make([]storage.MergeItem, len(tasks))
	for i, t := range tasks {
		items[i] = storage.MergeItem{Partition: c.host.Partition(t.ID), Task: t}
		if encs != nil {
			items[i].Encoding = encs[i]
		}
	}
	res, err := c.store.MergeTasks(items)
	if err != nil {
		return apierr.From(err)
	}
	for _, r := range res {
		if r.SpecConflict {
			// Two different specs for one id: corruption, or an id reused.
			// Resolved deterministically (lowest digest wins); never silent.
			c.specConflicts.Add(1)
			c.cfg.Logger.Error("task spec conflict resolved", "id", r.ID)
		}
	}
	var ended []Ended
	for i, t := range tasks {
		if ev, ok := t.Terminal(); ok && res[i].Changed() {
			ended = append(ended, Ended{P: items[i].Partition, ID: t.ID, Event: ev})
		}
	}
	if len(ended) > 0 && c.cfg.OnEnded != nil {
		c.cfg.OnEnded(ended)
	}
	return nil
}
