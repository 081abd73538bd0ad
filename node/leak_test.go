package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/access"
	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/transport"
)

// TestRefusalDoesNotTellWhetherATaskExists: for every call that names a
// task by id (and an enqueue naming one in dependsOn), a caller granted
// one queue gets the same answer for a task of another queue as for a
// task that does not exist: the same code, the same message but for the
// id, the same details. (Before, the two paths printed the id
// differently, "task [5555]" against "task 5556", and dependsOn refused
// a missing task with another answer.)
func TestRefusalDoesNotTellWhetherATaskExists(t *testing.T) {
	h, tok, admTok := aliceAndRoot(t)
	ctx := context.Background()
	theirs := func() uint64 {
		req := connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "theirs"}})
		req.Header().Set("Authorization", "Bearer "+admTok)
		r, err := h.api.Enqueue(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.Id
	}()
	missing := theirs + 1_000_000
	calls := map[string]func(id uint64) error{
		"GetTask": func(id uint64) error {
			return call(h.api.GetTask, ctx, tok, &nornv1.GetTaskRequest{Id: id})
		},
		"Cancel": func(id uint64) error { return call(h.api.Cancel, ctx, tok, &nornv1.CancelRequest{Id: id}) },
		"Renew":  func(id uint64) error { return call(h.api.Renew, ctx, tok, &nornv1.RenewRequest{Id: id, ClaimId: 9}) },
		"Update": func(id uint64) error {
			return call(h.api.Update, ctx, tok, &nornv1.UpdateRequest{Id: id, ClaimId: 9, Seq: 1})
		},
		"Complete": func(id uint64) error {
			return call(h.api.Complete, ctx, tok, &nornv1.CompleteRequest{Id: id, ClaimId: 9})
		},
		"Abort": func(id uint64) error {
			return call(h.api.Abort, ctx, tok, &nornv1.AbortRequest{Id: id, ClaimId: 9, Errors: []*nornv1.TaskError{{Code: "x"}}})
		},
		"Yield": func(id uint64) error { return call(h.api.Yield, ctx, tok, &nornv1.YieldRequest{Id: id, ClaimId: 9}) },
		"CompleteBatch": func(id uint64) error {
			return call(h.api.CompleteBatch, ctx, tok, &nornv1.CompleteBatchRequest{Completions: []*nornv1.CompleteRequest{{Id: id, ClaimId: 9}}})
		},
		"Enqueue dependsOn": func(id uint64) error {
			return call(h.api.Enqueue, ctx, tok, &nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "mine", DependsOn: []uint64{id}}})
		},
		"EnqueueBatch dependsOn": func(id uint64) error {
			return call(h.api.EnqueueBatch, ctx, tok, &nornv1.EnqueueBatchRequest{Tasks: []*nornv1.TaskSpec{{Queue: "mine", DependsOn: []uint64{id}}}})
		},
	}
	for name, fn := range calls {
		a, b := fn(theirs), fn(missing)
		if a == nil || b == nil {
			t.Errorf("%s: answered %v and %v, want both refused", name, a, b)
			continue
		}
		same := func(err error, id uint64) string {
			var ce *connect.Error
			if !errors.As(err, &ce) {
				return err.Error()
			}
			return fmt.Sprintf("%v|%s|%d", ce.Code(), strings.ReplaceAll(ce.Message(), fmt.Sprint(id), "ID"), len(ce.Details()))
		}
		if sa, sb := same(a, theirs), same(b, missing); sa != sb {
			t.Errorf("%s: a task of another queue: %s\n\ta missing task: %s", name, sa, sb)
		} else if connect.CodeOf(a) != connect.CodePermissionDenied {
			t.Errorf("%s: %v, want PERMISSION_DENIED", name, a)
		}
	}
}

// aliceAndRoot starts a node with an access file: alice may produce,
// work and read on queue "mine" (tok), root is an admin (admTok).
func aliceAndRoot(t *testing.T) (h *harness, tok, admTok string) {
	t.Helper()
	return aliceAndRootWith(t, nil)
}

// aliceAndRootWith is aliceAndRoot with the node's config changed by tune
// (nil: unchanged).
func aliceAndRootWith(t *testing.T, tune func(*Config)) (h *harness, tok, admTok string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth.json")
	tok, entry := access.NewToken("alice", time.Now())
	admTok, admEntry := access.NewToken("root", time.Now())
	mine := []string{"mine"}
	f := &access.File{
		Users: map[string]access.User{
			"alice": {Grants: []access.Grant{{Role: access.RoleProducer, Queues: mine}, {Role: access.RoleWorker, Queues: mine}, {Role: access.RoleReader, Queues: mine}}},
			"root":  {Grants: []access.Grant{{Role: access.RoleAdmin}}},
		},
		Tokens: []access.TokenEntry{entry, admEntry},
	}
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	rules, err := access.LoadRules(path)
	if err != nil {
		t.Fatal(err)
	}
	return newHarnessWith(t, t.TempDir(), nil, func(c *Config) {
		c.Auth = rules
		if tune != nil {
			tune(c)
		}
	}), tok, admTok
}

// call makes one call of f with msg as the holder of token.
func call[Req, Resp any](f func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), ctx context.Context, token string, msg *Req) error {
	req := connect.NewRequest(msg)
	req.Header().Set("Authorization", "Bearer "+token)
	_, err := f(ctx, req)
	return err
}

