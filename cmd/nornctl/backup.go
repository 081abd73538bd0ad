package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
)

// The backup commands: export and import (JSON lines through the API)
// and backup (a checkpoint on every node's disk). docs/API.md ("Export
// and import") documents the line format, docs/OPERATIONS.md ("Backup
// and restore") the procedures.

const exportHelp = `
Each line is one task as the API's Task message in proto3 JSON (the
format of GetTask's "task", docs/API.md "Export and import"): id, spec,
status, progress, createdAt, updatedAt, finishedAt, updates, errors and
result. Claims are left out. The tasks are read through ListTasks, page
by page (one replica per partition, as nornctl list --all), so a task
written while the export runs may be in it or not. A file is written
under a temporary name and renamed when complete; - writes standard
output. The count is printed on standard error.

  nornctl export tasks.jsonl
  nornctl export --queue emails - | gzip > emails.jsonl.gz`

func runExport(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	queue := fs.String("queue", "", "only the tasks of this queue (default: every queue)")
	pos, err := e.parse(cmd, fs, args, 1, 1)
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	out, commit, err := createOutput(pos[0], e.stdout)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(out, 1<<20)
	n := 0
	for t, err := range c.Tasks(e.ctx, *queue, nornv1.TaskStatus_TASK_STATUS_UNSPECIFIED) {
		if err == nil {
			err = writeExportLine(w, t)
		}
		if err != nil {
			commit(false)
			return fmt.Errorf("after %d tasks: %w", n, err)
		}
		n++
	}
	if err := w.Flush(); err != nil {
		commit(false)
		return err
	}
	if err := commit(true); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "exported %d tasks\n", n)
	return nil
}

// writeExportLine writes t without its claims as one line of JSON.
func writeExportLine(w io.Writer, t *nornv1.Task) error {
	t.Claims, t.CurrentClaim = nil, nil
	b, err := protojson.Marshal(t)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// createOutput opens the export's output: stdout for "-", else a
// temporary file beside path that commit(true) syncs and renames to path
// (commit(false) removes it).
func createOutput(path string, stdout io.Writer) (io.Writer, func(ok bool) error, error) {
	if path == "-" {
		return stdout, func(bool) error { return nil }, nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return nil, nil, err
	}
	commit := func(ok bool) error {
		if !ok {
			f.Close()
			return os.Remove(f.Name())
		}
		err := f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(f.Name(), path)
		}
		if err != nil {
			os.Remove(f.Name())
		}
		return err
	}
	return f, commit, nil
}

const importHelp = `
Reads an export (nornctl export; the format is in docs/API.md, "Export and
import": a migration from another queue writes the same lines) and writes
its tasks with AdminService.ImportTasks, --batch at a time (fewer when
they would make a request over 2 MiB). Ids, specs and
creation times are kept; COMPLETED, ABORTED and CANCELLED tasks stay so,
with their result, errors and updates. Claims are not restored: a task
that was CLAIMED (or READY, or DELAYED) comes back with its spec alone,
READY (or DELAYED by its notBefore or dependencies), to be claimed again.
Importing the same file again changes nothing. Blank lines are skipped.

The first bad line stops the import: a line that is not a task's JSON, or
one the server refuses (a bad field, a size limit, an id stored with a
different spec), is reported with its line number, and no task of its
batch is written; the batches before it are. Fix the line and run the
import again. --dry-run validates every line on the server without
writing anything.

  nornctl import tasks.jsonl
  gunzip < emails.jsonl.gz | nornctl import -`

// maxImportLine bounds one line of an import: a task's payload, result
// and updates fit a request of the server's default -max-request-bytes.
const maxImportLine = 4 << 20

// maxImportBatchBytes bounds the tasks of one ImportTasks call (protobuf
// size), half the server's default -max-request-bytes: a batch of large
// tasks is sent in several calls.
const maxImportBatchBytes = 2 << 20

func runImport(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	batch := fs.Int("batch", 500, "tasks per ImportTasks call, 1 to 1000")
	dryRun := fs.Bool("dry-run", false, "validate every task on the server, write nothing")
	quorum := fs.Uint("w", 0, "write quorum: replicas that must store each task (0: the server's default, a majority)")
	pos, err := e.parse(cmd, fs, args, 1, 1)
	if err != nil {
		return err
	}
	if *batch < 1 || *batch > 1000 {
		return usagef(cmd, "--batch %d: want 1 to 1000", *batch)
	}
	if *quorum > math.MaxUint32 {
		return usagef(cmd, "--w %d: out of the uint32 range", *quorum)
	}
	in := e.stdin
	if pos[0] != "-" {
		f, err := os.Open(pos[0])
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	imp := &importer{e: e, c: c, w: uint32(*quorum), dryRun: *dryRun}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), maxImportLine)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		t := &nornv1.Task{}
		if err := protojson.Unmarshal(b, t); err != nil {
			return imp.fail(line, err)
		}
		if imp.bytes+proto.Size(t) > maxImportBatchBytes {
			if err := imp.flush(); err != nil {
				return err
			}
		}
		imp.add(t, line)
		if len(imp.tasks) == *batch {
			if err := imp.flush(); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("longer than %d bytes", maxImportLine)
		}
		return imp.fail(line+1, err)
	}
	if err := imp.flush(); err != nil {
		return err
	}
	verb := "imported"
	if *dryRun {
		verb = "validated (dry run, nothing written)"
	}
	return e.emit(&nornv1.ImportTasksResponse{Imported: uint32(imp.done)}, func(w io.Writer) {
		fmt.Fprintf(w, "%s %d tasks\n", verb, imp.done)
	})
}

