package coord

// Newest-first lists (ListTasksRequest.newest_first): the tasks that
// match in descending id order across the whole cluster. Each source (this
// node for the partitions it reads locally, and one replica per other
// partition, grouped by node: one PeerService.ListPartition call per
// node) merges its partitions' scans backwards (storage.ScanQueueBack or
// ScanTasksBack, a heap of one cursor per partition) from the page's
// bound down until its share of the page's budget is spent, and says
// where it stopped (the first id it did not examine). The page is the
// tasks above the highest such stop, newest first, at most page_size;
// the next page starts below the last task returned, or at that stop, in
// every partition: exact whatever the number of partitions, at the cost
// of tasks examined again on the next page when sources stop at
// different heights. Cost per page: a reverse seek per partition and the
// tasks examined, at most MaxScanPerPage across the sources.

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// newestTokenMark starts a newest-first page token (9 bytes: the mark and
// the id the page starts at, inclusive, downwards); a partition-order
// token is 10 bytes.
const newestTokenMark = 0x01

func encodeNewestToken(from uint64) string {
	return base64.RawURLEncoding.EncodeToString(binary.BigEndian.AppendUint64([]byte{newestTokenMark}, from))
}

// decodeNewestToken returns the id a newest-first page starts at (the
// largest for the first page).
func decodeNewestToken(tok string) (uint64, error) {
	if tok == "" {
		return math.MaxUint64, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) != 9 || b[0] != newestTokenMark {
		return 0, apierr.Invalid("pageToken", "not a token from a previous newest-first ListTasks")
	}
	return binary.BigEndian.Uint64(b[1:]), nil
}

// backCursor is one partition's scan backwards during a merge.
type backCursor struct {
	p    uint16
	buf  []*storage.StoredTask
	next uint64 // where the scan resumes, when more
	more bool
}

// cursorHeap orders cursors by their next task's id, highest first.
type cursorHeap []*backCursor

