package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/ring"
	"github.com/norn-dev/norn/transport"
)

// listAll pages through ListTasks on m with req's filters and page size,
// failing on a repeated task or a page over the size. It returns the ids
// in the order listed and the number of pages.
func listAll(t *testing.T, m *member, req *nornv1.ListTasksRequest) ([]uint64, int, error) {
	t.Helper()
	return listPages(t, m.cfg.NodeID, m.api, req, 100)
}

// listPages is listAll on the node api serves (named name), failing
// after maxPages pages.
func listPages(t *testing.T, name string, api nornv1connect.TaskServiceClient, req *nornv1.ListTasksRequest, maxPages int) ([]uint64, int, error) {
	t.Helper()
	var ids []uint64
	seen := map[uint64]bool{}
	req.PageToken = ""
	for pages := 1; ; pages++ {
		resp, err := api.ListTasks(context.Background(), connect.NewRequest(req))
		if err != nil {
			return nil, pages, err
		}
		if size := int(req.PageSize); size > 0 && len(resp.Msg.Tasks) > size {
			t.Fatalf("%s: page of %d tasks, size %d", name, len(resp.Msg.Tasks), size)
		}
		for _, task := range resp.Msg.Tasks {
			if seen[task.Id] {
				t.Fatalf("%s listed task %d twice", name, task.Id)
			}
			seen[task.Id] = true
			ids = append(ids, task.Id)
		}
		if req.PageToken = resp.Msg.NextPageToken; req.PageToken == "" {
			return ids, pages, nil
		}
		if pages > maxPages {
			t.Fatalf("%s: paging does not end", name)
		}
	}
}

