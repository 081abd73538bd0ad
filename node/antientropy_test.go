package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// TestAntiEntropyRepairsReplicas: states that reached only one replica
// (written straight into its store, as after a missed replication) and a
// terminal event only one replica holds spread to every replica of the
// partition by anti-entropy alone; Status then shows every partition's
// replicas agreeing, and the metrics count the transfers.
func TestAntiEntropyRepairsReplicas(t *testing.T) {
	ms := testClusterWith(t, 3, func(_ int, cfg *Config) {
		cfg.AntiEntropyInterval = 100 * time.Millisecond
		cfg.AntiEntropySettle = 10 * time.Millisecond
	})
	ctx := context.Background()
	// A task every replica holds (a normal enqueue with W=3)...
	r, err := ms[0].api.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q", Payload: []byte("all")}, W: 3}))
	if err != nil {
		t.Fatal(err)
	}
	shared := r.Msg.Id
	p := ms[0].node.partition(shared)
	// ...cancelled on n2's replica only.
	cancel := &crdt.Task{ID: shared, Terminals: []crdt.Terminal{{At: crdt.Timestamp{WallMs: time.Now().UnixMilli(), Node: 9}, Kind: crdt.Cancelled}}}
	if _, err := ms[1].node.store.MergeTask(p, cancel); err != nil {
		t.Fatal(err)
	}
	// Tasks only n1 holds, in several partitions.
	var only []uint64
	for i := range 40 {
		id := uint64(1_000_000 + i*7919)
		task := &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: "q", Payload: []byte(fmt.Sprint("only-", i)),
			CreatedAt: crdt.Timestamp{WallMs: time.Now().UnixMilli(), Node: 1}}}
		if _, err := ms[0].node.store.MergeTask(ms[0].node.partition(id), task); err != nil {
			t.Fatal(err)
		}
		only = append(only, id)
	}
	digest := func(m *member, id uint64) uint64 {
		st, err := m.node.store.GetTask(m.node.partition(id), id)
		if errors.Is(err, storage.ErrNotFound) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return st.Digest
	}
	waitFor(t, 20*time.Second, "every replica to hold every task, equal", func() bool {
		for _, id := range append([]uint64{shared}, only...) {
			d := digest(ms[0], id)
			if d == 0 || digest(ms[1], id) != d || digest(ms[2], id) != d {
				return false
			}
		}
		return true
	})
	st, _ := ms[2].node.store.TaskState(p, shared)
	if _, terminal := st.Terminal(); !terminal {
		t.Fatalf("the cancel did not reach n3: %+v", st)
	}
	waitFor(t, 20*time.Second, "Status to show every partition's replicas agreeing", func() bool {
		admin := nornv1connect.NewAdminServiceClient(http.DefaultClient, "http://"+ms[2].cfg.APIAddr)
		s, err := admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, ps := range s.Msg.Partitions {
			if !ps.ReplicasAgree || len(ps.ReplicaRoots) != 3 {
				return false
			}
		}
		return true
	})
	// n1's 40 tasks reached two replicas, the cancel two: at least 82
	// transfers, each counted once as a push or a pull. A round records
	// its counts when it ends, after its merges: wait for them.
	var pushed, pulled int
	waitFor(t, 10*time.Second, "anti-entropy metrics to count at least 82 transfers", func() bool {
		pushed, pulled = 0, 0
		for _, m := range ms {
			resp, err := http.Get("http://" + m.cfg.APIAddr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			pushed += metricValue(t, body, "norn_antientropy_tasks_pushed_total")
			pulled += metricValue(t, body, "norn_antientropy_tasks_pulled_total")
		}
		return pushed+pulled >= 82
	})
}

func metricValue(t *testing.T, body []byte, name string) int {
	t.Helper()
	for line := range bytes.Lines(body) {
		s := strings.TrimSpace(string(line))
		if v, ok := strings.CutPrefix(s, name+" "); ok {
			var n int
			if _, err := fmt.Sscan(v, &n); err != nil {
				t.Fatalf("metric %s: %q", name, s)
			}
			return n
		}
	}
	t.Fatalf("metric %s missing", name)
	return 0
}