func (h cursorHeap) Len() int           { return len(h) }
func (h cursorHeap) Less(i, j int) bool { return h[i].buf[0].Task.ID > h[j].buf[0].Task.ID }
func (h cursorHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *cursorHeap) Push(x any)        { *h = append(*h, x.(*backCursor)) }
func (h *cursorHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// listNewestLocal merges the tasks of parts (replicated here) that match
// f in descending id order from id from down, until b is spent: the page
// holds them, and when more, next is the first task not examined.
func (c *Coordinator) listNewestLocal(parts []uint16, f listFilter, from uint64, b listBudget) (listPage, error) {
	scan := c.store.ScanTasksBack
	if f.queue != "" {
		scan = func(p uint16, from uint64, limit int) ([]*storage.StoredTask, uint64, bool, error) {
			return c.store.ScanQueueBack(p, f.queue, from, limit)
		}
	}
	const batch = 64
	fill := func(cur *backCursor, from uint64) error {
		tasks, next, more, err := scan(cur.p, from, batch)
		if err != nil {
			return apierr.From(err)
		}
		cur.buf, cur.next, cur.more = tasks, next, more
		return nil
	}
	h := cursorHeap{}
	for _, p := range parts {
		cur := &backCursor{p: p}
		if err := fill(cur, from); err != nil {
			return listPage{}, err
		}
		if len(cur.buf) > 0 {
			h = append(h, cur)
		}
	}
	heap.Init(&h)
	var pg listPage
	for h.Len() > 0 {
		cur := h[0]
		st := cur.buf[0]
		if b.less(pg).spent() {
			pg.more, pg.next = true, st.Task.ID
			return pg, nil
		}
		pg.scanned++
		if v := c.listView(st, f); v != nil {
			pg.add(v)
		}
		if cur.buf = cur.buf[1:]; len(cur.buf) == 0 && cur.more {
			if err := fill(cur, cur.next); err != nil {
				return listPage{}, err
			}
		}
		if len(cur.buf) == 0 {
			heap.Pop(&h)
		} else {
			heap.Fix(&h, 0)
		}
	}
	return pg, nil
}

// newestSource is one source of a newest-first page: this node (nd
// zero) or a peer, for parts.
type newestSource struct {
	nd    cluster.RingNode
	local bool
	parts []uint16
}

// listNewest answers a newest-first ListTasks page of at most size tasks
// at or below from.
func (c *Coordinator) listNewest(ctx context.Context, f listFilter, size int, from uint64) (*nornv1.ListTasksResponse, error) {
	// Each partition read elsewhere goes to its first replica in
	// replicaOrder, then the next one after an error.
	var local []uint16
	candidates := map[uint16][]cluster.RingNode{}
	for p := range uint16(c.cfg.Partitions) {
		if c.host.ReadsLocally(p) {
			local = append(local, p)
		} else {
			candidates[p] = c.replicaOrder(p, nil)
		}
	}
	asked := map[uint16][]cluster.RingNode{}
	var pages []listPage
	var lastErr map[uint16]error
	first := true
	for first || len(candidates) > 0 {
		var sources []newestSource
		if first && len(local) > 0 {
			sources = append(sources, newestSource{local: true, parts: local})
		}
		first = false
		byNode := map[string]*newestSource{}
		for _, p := range slices.Sorted(maps.Keys(candidates)) {
			order := candidates[p]
			if len(order) == 0 {
				return nil, partitionUnavailable(p, asked[p], lastErr[p])
			}
			nd := order[0]
			candidates[p] = order[1:]
			asked[p] = append(asked[p], nd)
			src := byNode[nd.ID]
			if src == nil {
				src = &newestSource{nd: nd}
				byNode[nd.ID] = src
			}
			src.parts = append(src.parts, p)
		}
		for _, id := range slices.Sorted(maps.Keys(byNode)) {
			sources = append(sources, *byNode[id])
		}
		if len(sources) == 0 {
			break
		}
		// Every source gets the page's size and its share of the scan
		// and bytes budgets.
		n := len(sources) + len(pages)
		b := listBudget{tasks: size, scan: max(MaxScanPerPage/n, size), bytes: MaxPageBytes / n}
		got := make([]listPage, len(sources))
		errs := make([]error, len(sources))
		var wg sync.WaitGroup
		for i, src := range sources {
			wg.Go(func() {
				if src.local {
					got[i], errs[i] = c.listNewestLocal(src.parts, f, from, b)
				} else {
					got[i], errs[i] = c.askNewest(ctx, src.nd, src.parts, f, from, b)
				}
			})
		}
		wg.Wait()
		for i, src := range sources {
			switch {
			case errs[i] == nil:
				pages = append(pages, got[i])
				for _, p := range src.parts {
					delete(candidates, p)
				}
			case src.local || connect.CodeOf(errs[i]) == connect.CodeFailedPrecondition:
				return nil, errs[i]
			default:
				if lastErr == nil {
					lastErr = map[uint16]error{}
				}
				for _, p := range src.parts {
					lastErr[p] = errs[i] // the next replica is asked
				}
			}
		}
		if ctx.Err() != nil {
			return nil, apierr.From(ctx.Err())
		}
	}
	return mergeNewest(pages, size), nil
}

// mergeNewest makes a newest-first page of at most size tasks from the
// sources' pages: the tasks above the highest point where a source
// stopped (below it a source may hold tasks it did not examine), newest
// first, and the token of what follows.
func mergeNewest(pages []listPage, size int) *nornv1.ListTasksResponse {
	var stop uint64 // the highest first-not-examined id of a source with more
	more := false
	for _, pg := range pages {
		if pg.more {
			stop, more = max(stop, pg.next), true
		}
	}
	var tasks []*nornv1.Task
	for _, pg := range pages {
		for _, v := range pg.tasks {
			if !more || v.GetId() > stop {
				tasks = append(tasks, v)
			}
		}
	}
	slices.SortFunc(tasks, func(a, b *nornv1.Task) int { return cmp.Compare(b.GetId(), a.GetId()) })
	resp := &nornv1.ListTasksResponse{Tasks: tasks}
	switch {
	case len(tasks) > size:
		resp.Tasks = tasks[:size]
		resp.NextPageToken = encodeNewestToken(tasks[size-1].GetId() - 1)
	case more:
		resp.NextPageToken = encodeNewestToken(stop)
	}
	return resp
}

// askNewest asks node nd for its newest-first part of a page over parts,
// and checks that the answer keeps to the request. A node of a build
// without newest-first lists answers in partition order: FAILED_PRECONDITION.
func (c *Coordinator) askNewest(ctx context.Context, nd cluster.RingNode, parts []uint16, f listFilter, from uint64, b listBudget) (listPage, error) {
	cctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	req := &nornv1.ListPartitionRequest{Queue: f.queue, Status: f.status, Start: from, NewestFirst: true,
		Limit: uint32(b.tasks), MaxScan: uint32(b.scan), MaxBytes: uint32(max(b.bytes, 0))}
	f.search.fill(req)
	for _, p := range parts {
		req.Partitions = append(req.Partitions, uint32(p))
	}
	resp, err := c.peers.Get(nd.APIAddr).Peer.ListPartition(cctx, transport.Request(c.peers, req))
	if err != nil {
		return listPage{}, err
	}
	m := resp.Msg
	if !m.GetNewestFirst() {
		return listPage{}, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"node %s runs a build without newest-first lists (a rolling upgrade under way?)", nd.ID))
	}
	if len(m.GetTasks()) > b.tasks || int(m.GetScanned()) > b.scan || (m.GetMore() && m.GetNext() > from) {
		return listPage{}, fmt.Errorf("node %s answered beyond the request", nd.ID)
	}
	pg := listPage{scanned: int(m.GetScanned()), more: m.GetMore(), next: m.GetNext()}
	last := from
	for i, v := range m.GetTasks() {
		if v.GetId() > last || (i > 0 && v.GetId() == last) || !slices.Contains(parts, c.host.Partition(v.GetId())) {
			return listPage{}, fmt.Errorf("node %s answered task %d out of order or of a partition not asked", nd.ID, v.GetId())
		}
		last = v.GetId()
		if f.search.matches(v) { // a node of an older build does not search
			pg.add(v)
		}
	}
	return pg, nil
}

// listNewestPeer answers a newest-first PeerService.ListPartition.
func (c *Coordinator) listNewestPeer(m *nornv1.ListPartitionRequest, f listFilter, b listBudget) (*nornv1.ListPartitionResponse, error) {
	if len(m.GetPartitions()) == 0 || len(m.GetPartitions()) > c.cfg.Partitions {
		return nil, apierr.Invalid("partitions", "must name 1 to %d partitions, got %d", c.cfg.Partitions, len(m.GetPartitions()))
	}
	var parts []uint16
	for i, p := range m.GetPartitions() {
		if _, err := c.hostedPartition(fmt.Sprintf("partitions[%d]", i), p); err != nil {
			return nil, err
		}
		if slices.Contains(parts, uint16(p)) {
			return nil, apierr.Invalid(fmt.Sprintf("partitions[%d]", i), "partition %d named twice", p)
		}
		parts = append(parts, uint16(p))
	}
	pg, err := c.listNewestLocal(parts, f, m.GetStart(), b)
	if err != nil {
		return nil, err
	}
	return &nornv1.ListPartitionResponse{Tasks: pg.tasks, Scanned: uint32(pg.scanned), More: pg.more, Next: pg.next, NewestFirst: true}, nil
}
