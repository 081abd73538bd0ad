package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
)

// startCluster starts three nornd processes that form a cluster (P=8,
// N=3) on free ports and waits until each is healthy. It returns their
// API addresses.
func startCluster(t *testing.T) []string {
	t.Helper()
	addrs := freeAddrs(t, 9)
	api := []string{addrs[0], addrs[3], addrs[6]}
	var ps []*norndProcess
	for i := range 3 {
		var join []string
		for j := range 3 {
			if j != i {
				join = append(join, addrs[3*j+2])
			}
		}
		ps = append(ps, launchNornd(t, "-node-id", fmt.Sprintf("n%d", i+1), "-machine-id", strconv.Itoa(i+1), "-data-dir", t.TempDir(),
			"-listen", api[i], "-raft-addr", addrs[3*i+1], "-gossip-addr", addrs[3*i+2],
			"-bootstrap-expect", "3", "-join", strings.Join(join, ","), "-raft-timeout", "300ms", "-write-timeout", "2s"))
	}
	for _, p := range ps {
		p.waitReady(t)
	}
	return api
}

// newTestClient is a client of the nodes at addrs, closed at the end.
func newTestClient(t *testing.T, addrs ...string) *client.Client {
	t.Helper()
	c, err := client.New(strings.Join(addrs, ","), client.WithTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// claimOne claims the task id of queue (the only ready one) and returns
// its claim id.
func claimOne(t *testing.T, c *client.Client, queue string, id uint64) uint64 {
	t.Helper()
	got, err := c.Claim(context.Background(), client.ClaimRequest{Queue: queue, Worker: "w", Lease: time.Minute, Max: 1, Wait: 5 * time.Second})
	if err != nil || len(got) != 1 || got[0].GetTask().GetId() != id {
		t.Fatalf("claim %s: %v, %v; want task %d", queue, got, err, id)
	}
	return got[0].GetClaimId()
}

// enqueueMix stores tasks of every status on the cluster of c and returns
// their ids by status: COMPLETED (with an update and a result), ABORTED
// (errors), CANCELLED, CLAIMED, READY (two, one with a priority) and
// DELAYED (a not_before an hour ahead, and one depending on a ready task).
func enqueueMix(t *testing.T, c *client.Client) map[string][]uint64 {
	t.Helper()
	ctx := context.Background()
	ids := map[string][]uint64{}
	enqueue := func(status string, spec *nornv1.TaskSpec) uint64 {
		id, err := c.Enqueue(ctx, spec)
		if err != nil {
			t.Fatalf("enqueue %v: %v", spec, err)
		}
		ids[status] = append(ids[status], id)
		return id
	}
	// One queue per task that is claimed, so that each claim takes it.
	done := enqueue("COMPLETED", &nornv1.TaskSpec{Queue: "done", Payload: []byte("p1"), MaxClaims: 3})
	claim := claimOne(t, c, "done", done)
	if err := c.Update(ctx, &nornv1.UpdateRequest{Id: done, ClaimId: claim, Seq: 1, Progress: 0.5, Message: "half", Data: []byte("ckpt")}); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(ctx, done, claim, []byte("result-1")); err != nil {
		t.Fatal(err)
	}
	aborted := enqueue("ABORTED", &nornv1.TaskSpec{Queue: "bad", Payload: []byte("p2")})
	if err := c.Abort(ctx, aborted, claimOne(t, c, "bad", aborted), &nornv1.TaskError{Code: "out_of_disk", Description: "no space", Args: []string{"/tmp"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Cancel(ctx, enqueue("CANCELLED", &nornv1.TaskSpec{Queue: "emails", Payload: []byte("p3")})); err != nil {
		t.Fatal(err)
	}
	held := enqueue("CLAIMED", &nornv1.TaskSpec{Queue: "held", Payload: []byte("p4")})
	claimOne(t, c, "held", held)
	ready := enqueue("READY", &nornv1.TaskSpec{Queue: "emails", Payload: []byte("p5"), Priority: 7})
	enqueue("READY", &nornv1.TaskSpec{Queue: "other", Payload: nil})
	enqueue("DELAYED", &nornv1.TaskSpec{Queue: "later", Payload: []byte("p6"), NotBefore: timestamppb.New(time.Now().Add(time.Hour).Truncate(time.Millisecond))})
	enqueue("DELAYED", &nornv1.TaskSpec{Queue: "later", DependsOn: []uint64{ready}})
	return ids
}

// getTask reads id from c, failing the test on an error.
func getTask(t *testing.T, c *client.Client, id uint64) *nornv1.Task {
	t.Helper()
	task, err := c.GetTask(context.Background(), id)
	if err != nil {
		t.Fatalf("get %d: %v", id, err)
	}
	return task
}

// wantImported is what the import of exported task src must read back:
// the same id, spec, creation time; a terminal task with its status,
// finish time, result, errors, updates and progress; any other task READY
// or DELAYED as it was enqueued (a CLAIMED one READY), without updates.
func wantImported(src *nornv1.Task) *nornv1.Task {
	want := &nornv1.Task{Id: src.GetId(), Spec: src.GetSpec(), CreatedAt: src.GetCreatedAt(), Status: src.GetStatus()}
	switch src.GetStatus() {
	case nornv1.TaskStatus_TASK_STATUS_COMPLETED, nornv1.TaskStatus_TASK_STATUS_ABORTED, nornv1.TaskStatus_TASK_STATUS_CANCELLED:
		want.FinishedAt, want.Result, want.Errors = src.GetFinishedAt(), src.GetResult(), src.GetErrors()
		want.Updates, want.Progress = src.GetUpdates(), src.GetProgress()
	case nornv1.TaskStatus_TASK_STATUS_CLAIMED:
		want.Status = nornv1.TaskStatus_TASK_STATUS_READY
	}
	return want
}

// equalTasks compares two tasks but for their updatedAt and, with
// ignoreExpiry, their claims' expiries.
func equalTasks(a, b *nornv1.Task, ignoreExpiry bool) bool {
	a, b = proto.CloneOf(a), proto.CloneOf(b)
	for _, t := range []*nornv1.Task{a, b} {
		t.UpdatedAt = nil
		if ignoreExpiry {
			for _, c := range append(t.GetClaims(), t.GetCurrentClaim()) {
				if c != nil {
					c.Expiry = nil
				}
			}
		}
	}
	return proto.Equal(a, b)
}

// settledTasks reads the tasks ids until two reads 300 ms apart agree
// (the claim FSM's background ends recorded), at most for 10 s.
func settledTasks(t *testing.T, c *client.Client, ids []uint64) map[uint64]*nornv1.Task {
	t.Helper()
	read := func() map[uint64]*nornv1.Task {
		out := map[uint64]*nornv1.Task{}
		for _, id := range ids {
			out[id] = getTask(t, c, id)
		}
		return out
	}
	prev := read()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		cur, same := read(), true
		for _, id := range ids {
			same = same && equalTasks(prev[id], cur[id], true)
		}
		if same {
			return cur
		}
		prev = cur
	}
	t.Fatalf("the tasks kept changing for 10 s")
	return nil
}

// TestExportImport is the round trip of issue 20 on real processes:
// tasks of every status on a 3-node cluster, exported with nornctl,
// imported with nornctl into a fresh 3-node cluster, every task compared;
// the import run again changes nothing; the imported tasks work.
func TestExportImport(t *testing.T) {
	src := startCluster(t)
	cs := newTestClient(t, src...)
	ids := enqueueMix(t, cs)
	var all []uint64
	for _, s := range []string{"COMPLETED", "ABORTED", "CANCELLED", "CLAIMED", "READY", "DELAYED"} {
		all = append(all, ids[s]...)
	}
	before := map[uint64]*nornv1.Task{}
	for _, id := range all {
		before[id] = getTask(t, cs, id)
	}
	for status, list := range ids {
		for _, id := range list {
			if got := strings.TrimPrefix(before[id].GetStatus().String(), statusPrefix); got != status {
				t.Fatalf("source task %d is %s, want %s (the test's setup)", id, got, status)
			}
		}
	}

	file := filepath.Join(t.TempDir(), "tasks.jsonl")
	r := nornctl(t, src[1], "", "export", file)
	if r.code != 0 {
		t.Fatalf("export: exit %d: %s", r.code, r.stderr)
	}
	mustContain(t, "export's stderr", r.stderr, fmt.Sprintf("exported %d tasks", len(all)))
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != len(all) {
		t.Fatalf("export wrote %d lines, want %d:\n%s", len(lines), len(all), b)
	}
	for _, l := range lines {
		if strings.Contains(l, `"claims"`) || strings.Contains(l, `"currentClaim"`) {
			t.Errorf("an exported line has claims: %s", l)
		}
	}
	// --queue narrows the export.
	r = nornctl(t, src[0], "", "export", "--queue", "emails", "-")
	if n := strings.Count(r.stdout, "\n"); r.code != 0 || n != 2 {
		t.Errorf("export --queue emails -: exit %d, %d lines, want 2 (a READY and a CANCELLED task):\n%s%s", r.code, n, r.stdout, r.stderr)
	}

	dst := startCluster(t)
	cd := newTestClient(t, dst...)
	mustContain(t, "import", ok(t, dst[2], "import", file), fmt.Sprintf("imported %d tasks", len(all)))
	imported := map[uint64]*nornv1.Task{}
	for _, id := range all {
		got := getTask(t, cd, id)
		imported[id] = got
		want := wantImported(before[id])
		// updatedAt follows the claims, which are not imported.
		if !equalTasks(want, got, false) {
			t.Errorf("task %d imported:\n got %v\nwant %v", id, got, want)
		}
		if len(got.GetClaims()) != 0 {
			t.Errorf("task %d: imported with claims %v", id, got.GetClaims())
		}
	}

	// Again: nothing changes.
	mustContain(t, "second import", ok(t, dst[0], "import", file), fmt.Sprintf("imported %d tasks", len(all)))
	for _, id := range all {
		if got := getTask(t, cd, id); !proto.Equal(got, imported[id]) {
			t.Errorf("task %d changed with the second import:\n was %v\n now %v", id, imported[id], got)
		}
	}
	count, err := cd.CountTasks(context.Background(), "")
	if err != nil || count.GetTotal() != uint64(len(all)) {
		t.Errorf("count after two imports: %v, %v; want %d tasks", count, err, len(all))
	}

	// Into the cluster it came from: nothing changes either (its tasks'
	// times have HLC logical counters and its completions their claims).
	// The source is read again first: the claim FSM records a claim's end
	// in the background, with its own time, after the view showed the
	// terminal event's.
	settled := settledTasks(t, cs, all)
	mustContain(t, "import into the source", ok(t, src[2], "import", file), fmt.Sprintf("imported %d tasks", len(all)))
	for _, id := range all {
		if got := getTask(t, cs, id); !equalTasks(got, settled[id], true) {
			t.Errorf("source task %d changed with the import of its export:\n was %v\n now %v", id, settled[id], got)
		}
	}

	// The task claimed at export is claimable in the new cluster.
	held := ids["CLAIMED"][0]
	claim := claimOne(t, cd, "held", held)
	if err := cd.Complete(context.Background(), held, claim, []byte("again")); err != nil {
		t.Errorf("complete the re-claimed task: %v", err)
	}

	// A checkpoint of every node of a cluster (all on this machine here).
	bk := t.TempDir()
	out := ok(t, src[0], "backup", bk)
	for _, n := range []string{"n1", "n2", "n3"} {
		path := filepath.Join(bk, n)
		mustContain(t, "backup", out, n+"  "+path)
		for _, f := range []string{"db", "norn.json", "ring.json", "raft"} {
			if _, err := os.Stat(filepath.Join(path, f)); err != nil {
				t.Errorf("backup of %s: %v", n, err)
			}
		}
	}
}

// TestImportBadLines checks that a bad line is reported with its number,
// that nothing of its batch is written, and what came before is.
func TestImportBadLines(t *testing.T) {
	addr := startNornd(t)
	c := newTestClient(t, addr)
	created := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	line := func(id int, rest string) string {
		return fmt.Sprintf(`{"id":"%d","spec":{"queue":"q"},"createdAt":"%s"%s}`, id, created, rest)
	}
	tests := []struct {
		name, bad, want string
	}{
		{"not JSON", `{"id": "3", `, "line 3: "},
		{"unknown field", line(3, `,"colour":"red"`), `line 3: `},
		{"bad queue", `{"id":"3","spec":{"queue":"a queue"},"createdAt":"` + created + `"}`, "INVALID_ARGUMENT: tasks[0].spec.queue: "},
		{"no id", `{"spec":{"queue":"q"},"createdAt":"` + created + `"}`, "tasks[0].id: required"},
		{"no createdAt", `{"id":"3","spec":{"queue":"q"}}`, "tasks[0].createdAt: required"},
		{"future", line(3, `,"status":"TASK_STATUS_CANCELLED","finishedAt":"2999-01-01T00:00:00Z"`), "tasks[0].finishedAt: 2999-01-01T00:00:00Z is after this node's clock"},
		{"completed without time", line(3, `,"status":"TASK_STATUS_COMPLETED"`), "tasks[0].finishedAt: required"},
		{"aborted without errors", line(3, `,"status":"TASK_STATUS_ABORTED","finishedAt":"`+created+`"`), "tasks[0].errors: an ABORTED task needs at least one error"},
		{"result of a ready task", line(3, `,"status":"TASK_STATUS_READY","result":"eA=="`), "tasks[0].result: only a COMPLETED task"},
		{"update without seq", line(3, `,"status":"TASK_STATUS_CANCELLED","finishedAt":"`+created+`","updates":[{"claimId":"9","at":"`+created+`"}]`), "tasks[0].updates[0].seq: must be at least 1"},
		{"payload too large", `{"id":"3","spec":{"queue":"q","payload":"` + strings.Repeat("A", 1400000) + `"},"createdAt":"` + created + `"}`, "INVALID_ARGUMENT: tasks[0].spec.payload"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := 1000 * (i + 1)
			// Line 1 is imported alone (--batch 2 sends lines 1-2, then 3-4);
			// line 4 is good but shares line 3's batch.
			in := line(base+1, "") + "\n" + line(base+2, "") + "\n" + strings.ReplaceAll(tt.bad, `"id":"3"`, fmt.Sprintf(`"id":"%d"`, base+3)) + "\n" + line(base+4, "") + "\n"
			r := nornctl(t, addr, in, "import", "--batch", "2", "-")
			if r.code != 1 {
				t.Fatalf("exit %d, want 1; stderr: %s", r.code, r.stderr)
			}
			mustContain(t, "stderr", r.stderr, tt.want, "line 3", "2 tasks of the lines before it were imported")
			for id, stored := range map[int]bool{base + 1: true, base + 2: true, base + 3: false, base + 4: false} {
				_, err := c.GetTask(context.Background(), uint64(id))
				if got := err == nil; got != stored {
					t.Errorf("task %d (line %d) stored: %v (%v), want %v", id, id-base, got, err, stored)
				}
			}
		})
	}

	// A task stored with another spec is not overwritten.
	r := nornctl(t, addr, line(1001, "")+"\n", "import", "-")
	if r.code != 0 {
		t.Fatalf("re-import of line 1: exit %d: %s", r.code, r.stderr)
	}
	r = nornctl(t, addr, `{"id":"1001","spec":{"queue":"other"},"createdAt":"`+created+`"}`+"\n", "import", "-")
	if r.code != 1 || !strings.Contains(r.stderr, "line 1: ") || !strings.Contains(r.stderr, "ALREADY_EXISTS: tasks[0].id: task 1001 exists with a different spec") {
		t.Errorf("import over another spec: exit %d, stderr %s", r.code, r.stderr)
	}
	// --dry-run writes nothing.
	ok(t, addr, "import", "--dry-run", "-")
	r = nornctl(t, addr, line(99, "")+"\n", "import", "--dry-run", "-")
	if _, err := c.GetTask(context.Background(), 99); r.code != 0 || connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("import --dry-run: exit %d (%s), then get: %v; want exit 0 and NOT_FOUND", r.code, r.stderr, err)
	}
}

// TestBackupRestore backs a node up, changes it, restores the checkpoint
// as its data dir and checks the node serves what it had at the backup,
// and nothing written after.
func TestBackupRestore(t *testing.T) {
	addrs := freeAddrs(t, 3)
	data := filepath.Join(t.TempDir(), "data")
	args := []string{"-data-dir", data, "-listen", addrs[0], "-raft-addr", addrs[1], "-gossip-addr", addrs[2]}
	p := startNorndArgs(t, args...)
	c := newTestClient(t, addrs[0])
	ids := enqueueMix(t, c)
	var all []uint64
	for _, list := range ids {
		all = append(all, list...)
	}
	before := settledTasks(t, c, all)

	bk := t.TempDir()
	out := ok(t, addrs[0], "backup", bk)
	path := filepath.Join(bk, "n1")
	mustContain(t, "backup", out, "n1  "+path)
	r := nornctl(t, addrs[0], "", "backup", bk)
	if r.code != 1 || !strings.Contains(r.stderr, "ALREADY_EXISTS") {
		t.Errorf("a second backup to the same dir: exit %d, %s; want 1 and ALREADY_EXISTS", r.code, r.stderr)
	}
	if r := nornctl(t, addrs[0], "", "backup", "relative/dir"); r.code != 2 {
		t.Errorf("backup to a relative dir: exit %d, want 2", r.code)
	}
	if r := nornctl(t, addrs[0], "", "backup", data); r.code != 1 || !strings.Contains(r.stderr, "overlaps the node's data directory") {
		t.Errorf("backup into the data dir: exit %d, %s", r.code, r.stderr)
	}
	after, err := c.Enqueue(context.Background(), &nornv1.TaskSpec{Queue: "after"})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	// Restore: stop the node, replace its data dir, start it again.
	p.stop()
	if err := os.Rename(data, data+".old"); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", path, data).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	startNorndArgs(t, args...)
	c = newTestClient(t, addrs[0])
	for _, id := range all {
		got := getTask(t, c, id)
		// A claim's lease and the view's times are as they were; the
		// restarted leader only extends live leases (lease grace).
		if !equalTasks(before[id], got, true) {
			t.Errorf("task %d after the restore:\n got %v\nwant %v", id, got, before[id])
		}
	}
	if _, err := c.GetTask(context.Background(), after); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("task %d enqueued after the backup: %v, want NOT_FOUND", after, err)
	}
	// The restored node claims and completes.
	ready := ids["READY"][0]
	if err := c.Complete(context.Background(), ready, claimOne(t, c, "emails", ready), nil); err != nil {
		t.Errorf("complete after the restore: %v", err)
	}
}

// TestImportLargeTasks imports tasks whose batch would exceed the
// server's request limit (4 MiB): nornctl splits it.
func TestImportLargeTasks(t *testing.T) {
	addr := startNornd(t)
	c := newTestClient(t, addr)
	created := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	payload := strings.Repeat("QUJD", 900<<10/3) // 900 KiB of "ABC" in base64
	var in strings.Builder
	for id := 1; id <= 6; id++ {
		fmt.Fprintf(&in, `{"id":"%d","spec":{"queue":"big","payload":"%s"},"createdAt":"%s"}`+"\n", id, payload, created)
	}
	r := nornctl(t, addr, in.String(), "import", "-")
	if r.code != 0 {
		t.Fatalf("import of 6 tasks of 900 KiB: exit %d: %s", r.code, r.stderr)
	}
	mustContain(t, "import", r.stdout, "imported 6 tasks")
	for id := uint64(1); id <= 6; id++ {
		if task := getTask(t, c, id); len(task.GetSpec().GetPayload()) != 900<<10 {
			t.Errorf("task %d: payload of %d bytes, want %d", id, len(task.GetSpec().GetPayload()), 900<<10)
		}
	}
}