// TestStatusShowsEveryNodesAccessControl: every node's Status shows, per
// node, whether it enforces an access file and which (its digest), as the
// node gossips it, so that a node restarted without the others' settings
// shows (issue 42: one node of a cluster restarted without -auth-file
// took any certificate while the others enforced roles).
func TestStatusShowsEveryNodesAccessControl(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	f := &access.File{Users: map[string]access.User{"root": {Grants: []access.Grant{{Role: access.RoleAdmin}}}}}
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	rules, err := access.LoadRules(path)
	if err != nil {
		t.Fatal(err)
	}
	ms := testClusterWith(t, 3, func(i int, cfg *Config) {
		if i < 2 {
			cfg.Auth = rules
		}
	})
	// n3 enforces nothing: ask it, without credentials.
	waitFor(t, 20*time.Second, "every node's access control in n3's Status", func() bool {
		got := map[string]string{}
		for _, st := range ms[2].node.server.NodeStatuses() {
			if sec := st.GetSecurity(); sec != nil {
				got[st.Id] = fmt.Sprint(sec.GetAccessControl(), sec.GetAccessDigest())
			}
		}
		want := fmt.Sprint(true, rules.Digest())
		return len(rules.Digest()) == 12 && got["n1"] == want && got["n2"] == want && got["n3"] == "false"
	})
}

// The headers of node-to-node calls (transport.StripPeerHeaders) are a
// node's alone: a worker that sets them on its claim (as if forwarded,
// naming the task it takes) gets an ordinary claim, the queue's highest
// priority task first, not the task it named; one that names the node
// as its caller is still held to its grants.
func TestClientCannotForgeForwarding(t *testing.T) {
	h, tok, _ := aliceAndRoot(t)
	ctx := context.Background()
	enqueue := func(priority int32) uint64 {
		req := connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "mine", Priority: priority}})
		req.Header().Set("Authorization", "Bearer "+tok)
		resp, err := h.api.Enqueue(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Id
	}
	low, high := enqueue(0), enqueue(5)
	req := connect.NewRequest(&nornv1.ClaimRequest{Queue: "mine", Worker: "w"})
	req.Header().Set("Authorization", "Bearer "+tok)
	req.Header().Set(transport.HeaderHops, "1")
	req.Header().Set(transport.HeaderClaimIDs, transport.FormatIDs([]uint64{low}))
	resp, err := h.api.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Msg.Tasks) != 1 || resp.Msg.Tasks[0].Task.Id != high {
		t.Fatalf("a worker's claim naming %d (priority 0) got %v, want %d (priority 5): its forwarding headers were taken", low, resp.Msg.Tasks, high)
	}
	// Nor does naming a node make the caller one (over cleartext a node
	// is known by name and address, and the caller is on the node's
	// host): a call naming the node it reaches is a client's.
	other := connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "other"}})
	other.Header().Set("Authorization", "Bearer "+tok)
	other.Header().Set(transport.HeaderNode, h.node.cfg.NodeID)
	if _, err := h.api.Enqueue(ctx, other); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("alice's enqueue into another queue naming node %s: %v, want PERMISSION_DENIED", h.node.cfg.NodeID, err)
	}
}

// A cluster in cleartext with an access file forwards its clients' calls:
// a node knows a peer's forwarded TaskService call as it knows a
// PeerService caller (its name and address), so a claim through one node
// gets the tasks the other nodes lead, and completes through it reach
// their leaders. (Before, the peers refused the forwarded calls
// UNAUTHENTICATED: a claim got only the tasks its own node led.)
func TestCleartextAccessFileForwards(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	tok, entry := access.NewToken("alice", time.Now())
	f := &access.File{
		Users:  map[string]access.User{"alice": {Grants: []access.Grant{{Role: access.RoleProducer, Queues: []string{"q"}}, {Role: access.RoleWorker, Queues: []string{"q"}}}}},
		Tokens: []access.TokenEntry{entry},
	}
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	rules, err := access.LoadRules(path)
	if err != nil {
		t.Fatal(err)
	}
	ms := testClusterWith(t, 3, func(_ int, cfg *Config) { cfg.Auth = rules })
	ctx := context.Background()
	const n = 20
	for range n {
		if err := call(ms[0].api.Enqueue, ctx, tok, &nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q"}, W: 3}); err != nil {
			t.Fatal(err)
		}
	}
	var got []*nornv1.ClaimedTask
	waitFor(t, 10*time.Second, "every task claimed through n1", func() bool {
		req := connect.NewRequest(&nornv1.ClaimRequest{Queue: "q", Worker: "w", Max: n})
		req.Header().Set("Authorization", "Bearer "+tok)
		resp, err := ms[0].api.Claim(ctx, req)
		if err == nil {
			got = append(got, resp.Msg.Tasks...)
		}
		return len(got) == n
	})
	led := map[string]bool{}
	for _, ct := range got {
		led[ct.Leader] = true
		if err := call(ms[0].api.Complete, ctx, tok, &nornv1.CompleteRequest{Id: ct.Task.Id, ClaimId: ct.ClaimId}); err != nil {
			t.Fatalf("complete of task %d (led by %s) through n1: %v", ct.Task.Id, ct.Leader, err)
		}
	}
	if len(led) < 2 {
		t.Fatalf("the tasks' leaders: %v; want tasks led by other nodes than n1", led)
	}
}
