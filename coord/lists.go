package coord

// Lists and counts (TaskService.ListTasks and CountTasks) across the
// cluster. A node reads the partitions it replicates from its own replica
// (R=1) and every other partition from one replica elsewhere, through
// PeerService.ListPartition and CountPartitions: the partition's leader
// when a peer reported it (its claim records are the authoritative ones),
// else an up member of the cohort, and the next one on an error. When no
// replica of a partition answers, the call fails UNAVAILABLE naming the
// partition: a list or count never leaves a partition out silently. A
// node that replicates every partition (N equal to the node count) asks
// no peer.
//
// A list with a queue filter reads, in each partition, that queue's index
// (storage.ScanQueue), so its page examines the queue's tasks only; a
// list without one reads every task of the partition. Both go by
// partition, then id, so the page token (partition, next id) is the same
// for both and means the same on every node: a peer of an older build,
// which scans every task for a queue filter too, answers the same tasks,
// in shorter pages.

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// Listing bounds.
const (
	defaultPageSize = 100
	MaxPageSize     = 1000
	// MaxScanPerPage bounds the tasks a ListTasks page examines: of
	// every queue without a queue filter, of that queue with one (read
	// through the queue index), so that with a queue filter and no
	// status filter every task examined matches and only the page size
	// and MaxPageBytes end a page early.
	MaxScanPerPage = 10_000
	MaxPageBytes   = 16 << 20 // encoded size of a page's tasks, exceeded by one task at most
	// countTimeout bounds one CountPartitions call (it scans whole
	// partitions); a ListPartition call does bounded work and takes
	// readTimeout.
	countTimeout = 30 * time.Second
)

// listFilter selects the tasks of a list or count.
type listFilter struct {
	queue  string            // "" for every queue
	status nornv1.TaskStatus // TASK_STATUS_UNSPECIFIED for every status
	search search            // ListTasks' search filters
}

// newListFilter validates a request's queue and status filters.
func newListFilter(queue string, status nornv1.TaskStatus) (listFilter, error) {
	if queue != "" {
		if err := crdt.ValidateQueue("queue", queue); err != nil {
			return listFilter{}, apierr.From(err)
		}
	}
	if _, ok := nornv1.TaskStatus_name[int32(status)]; !ok {
		return listFilter{}, apierr.Invalid("status", "unknown status %d", status)
	}
	return listFilter{queue: queue, status: status}, nil
}

// listBudget is what is left of a page: tasks to return, tasks to
// examine, bytes of returned tasks. A page stops before the next task
// once any of them is used up.
type listBudget struct{ tasks, scan, bytes int }

func (b listBudget) spent() bool { return b.tasks <= 0 || b.scan <= 0 || b.bytes <= 0 }

// less is what is left of b after pg.
func (b listBudget) less(pg listPage) listBudget {
	return listBudget{tasks: b.tasks - len(pg.tasks), scan: b.scan - pg.scanned, bytes: b.bytes - pg.bytes}
}

// listPage is one partition's part of a ListTasks page.
type listPage struct {
	tasks   []*nornv1.Task
	scanned int    // tasks examined, matching or not
	bytes   int    // encoded size of tasks
	more    bool   // the partition holds more tasks, from next on
	next    uint64 // the first task not examined, when more
}

func (pg *listPage) add(v *nornv1.Task) {
	pg.tasks = append(pg.tasks, v)
	pg.bytes += proto.Size(v)
}

// listLocal reads partition p's part of a page from this node's replica:
// the tasks with id >= start that match f, in id order, until b is spent.
// With a queue filter it reads that queue's index (storage.ScanQueue), so
// the tasks it examines (b.scan) are the queue's only; without one it
// reads every task of the partition.
func (c *Coordinator) listLocal(p uint16, f listFilter, start uint64, b listBudget) (listPage, error) {
	scan := c.store.ScanTasks
	if f.queue != "" {
		scan = func(p uint16, start uint64, limit int) ([]*storage.StoredTask, uint64, bool, error) {
			return c.store.ScanQueue(p, f.queue, start, limit)
		}
	}
	var pg listPage
	for {
		batch, next, more, err := scan(p, start, min(256, b.scan+1))
		if err != nil {
			return listPage{}, apierr.From(err)
		}
		for _, st := range batch {
			if b.less(pg).spent() {
				pg.more, pg.next = true, st.Task.ID
				return pg, nil
			}
			pg.scanned++
			if v := c.listView(st, f); v != nil {
				pg.add(v)
			}
		}
		if !more {
			return pg, nil
		}
		start = next
	}
}