// settle retries check until it passes, failing with its last complaint
// after timeout: a replica applies a claim a moment after its leader, so
// a list read from it shows the claim a moment later.
func settle(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sameIDs reports the difference between the ids listed and wanted.
func sameIDs(got []uint64, want map[uint64]bool) error {
	if len(got) == len(want) {
		ok := true
		for _, id := range got {
			ok = ok && want[id]
		}
		if ok {
			return nil
		}
	}
	g := slices.Sorted(slices.Values(got))
	return fmt.Errorf("listed %d tasks %v, want %d %v", len(got), g, len(want), slices.Sorted(maps.Keys(want)))
}

// TestClusterListsAcrossNodes: on 4 nodes with N=3 no node replicates
// every partition, yet ListTasks (in small pages) and CountTasks answer
// with every task from every node, filters included; the peer calls
// behind them refuse strangers and name bad fields; with a node down the
// other replicas answer, and with no replica of a partition up the calls
// fail UNAVAILABLE naming it.
func TestClusterListsAcrossNodes(t *testing.T) {
	ms := testClusterWith(t, 4, nil)
	ctx := context.Background()
	const P = 8
	for _, m := range ms {
		if m.node.replicatesAll(m.node.host.Ring()) {
			t.Fatalf("%s replicates every partition: nothing remote to list", m.cfg.NodeID)
		}
	}
	// Ids chosen by the test spread over every partition (the partition
	// function is fixed); w=3 puts each on every replica before the ack.
	all, inB := map[uint64]bool{}, map[uint64]bool{}
	parts := map[int]bool{}
	for i := range 60 {
		id, queue := uint64(1000+i), "a"
		if i%3 == 2 {
			queue = "b"
			inB[id] = true
		}
		all[id] = true
		parts[ring.Partition(id, P)] = true
		if _, err := ms[i%4].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
			Id: id, Task: &nornv1.TaskSpec{Queue: queue}, W: 3})); err != nil {
			t.Fatal(err)
		}
	}
	if len(parts) != P {
		t.Fatalf("the tasks cover %d of %d partitions", len(parts), P)
	}
	// 10 of queue a claimed, 4 of those completed.
	claimed := map[uint64]uint64{}
	for round := 0; len(claimed) < 10 && round < 50; round++ {
		resp, err := ms[round%4].api.Claim(ctx, connect.NewRequest(&nornv1.ClaimRequest{
			Queue: "a", Worker: "w", Max: uint32(10 - len(claimed)), Lease: durationpb.New(time.Minute), Wait: durationpb.New(time.Second)}))
		if connect.CodeOf(err) == connect.CodeUnavailable {
			// A partition between leaders (an election on a loaded
			// machine): the next round asks again.
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, ct := range resp.Msg.Tasks {
			claimed[ct.Task.Id] = ct.ClaimId
		}
	}
	if len(claimed) != 10 {
		t.Fatalf("claimed %d of 10", len(claimed))
	}
	live := map[uint64]bool{}
	done := 0
	for id, claim := range claimed {
		if done == 4 {
			live[id] = true
			continue
		}
		var err error
		waitFor(t, 10*time.Second, "a complete through a partition's leader", func() bool {
			_, err = ms[done%4].api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: id, ClaimId: claim, W: 3}))
			return connect.CodeOf(err) != connect.CodeUnavailable
		})
		if err != nil {
			t.Fatal(err)
		}
		done++
	}
	wantCounts := func(m *member, queue string, want map[string]uint64) error {
		resp, err := m.api.CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{Queue: queue}))
		if err != nil {
			return err
		}
		var total uint64
		for _, v := range want {
			total += v
		}
		got := resp.Msg.ByStatus
		maps.DeleteFunc(got, func(_ string, v uint64) bool { return v == 0 })
		if resp.Msg.Total != total || !maps.Equal(got, want) {
			return fmt.Errorf("%s counted queue %q: %d %v, want %d %v", m.cfg.NodeID, queue, resp.Msg.Total, got, total, want)
		}
		return nil
	}

	for _, m := range ms {
		// Everything, 7 to a page: ascending ids within each partition.
		ids, pages, err := listAll(t, m, &nornv1.ListTasksRequest{PageSize: 7})
		if err != nil {
			t.Fatalf("%s: %v", m.cfg.NodeID, err)
		}
		if err := sameIDs(ids, all); err != nil {
			t.Fatalf("%s: %v", m.cfg.NodeID, err)
		}
		if pages < 60/7 {
			t.Fatalf("%s listed 60 tasks in %d pages of 7", m.cfg.NodeID, pages)
		}
		// One to a page: every partition boundary ends a page.
		if ids, _, err := listAll(t, m, &nornv1.ListTasksRequest{PageSize: 1}); err != nil || sameIDs(ids, all) != nil {
			t.Fatalf("%s, one to a page: %v, %v", m.cfg.NodeID, sameIDs(ids, all), err)
		}
		for i := 1; i < len(ids); i++ {
			if pi, pj := ring.Partition(ids[i-1], P), ring.Partition(ids[i], P); pi > pj || (pi == pj && ids[i-1] > ids[i]) {
				t.Fatalf("%s listed %d (partition %d) before %d (partition %d)", m.cfg.NodeID, ids[i-1], pi, ids[i], pj)
			}
		}
		// A queue filter.
		ids, _, err = listAll(t, m, &nornv1.ListTasksRequest{Queue: "b", PageSize: 5})
		if err != nil {
			t.Fatal(err)
		}
		if err := sameIDs(ids, inB); err != nil {
			t.Fatalf("%s queue b: %v", m.cfg.NodeID, err)
		}
		// Status filters, once every replica applied the claims.
		settle(t, 10*time.Second, func() error {
			ids, _, err := listAll(t, m, &nornv1.ListTasksRequest{Queue: "a", Status: nornv1.TaskStatus_TASK_STATUS_CLAIMED, PageSize: 3})
			if err != nil {
				return err
			}
			if err := sameIDs(ids, live); err != nil {
				return fmt.Errorf("%s claimed in queue a: %v", m.cfg.NodeID, err)
			}
			return errors.Join(
				wantCounts(m, "", map[string]uint64{"READY": 50, "CLAIMED": 6, "COMPLETED": 4}),
				wantCounts(m, "a", map[string]uint64{"READY": 30, "CLAIMED": 6, "COMPLETED": 4}),
				wantCounts(m, "b", map[string]uint64{"READY": 20}))
		})
		ids, _, err = listAll(t, m, &nornv1.ListTasksRequest{Status: nornv1.TaskStatus_TASK_STATUS_COMPLETED})
		if err != nil || len(ids) != 4 {
			t.Fatalf("%s listed completed %v, %v", m.cfg.NodeID, ids, err)
		}
		// Newest first: descending ids across every partition and node,
		// in pages of any size, filters included.
		for _, c := range []struct {
			req  *nornv1.ListTasksRequest
			want map[uint64]bool
		}{
			{&nornv1.ListTasksRequest{NewestFirst: true, PageSize: 7}, all},
			{&nornv1.ListTasksRequest{NewestFirst: true, PageSize: 1}, all},
			{&nornv1.ListTasksRequest{NewestFirst: true, PageSize: 1000}, all},
			{&nornv1.ListTasksRequest{NewestFirst: true, Queue: "b", PageSize: 3}, inB},
			{&nornv1.ListTasksRequest{NewestFirst: true, Queue: "a", Status: nornv1.TaskStatus_TASK_STATUS_CLAIMED, PageSize: 2}, live},
		} {
			ids, _, err := listPages(t, m.cfg.NodeID, m.api, c.req, 200)
			if err != nil {
				t.Fatalf("%s newest first %v: %v", m.cfg.NodeID, c.req, err)
			}
			want := slices.Sorted(maps.Keys(c.want))
			slices.Reverse(want)
			if !slices.Equal(ids, want) {
				t.Fatalf("%s newest first %v:\n%v\nwant %v", m.cfg.NodeID, c.req, ids, want)
			}
		}
	}
	// A token of one order is refused by the other.
	first, err := ms[0].api.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{PageSize: 2}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ms[0].api.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{PageSize: 2, NewestFirst: true, PageToken: first.Msg.NextPageToken}))
	wantCode(t, err, connect.CodeInvalidArgument)

	t.Run("search", func(t *testing.T) { searchLists(t, ms, all, claimed, live) })

	t.Run("peer calls", func(t *testing.T) {
		n1 := ms[0].node
		hosted, remote := -1, -1
		for p := range P {
			if n1.group(uint16(p)) != nil && hosted < 0 {
				hosted = p
			}
			if n1.group(uint16(p)) == nil && remote < 0 {
				remote = p
			}
		}
		h, r := uint32(hosted), uint32(remote)
		// Strangers: no identity.
		_, err := ms[0].peer.ListPartition(ctx, connect.NewRequest(&nornv1.ListPartitionRequest{Partition: h, Limit: 1, MaxScan: 1, MaxBytes: 1}))
		wantCode(t, err, connect.CodePermissionDenied)
		_, err = ms[0].peer.CountPartitions(ctx, connect.NewRequest(&nornv1.CountPartitionsRequest{Partitions: []uint32{h}}))
		wantCode(t, err, connect.CodePermissionDenied)
		// A member's identity and a good request.
		resp, err := ms[0].peer.ListPartition(ctx, transport.Request(ms[1].node.peers, &nornv1.ListPartitionRequest{
			Partition: h, Limit: 100, MaxScan: 100, MaxBytes: 1 << 20}))
		if err != nil || len(resp.Msg.Tasks) == 0 || resp.Msg.Leader == "" {
			t.Fatalf("list partition %d: %v, %v", h, resp, err)
		}
		// A budget of 0 only says whether a task follows; a byte budget
		// stops after the task that reaches it.
		resp, err = ms[0].peer.ListPartition(ctx, transport.Request(ms[1].node.peers, &nornv1.ListPartitionRequest{Partition: h}))
		if err != nil || len(resp.Msg.Tasks) != 0 || resp.Msg.Scanned != 0 || !resp.Msg.More || resp.Msg.Next == 0 {
			t.Fatalf("list partition %d with no budget: %v, %v", h, resp, err)
		}
		resp, err = ms[0].peer.ListPartition(ctx, transport.Request(ms[1].node.peers, &nornv1.ListPartitionRequest{
			Partition: h, Limit: 100, MaxScan: 100, MaxBytes: 1}))
		if err != nil || len(resp.Msg.Tasks) != 1 || resp.Msg.Scanned != 1 || !resp.Msg.More {
			t.Fatalf("list partition %d with 1 byte: %v, %v", h, resp, err)
		}
		// Bad fields, each named.
		list := func(m *nornv1.ListPartitionRequest) error {
			_, err := ms[0].peer.ListPartition(ctx, transport.Request(ms[1].node.peers, m))
			return err
		}
		count := func(m *nornv1.CountPartitionsRequest) error {
			_, err := ms[0].peer.CountPartitions(ctx, transport.Request(ms[1].node.peers, m))
			return err
		}
		for _, c := range []struct {
			err   error
			code  connect.Code
			field string
		}{
			{list(&nornv1.ListPartitionRequest{Partition: P}), connect.CodeInvalidArgument, "partition"},
			{list(&nornv1.ListPartitionRequest{Partition: r}), connect.CodeFailedPrecondition, "partition"},
			{list(&nornv1.ListPartitionRequest{Partition: h, Limit: coord.MaxPageSize + 1}), connect.CodeInvalidArgument, "limit"},
			{list(&nornv1.ListPartitionRequest{Partition: h, MaxScan: coord.MaxScanPerPage + 1}), connect.CodeInvalidArgument, "maxScan"},
			{list(&nornv1.ListPartitionRequest{Partition: h, MaxBytes: coord.MaxPageBytes + 1}), connect.CodeInvalidArgument, "maxBytes"},
			{list(&nornv1.ListPartitionRequest{Partition: h, Queue: "no spaces"}), connect.CodeInvalidArgument, "queue"},
			{list(&nornv1.ListPartitionRequest{Partition: h, Status: 99}), connect.CodeInvalidArgument, "status"},
			{list(&nornv1.ListPartitionRequest{NewestFirst: true}), connect.CodeInvalidArgument, "partitions"},
			{list(&nornv1.ListPartitionRequest{NewestFirst: true, Partitions: []uint32{r}}), connect.CodeFailedPrecondition, "partitions[0]"},
			{list(&nornv1.ListPartitionRequest{NewestFirst: true, Partitions: []uint32{h, h}}), connect.CodeInvalidArgument, "partitions[1]"},
			{count(&nornv1.CountPartitionsRequest{}), connect.CodeInvalidArgument, "partitions"},
			{count(&nornv1.CountPartitionsRequest{Partitions: []uint32{h, P}}), connect.CodeInvalidArgument, "partitions[1]"},
			{count(&nornv1.CountPartitionsRequest{Partitions: []uint32{h, h}}), connect.CodeInvalidArgument, "partitions[1]"},
			{count(&nornv1.CountPartitionsRequest{Partitions: []uint32{r}}), connect.CodeFailedPrecondition, "partitions[0]"},
			{count(&nornv1.CountPartitionsRequest{Partitions: []uint32{h}, Queue: "no spaces"}), connect.CodeInvalidArgument, "queue"},
		} {
			var ce *connect.Error
			if !errors.As(c.err, &ce) || ce.Code() != c.code || !strings.HasPrefix(ce.Message(), c.field+": ") {
				t.Errorf("want %v naming %s, got %v", c.code, c.field, c.err)
			}
		}
	})

	t.Run("replicas down", func(t *testing.T) {
		// One node down: every partition keeps two replicas, which answer
		// (also for partitions whose reported leader was the stopped node).
		ms[3].stop()
		for _, m := range ms[:3] {
			ids, _, err := listAll(t, m, &nornv1.ListTasksRequest{PageSize: 50})
			if err != nil {
				t.Fatalf("%s with n4 down: %v", m.cfg.NodeID, err)
			}
			if err := sameIDs(ids, all); err != nil {
				t.Fatalf("%s with n4 down: %v", m.cfg.NodeID, err)
			}
			resp, err := m.api.CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{}))
			if err != nil || resp.Msg.Total != uint64(len(all)) {
				t.Fatalf("%s counted with n4 down: %v, %v", m.cfg.NodeID, resp, err)
			}
		}
		// n1 alone: the partitions it does not replicate have no replica.
		ms[1].stop()
		ms[2].stop()
		var missing []string
		for p := range P {
			if ms[0].node.group(uint16(p)) == nil {
				missing = append(missing, fmt.Sprintf("partition %d:", p))
			}
		}
		names := func(err error) bool {
			return slices.ContainsFunc(missing, func(s string) bool { return strings.Contains(apierr.Message(err), s) })
		}
		_, _, err := listAll(t, ms[0], &nornv1.ListTasksRequest{})
		if connect.CodeOf(err) != connect.CodeUnavailable || !names(err) {
			t.Fatalf("list with the other replicas down: %v (want UNAVAILABLE naming one of %v)", err, missing)
		}
		_, err = ms[0].api.CountTasks(ctx, connect.NewRequest(&nornv1.CountTasksRequest{}))
		if connect.CodeOf(err) != connect.CodeUnavailable || !names(err) {
			t.Fatalf("count with the other replicas down: %v (want UNAVAILABLE naming one of %v)", err, missing)
		}
	})
}

