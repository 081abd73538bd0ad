package node

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// searchLists checks ListTasks' search filters on every node of ms (of
// TestClusterListsAcrossNodes, whose tasks are all, claimed by worker w
// and live among them), in both orders and in pages of any size: the
// tasks depending on one, with a payload holding some bytes, claimed by
// a worker, with an error text. It adds its tasks to all.
func searchLists(t *testing.T, ms []*member, all map[uint64]bool, claimed map[uint64]uint64, live map[uint64]bool) {
	ctx := context.Background()
	enqueue := func(id uint64, payload string, deps ...uint64) {
		t.Helper()
		if _, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Id: id, W: 3,
			Task: &nornv1.TaskSpec{Queue: "s", Payload: []byte(payload), DependsOn: deps}})); err != nil {
			t.Fatal(err)
		}
		all[id] = true
	}
	enqueue(5000, `{"user":"needle-7"}`)
	for id := uint64(5001); id <= 5003; id++ {
		enqueue(id, "plain", 5000)
	}
	enqueue(5004, "x needle-7 y", 1000, 5000)
	enqueue(5005, "plain", 1000)
	// One of the live claims aborted with an error.
	var aborted uint64
	for id := range live {
		aborted = id
		break
	}
	waitFor(t, 10*time.Second, "an abort through a partition's leader", func() bool {
		_, err := ms[0].api.Abort(ctx, connect.NewRequest(&nornv1.AbortRequest{Id: aborted, ClaimId: claimed[aborted], W: 3,
			Errors: []*nornv1.TaskError{{Code: "disk_full", Description: "over the xyz quota"}}}))
		if err != nil && connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatal(err)
		}
		return err == nil
	})
	set := func(ids ...uint64) map[uint64]bool {
		m := map[uint64]bool{}
		for _, id := range ids {
			m[id] = true
		}
		return m
	}
	for _, m := range ms {
		for _, c := range []struct {
			req  *nornv1.ListTasksRequest
			want map[uint64]bool
		}{
			{&nornv1.ListTasksRequest{DependsOn: 5000, PageSize: 1}, set(5001, 5002, 5003, 5004)},
			{&nornv1.ListTasksRequest{DependsOn: 1000, Queue: "s"}, set(5004, 5005)},
			{&nornv1.ListTasksRequest{DependsOn: 1000, Queue: "a"}, set()},
			{&nornv1.ListTasksRequest{PayloadContains: []byte("needle-7"), PageSize: 3}, set(5000, 5004)},
			{&nornv1.ListTasksRequest{PayloadContains: []byte("needle-7"), DependsOn: 5000}, set(5004)},
			{&nornv1.ListTasksRequest{Worker: "w", PageSize: 4}, maps.Collect(func(yield func(uint64, bool) bool) {
				for id := range claimed {
					yield(id, true)
				}
			})},
			{&nornv1.ListTasksRequest{Worker: "nobody"}, set()},
			{&nornv1.ListTasksRequest{ErrorContains: "xyz quota"}, set(aborted)},
			{&nornv1.ListTasksRequest{ErrorContains: "disk_full", Status: nornv1.TaskStatus_TASK_STATUS_ABORTED}, set(aborted)},
		} {
			for _, newest := range []bool{false, true} {
				c.req.NewestFirst = newest
				settle(t, 10*time.Second, func() error {
					ids, _, err := listPages(t, m.cfg.NodeID, m.api, c.req, 200)
					if err != nil {
						return err
					}
					if newest && !slices.IsSortedFunc(ids, func(a, b uint64) int { return cmp.Compare(b, a) }) {
						return errors.New(m.cfg.NodeID + ": newest first not in descending order")
					}
					if err := sameIDs(ids, c.want); err != nil {
						return errors.New(m.cfg.NodeID + " " + c.req.String() + ": " + err.Error())
					}
					return nil
				})
			}
		}
	}
	long := strings.Repeat("x", 1025)
	for _, c := range []struct {
		req   *nornv1.ListTasksRequest
		field string
	}{
		{&nornv1.ListTasksRequest{Worker: long[:257]}, "worker"},
		{&nornv1.ListTasksRequest{ErrorContains: long}, "errorContains"},
		{&nornv1.ListTasksRequest{PayloadContains: []byte(long), NewestFirst: true}, "payloadContains"},
	} {
		_, err := ms[1].api.ListTasks(ctx, connect.NewRequest(c.req))
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument || !strings.HasPrefix(ce.Message(), c.field+": ") {
			t.Errorf("want INVALID_ARGUMENT naming %s, got %v", c.field, err)
		}
	}
}