// importer sends an import's tasks in batches and reports a failure with
// the line of the task it is about.
type importer struct {
	e      *env
	c      *client.Client
	w      uint32
	dryRun bool
	tasks  []*nornv1.Task
	lines  []int // of tasks
	bytes  int   // proto.Size of tasks
	done   int   // tasks written (or validated) by earlier batches
}

func (im *importer) add(t *nornv1.Task, line int) {
	im.tasks = append(im.tasks, t)
	im.lines = append(im.lines, line)
	im.bytes += proto.Size(t)
}

// flush writes the batch.
func (im *importer) flush() error {
	if len(im.tasks) == 0 {
		return nil
	}
	_, err := im.c.ImportTasks(im.e.ctx, &nornv1.ImportTasksRequest{Tasks: im.tasks, W: im.w, ValidateOnly: im.dryRun})
	if err != nil {
		return im.batchFailed(err)
	}
	im.done += len(im.tasks)
	im.tasks, im.lines, im.bytes = im.tasks[:0], im.lines[:0], 0
	return nil
}

// batchFailed finds the line the server refused when the batch failed
// for one of its tasks: it validates them one at a time (writing
// nothing) and reports the first refused one.
func (im *importer) batchFailed(err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeResourceExhausted, connect.CodeAlreadyExists:
	default:
		return fmt.Errorf("%w (the batch of lines %d-%d is not known to be written; %d tasks before it were; importing again is safe)",
			err, im.lines[0], im.lines[len(im.lines)-1], im.done)
	}
	for i, t := range im.tasks {
		_, verr := im.c.ImportTasks(im.e.ctx, &nornv1.ImportTasksRequest{Tasks: []*nornv1.Task{t}, ValidateOnly: true})
		if verr != nil {
			return im.fail(im.lines[i], verr)
		}
	}
	return fmt.Errorf("%w (lines %d-%d, none written; %d tasks before them were)", err, im.lines[0], im.lines[len(im.lines)-1], im.done)
}

// fail is the error of a bad line: it says what was written before it.
func (im *importer) fail(line int, err error) error {
	what := fmt.Sprintf("%d tasks of the lines before it were imported; none of line %d's batch", im.done, line)
	if im.dryRun {
		what = "nothing was written (dry run)"
	}
	return fmt.Errorf("line %d: %s (%s)", line, errorMessage(err), what)
}

const backupHelp = `
Asks every node of the cluster (as Status at --addr lists them) for a
checkpoint of its data directory (AdminService.Backup): each node writes
<dir>/<node-id> on its OWN machine, not nornctl's, with a consistent copy
of its Pebble store (hard links where dir is on the data's filesystem),
its Raft snapshots and ring. dir must be absolute and outside the data
directory; <dir>/<node-id> must not exist. A node that is not alive, or
fails, is reported and makes the exit status 1; the others are backed up.
Restoring (stop the node, replace its data directory with the
checkpoint, start it) is in docs/OPERATIONS.md, "Backup and restore".

  nornctl backup /var/backups/norn/$(date +%F)`

func runBackup(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	pos, err := e.parse(cmd, fs, args, 1, 1)
	if err != nil {
		return err
	}
	if !filepath.IsAbs(pos[0]) {
		return usagef(cmd, "dir %q: want an absolute path (a directory on each node's machine)", pos[0])
	}
	c, err := e.client(client.WithDiscovery(0))
	if err != nil {
		return err
	}
	st, err := c.Status(e.ctx)
	if err != nil {
		return err
	}
	nodes := st.GetNodes()
	if len(nodes) == 0 { // a single node
		nodes = []*nornv1.NodeStatus{{Id: st.GetNodeId(), ApiAddress: e.g.addr, State: "alive"}}
	}
	var backups []*nornv1.BackupResponse
	var failed []error
	for _, nd := range nodes {
		if nd.GetState() != "alive" {
			failed = append(failed, fmt.Errorf("node %s is %s: not backed up", nd.GetId(), nd.GetState()))
			continue
		}
		b, err := e.backupNode(nd, pos[0])
		if err != nil {
			failed = append(failed, fmt.Errorf("node %s (%s): %s", nd.GetId(), nd.GetApiAddress(), errorMessage(err)))
			continue
		}
		backups = append(backups, b)
	}
	for _, b := range backups {
		if err := e.emit(b, func(w io.Writer) {
			fmt.Fprintf(w, "%s\t%s\t%d bytes\t%s\n", b.GetNodeId(), b.GetPath(), b.GetSizeBytes(), b.GetTook().AsDuration().Round(time.Millisecond))
		}); err != nil {
			return err
		}
	}
	return errors.Join(failed...)
}

// backupNode calls Backup on one node, by its API address alone.
func (e *env) backupNode(nd *nornv1.NodeStatus, dir string) (*nornv1.BackupResponse, error) {
	c, err := e.newClient(nd.GetApiAddress(), client.WithDiscovery(0))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := e.callContext()
	defer cancel()
	resp, err := c.AdminService().Backup(ctx, connect.NewRequest(&nornv1.BackupRequest{Dir: dir}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}