// replicatesAll reports whether this node replicates every partition.
func (n *Node) replicatesAll(r *cluster.Ring) bool {
	for p := range r.Partitions {
		if !r.Hosts(p, n.cfg.NodeID) {
			return false
		}
	}
	return true
}

// TestListQueueAmongOthers (issue 42 item 6): a queue's tasks are listed
// from its index, not found by scanning every queue's. With 30,000 tasks
// of queue big on one node (8 partitions, about 3,750 each) and 3 of
// queue small in the last partitions, the first page of small holds all
// 3 and ends the list (a page used to examine at most 10,000 tasks of
// any queue: partitions 0 to 2, none of small's), with a status filter
// too; paging through big lists each of its tasks once.
func TestListQueueAmongOthers(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	const P, big = 8, 30_000
	specs := make([]*nornv1.TaskSpec, 10_000)
	for i := range specs {
		specs[i] = &nornv1.TaskSpec{Queue: "big"}
	}
	for range big / len(specs) {
		if _, err := h.api.EnqueueBatch(ctx, connect.NewRequest(&nornv1.EnqueueBatchRequest{Tasks: specs})); err != nil {
			t.Fatal(err)
		}
	}
	// small's tasks in partitions 5, 6 and 7, after big's ids.
	small, used := map[uint64]bool{}, map[int]bool{}
	for id := uint64(1) << 62; len(small) < 3; id++ {
		if p := ring.Partition(id, P); p >= 5 && !used[p] {
			used[p] = true
			if _, err := h.api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Id: id, Task: &nornv1.TaskSpec{Queue: "small"}})); err != nil {
				t.Fatal(err)
			}
			small[id] = true
		}
	}
	for _, status := range []nornv1.TaskStatus{nornv1.TaskStatus_TASK_STATUS_UNSPECIFIED, nornv1.TaskStatus_TASK_STATUS_READY} {
		resp, err := h.api.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{Queue: "small", Status: status}))
		if err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for _, task := range resp.Msg.Tasks {
			got = append(got, task.Id)
		}
		if err := sameIDs(got, small); err != nil || resp.Msg.NextPageToken != "" {
			t.Fatalf("first page of small (status %v): %v, next page token %q", status, err, resp.Msg.NextPageToken)
		}
	}
	// A status filter examines small's tasks only: a status none has is
	// an empty last page at once.
	resp, err := h.api.ListTasks(ctx, connect.NewRequest(&nornv1.ListTasksRequest{Queue: "small", Status: nornv1.TaskStatus_TASK_STATUS_COMPLETED}))
	if err != nil || len(resp.Msg.Tasks) != 0 || resp.Msg.NextPageToken != "" {
		t.Fatalf("completed tasks of small: %v, %v", resp, err)
	}
	// big in pages of 1,000: every task once, in whole pages (a page goes
	// on into the next partition).
	ids, pages, err := listPages(t, "n1", h.api, &nornv1.ListTasksRequest{Queue: "big", PageSize: 1000}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != big || pages != big/1000 {
		t.Fatalf("listed %d tasks of big in %d pages, want %d in %d", len(ids), pages, big, big/1000)
	}
	for id := range small {
		if slices.Contains(ids, id) {
			t.Fatalf("big listed task %d of small", id)
		}
	}
}
