package check

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"sort"
	"sync"
	"time"
)

// Op is one completed operation of the history. Times are nanoseconds on
// the harness's monotonic clock since the run started; an indeterminate
// operation (timeout, ambiguous failure) has Type "info" and Return -1
// (infinity).
type Op struct {
	Index   int    `json:"index"`
	Process int    `json:"process"` // porcupine client id: a client gets a new one after an info
	Client  int    `json:"client"`  // the workload client (-1: the drainer)
	F       string `json:"f"`       // enqueue, claim, renew, complete, yield, cancel, get
	Node    string `json:"node,omitempty"`
	Task    uint64 `json:"task,omitempty,string"`
	Claim   uint64 `json:"claim,omitempty,string"`
	LeaseMS int64  `json:"lease_ms,omitempty"`
	Long    bool   `json:"long,omitempty"`
	W       uint32 `json:"w,omitempty"`
	Payload string `json:"payload,omitempty"`
	Type    string `json:"type"` // ok, fail (definitely did not happen), info (may have happened)
	Err     string `json:"error,omitempty"`
	Call    int64  `json:"call_ns"`
	Return  int64  `json:"return_ns"`
	Drain   bool   `json:"drain,omitempty"`
	// Leader is the node that granted a claim (its partition's leader).
	Leader string `json:"leader,omitempty"`
	// Priority is an enqueued task's priority, or a claimed one's.
	Priority int32 `json:"priority,omitempty"`
	// BackoffMS is a fail's (a retryable abort's) backoff: the task's
	// retry policy's constant wait.
	BackoffMS int64 `json:"backoff_ms,omitempty"`
	// Deadline is an enqueued task's deadline (TaskSpec.deadline) on the
	// history's clock, 0 for none.
	Deadline int64 `json:"deadline_ns,omitempty"`
	// Key is an enqueued task's unique key (TaskSpec.unique_key), or the
	// key a read found.
	Key string `json:"key,omitempty"`
	// Duplicate: the enqueue was answered with the task holding its key
	// (EnqueueResponse.duplicate).
	Duplicate bool `json:"duplicate,omitempty"`
}

// Ret is the op's return time, with infinity for an info.
func (o *Op) Ret() int64 {
	if o.Type == "info" || o.Return < 0 {
		return 1<<62 - 1
	}
	return o.Return
}

// History records operations and fault events, with timestamps on one
// monotonic clock.
type History struct {
	mu    sync.Mutex
	start time.Time
	ops   []*Op
	next  int // next porcupine process id
	subs  []chan *Op
	okOps int // ops of type ok so far
}

// NewHistory starts the run's clock.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the time since the run started, in nanoseconds (monotonic).
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// NewProcess returns a fresh porcupine process id.
func (h *History) NewProcess() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	return h.next - 1
}

// Add records a completed op.
func (h *History) Add(o *Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if o.Type == "info" {
		o.Return = -1
	}
	o.Index = len(h.ops)
	h.ops = append(h.ops, o)
	if o.Type == "ok" {
		h.okOps++
	}
	for _, ch := range h.subs {
		select {
		case ch <- o:
		default: // a subscriber that falls behind misses ops
		}
	}
}

// WaitOK waits until at least n ops succeeded, or ctx is done; it reports
// whether they did.
func (h *History) WaitOK(ctx context.Context, n int) bool {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		h.mu.Lock()
		k := h.okOps
		h.mu.Unlock()
		if k >= n {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// Subscribe returns a channel that receives every op recorded from now on
// (as it is added; a subscriber that does not keep up misses some). The
// aimed nemeses use it to strike right after an op.
func (h *History) Subscribe() <-chan *Op {
	ch := make(chan *Op, 256)
	h.mu.Lock()
	h.subs = append(h.subs, ch)
	h.mu.Unlock()
	return ch
}

// Ops returns the ops sorted by call time.
func (h *History) Ops() []*Op {
	h.mu.Lock()
	out := append([]*Op(nil), h.ops...)
	h.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Call < out[j].Call })
	return out
}

// WriteJSONLines writes the history, one op per line, in call order.
func (h *History) WriteJSONLines(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, o := range h.Ops() {
		if err := enc.Encode(o); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadHistory reads a history.jsonl file.
func ReadHistory(path string) ([]*Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []*Op
	dec := json.NewDecoder(f)
	for dec.More() {
		o := new(Op)
		if err := dec.Decode(o); err != nil {
			return nil, err
		}
		ops = append(ops, o)
	}
	return ops, nil
}
