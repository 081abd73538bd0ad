package jepsen

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"

	"github.com/norn-dev/norn/jepsen/check"
)

// sideRun is the history of clients that run beside the workload on a
// queue of their own (the retention clients, the unique-keys clients):
// their ops are kept apart from the workload's history and judged by
// their own checker.
type sideRun struct {
	w      *Workload
	client int // check.Op.Client of the ops
	mu     sync.Mutex
	ops    []check.Op
	// onAdd, when set, sees each op as it is added (under mu).
	onAdd func(*check.Op)
}

func (r *sideRun) add(o *check.Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, *o)
	if r.onAdd != nil {
		r.onAdd(o)
	}
}

// op runs call on node n as one op of the history; call fills in o
// (its task, key...) and returns the call's error.
func (r *sideRun) op(ctx context.Context, n *Node, proc int, f string, task uint64, call func(context.Context, *check.Op) error) *check.Op {
	o := &check.Op{Process: proc, Client: r.client, F: f, Node: n.ID, Task: task, Call: r.w.H.Now()}
	cctx, cancel := r.w.opCtx(ctx)
	defer cancel()
	err := call(cctx, o)
	o.Return = r.w.H.Now()
	o.Type, o.Err = classify(err)
	if o.Type == "info" {
		o.Return = -1
	}
	r.add(o)
	return o
}

// save writes the history to dir/name as JSON lines, a debugging aid.
// The caller holds mu.
func (r *sideRun) save(dir, name string) {
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return
	}
	enc := json.NewEncoder(f)
	for _, o := range r.ops {
		enc.Encode(o) //nolint:errcheck // a debugging aid
	}
	f.Close()
}