// listView renders a stored task if it matches f.
func (c *Coordinator) listView(st *storage.StoredTask, f listFilter) *nornv1.Task {
	if st.Task.Spec == nil || (f.queue != "" && st.Task.Spec.Queue != f.queue) || !f.search.matchesSpec(st.Task.Spec) {
		return nil
	}
	ts, err := c.withClaims(st.Partition, st.Task)
	if err != nil {
		return nil
	}
	v := c.View(ts)
	if (f.status != nornv1.TaskStatus_TASK_STATUS_UNSPECIFIED && v.Status != f.status) || !f.search.matches(v) {
		return nil
	}
	return v
}

// listRemote reads partition p's part of a page from a replica on
// another node (see replicaOrder), trying the next on an error.
func (c *Coordinator) listRemote(ctx context.Context, p uint16, f listFilter, start uint64, b listBudget) (listPage, error) {
	order := c.replicaOrder(p, nil)
	var lastErr error
	for _, nd := range order {
		pg, err := c.askList(ctx, nd, p, f, start, b)
		if err == nil {
			return pg, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return listPage{}, partitionUnavailable(p, order, lastErr)
}

// askList asks node nd for partition p's part of a page and checks that
// the answer keeps to the request.
func (c *Coordinator) askList(ctx context.Context, nd cluster.RingNode, p uint16, f listFilter, start uint64, b listBudget) (listPage, error) {
	cctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	req := &nornv1.ListPartitionRequest{Partition: uint32(p), Queue: f.queue, Status: f.status, Start: start,
		Limit: uint32(b.tasks), MaxScan: uint32(b.scan), MaxBytes: uint32(max(b.bytes, 0))}
	f.search.fill(req)
	resp, err := c.peers.Get(nd.APIAddr).Peer.ListPartition(cctx, transport.Request(c.peers, req))
	if err != nil {
		return listPage{}, err
	}
	m := resp.Msg
	if len(m.GetTasks()) > b.tasks || int(m.GetScanned()) > b.scan || (m.GetMore() && m.GetNext() < start) {
		return listPage{}, fmt.Errorf("node %s answered beyond the request for partition %d", nd.ID, p)
	}
	pg := listPage{scanned: int(m.GetScanned()), more: m.GetMore(), next: m.GetNext()}
	for _, v := range m.GetTasks() {
		if v.GetId() < start || c.host.Partition(v.GetId()) != p {
			return listPage{}, fmt.Errorf("node %s answered task %d for partition %d", nd.ID, v.GetId(), p)
		}
		if f.search.matches(v) { // a node of an older build does not search
			pg.add(v)
		}
	}
	c.hints.set(p, m.GetLeader())
	return pg, nil
}

// replicaOrder lists the up members of partition p's cohort other than
// this node, in the order to ask them: the leader a peer last reported,
// then members in prefer, then the others in random order.
func (c *Coordinator) replicaOrder(p uint16, prefer map[string]bool) []cluster.RingNode {
	r := c.host.Ring()
	alive := c.host.Alive()
	hint := c.hints.get(p)
	cohort := r.Cohort(int(p))
	var leader, preferred, rest []cluster.RingNode
	for _, i := range rand.Perm(len(cohort)) {
		id := string(cohort[i])
		nd, ok := r.Node(id)
		switch {
		case id == c.cfg.NodeID || !ok || !alive[id]:
		case id == hint:
			leader = append(leader, nd)
		case prefer[id]:
			preferred = append(preferred, nd)
		default:
			rest = append(rest, nd)
		}
	}
	return slices.Concat(leader, preferred, rest)
}

// partitionUnavailable is the error of a list or count that no replica
// of partition p answered; asked are the replicas tried.
func partitionUnavailable(p uint16, asked []cluster.RingNode, lastErr error) error {
	if len(asked) == 0 {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("partition %d: no replica is up", p))
	}
	ids := make([]string, len(asked))
	for i, nd := range asked {
		ids[i] = nd.ID
	}
	msg := fmt.Sprintf("partition %d: no replica answered (asked %s)", p, strings.Join(ids, ", "))
	if lastErr != nil {
		msg += ": " + apierr.Message(lastErr)
	}
	return connect.NewError(connect.CodeUnavailable, errors.New(msg))
}

// leaderHints remembers the leaders that peers reported for partitions
// this node does not replicate, so lists and counts ask them first.
type leaderHints struct {
	mu     sync.Mutex
	leader map[uint16]string
}

func (h *leaderHints) get(p uint16) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.leader[p]
}

// set records p's leader ("" forgets it).
func (h *leaderHints) set(p uint16, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.leader == nil {
		h.leader = map[uint16]string{}
	}
	h.leader[p] = id
}

// hostedPartition checks the partition field of a peer request: below
// P, and replicated here (FAILED_PRECONDITION otherwise). It returns the
// partition's group.
func (c *Coordinator) hostedPartition(field string, p uint32) (*claims.Group, error) {
	if c.host.Ring() == nil {
		return nil, apierr.NotFormed
	}
	if p >= uint32(c.cfg.Partitions) {
		return nil, apierr.Invalid(field, "must be below %d, got %d", c.cfg.Partitions, p)
	}
	g := c.host.Group(uint16(p))
	if g == nil {
		return nil, c.NotReplicated(field, uint16(p))
	}
	return g, nil
}

// NotReplicated is the FAILED_PRECONDITION a peer gets for asking about
// partition p (through field) of a node that does not replicate it.
func (c *Coordinator) NotReplicated(field string, p uint16) error {
	return connect.NewError(connect.CodeFailedPrecondition,
		fmt.Errorf("%s: partition %d is not replicated on %s", field, p, c.cfg.NodeID))
}

// List answers TaskService.ListTasks: one page of the tasks that match
// m's filters, in partition and id order, across the cluster.
func (c *Coordinator) List(ctx context.Context, m *nornv1.ListTasksRequest) (*nornv1.ListTasksResponse, error) {
	f, err := newListFilter(m.GetQueue(), m.GetStatus())
	if err != nil {
		return nil, err
	}
	if f.search, err = newSearch(m); err != nil {
		return nil, err
	}
	size := int(m.GetPageSize())
	if size == 0 {
		size = defaultPageSize
	}
	if size > MaxPageSize {
		return nil, apierr.Invalid("pageSize", "must be at most %d, got %d", MaxPageSize, size)
	}
	if m.GetNewestFirst() {
		from, err := decodeNewestToken(m.GetPageToken())
		if err != nil {
			return nil, err
		}
		if c.host.Ring() == nil {
			return nil, apierr.NotFormed
		}
		return c.listNewest(ctx, f, size, from)
	}
	p, start, err := decodePageToken(m.GetPageToken(), c.cfg.Partitions)
	if err != nil {
		return nil, err
	}
	if c.host.Ring() == nil {
		return nil, apierr.NotFormed
	}
	b := listBudget{tasks: size, scan: MaxScanPerPage, bytes: MaxPageBytes}
	resp := &nornv1.ListTasksResponse{}
	for ; int(p) < c.cfg.Partitions; p, start = p+1, 0 {
		var pg listPage
		if c.host.ReadsLocally(p) {
			pg, err = c.listLocal(p, f, start, b)
		} else {
			pg, err = c.listRemote(ctx, p, f, start, b)
		}
		if err != nil {
			return nil, err
		}
		resp.Tasks = append(resp.Tasks, pg.tasks...)
		if pg.more {
			resp.NextPageToken = encodePageToken(p, pg.next)
			break
		}
		b = b.less(pg)
	}
	return resp, nil
}

func encodePageToken(p uint16, id uint64) string {
	b := binary.BigEndian.AppendUint16(nil, p)
	return base64.RawURLEncoding.EncodeToString(binary.BigEndian.AppendUint64(b, id))
}

func decodePageToken(tok string, partitions int) (uint16, uint64, error) {
	if tok == "" {
		return 0, 0, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) != 10 || int(binary.BigEndian.Uint16(b)) >= partitions {
		return 0, 0, apierr.Invalid("pageToken", "not a token from a previous ListTasks")
	}
	return binary.BigEndian.Uint16(b), binary.BigEndian.Uint64(b[2:]), nil
}

// ListPartition answers PeerService.ListPartition from this node's
// replica of m's partition.
func (c *Coordinator) ListPartition(m *nornv1.ListPartitionRequest) (*nornv1.ListPartitionResponse, error) {
	if c.host.Ring() == nil {
		return nil, apierr.NotFormed
	}
	f, err := newListFilter(m.GetQueue(), m.GetStatus())
	if err != nil {
		return nil, err
	}
	if f.search, err = newSearch(m); err != nil {
		return nil, err
	}
	for _, l := range []struct {
		field    string
		got, max uint32
	}{{"limit", m.GetLimit(), MaxPageSize}, {"maxScan", m.GetMaxScan(), MaxScanPerPage}, {"maxBytes", m.GetMaxBytes(), MaxPageBytes}} {
		if l.got > l.max {
			return nil, apierr.Invalid(l.field, "must be at most %d, got %d", l.max, l.got)
		}
	}
	b := listBudget{tasks: int(m.GetLimit()), scan: int(m.GetMaxScan()), bytes: int(m.GetMaxBytes())}
	if m.GetNewestFirst() {
		return c.listNewestPeer(m, f, b)
	}
	g, err := c.hostedPartition("partition", m.GetPartition())
	if err != nil {
		return nil, err
	}
	p := uint16(m.GetPartition())
	pg, err := c.listLocal(p, f, m.GetStart(), b)
	if err != nil {
		return nil, err
	}
	return &nornv1.ListPartitionResponse{Tasks: pg.tasks, Scanned: uint32(pg.scanned),
		More: pg.more, Next: pg.next, Leader: string(g.Leader())}, nil
}
