package coord

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"

	"github.com/norn-dev/norn/transport"
)

// replicaSender batches the replication to one peer: writes queued while
// a call is in flight go together in the next call, so a busy node sends
// few large Replicate calls rather than many small ones.
type replicaSender struct {
	c        *Coordinator
	p        *transport.Peer
	raftAddr atomic.Pointer[string] // the peer's Raft port, for framed calls

	mu       sync.Mutex
	queue    [][]byte // encoded task states
	waiters  []func(error)
	inflight int
	// parent is the trace context the next call carries: the first valid
	// one queued since the last call (a sampled one over one that is not).
	// A call carries the writes of many requests and one parent; the
	// others' replica spans still time their wait and ack.
	parent trace.SpanContext
}

// Replication batching limits: calls in flight per peer, and the size of
// one call.
const (
	senderInflight   = 2
	senderMaxTasks   = maxReplicate
	senderMaxBytes   = 8 << 20
	replicateTimeout = 10 * time.Second
)

// sender returns the replica sender of the peer at API address addr,
// whose Raft port is at raftAddr.
func (c *Coordinator) sender(addr, raftAddr string) *replicaSender {
	c.sendersMu.Lock()
	defer c.sendersMu.Unlock()
	s, ok := c.senders[addr]
	if !ok {
		s = &replicaSender{c: c, p: c.peers.Get(addr)}
		c.senders[addr] = s
	}
	if cur := s.raftAddr.Load(); cur == nil || *cur != raftAddr {
		s.raftAddr.Store(&raftAddr)
	}
	return s
}

// send queues task states (canonical encodings, crdt.Task.Encode) for
// the peer; done is called once with the outcome of the call that carried
// them. sc is the trace context of the write (may be invalid).
func (s *replicaSender) send(sc trace.SpanContext, states [][]byte, done func(error)) {
	s.mu.Lock()
	s.queue = append(s.queue, states...)
	s.waiters = append(s.waiters, done)
	if sc.IsValid() && (!s.parent.IsValid() || sc.IsSampled() && !s.parent.IsSampled()) {
		s.parent = sc
	}
	start := s.inflight < senderInflight
	if start {
		s.inflight++
	}
	s.mu.Unlock()
	if start {
		transport.Go(s.loop)
	}
}

// loop sends batches until the queue is empty.
func (s *replicaSender) loop() {
	for {
		s.mu.Lock()
		if len(s.queue) == 0 {
			s.inflight--
			s.mu.Unlock()
			return
		}
		tasks, waiters, parent := s.queue, s.waiters, s.parent
		s.queue, s.waiters, s.parent = nil, nil, trace.SpanContext{}
		s.mu.Unlock()
		s.call(parent, tasks, waiters)
	}
}

// call sends everything taken from the queue, in calls of at most
// senderMaxTasks tasks and about senderMaxBytes, and tells every waiter
// the outcome (an error of any call fails them all: conservative).
func (s *replicaSender) call(parent trace.SpanContext, tasks [][]byte, waiters []func(error)) {
	for len(tasks) > 0 {
		n, size := 0, 0
		for _, b := range tasks {
			if n == senderMaxTasks || (size > senderMaxBytes && n > 0) {
				break
			}
			n++
			size += len(b)
		}
		states := tasks[:n]
		ctx := context.Background()
		if parent.IsValid() {
			ctx = trace.ContextWithSpanContext(ctx, parent)
		}
		ctx, cancel := context.WithTimeout(ctx, replicateTimeout)
		err := s.replicate(ctx, &nornv1.ReplicateRequest{Tasks: states})
		cancel()
		if err != nil {
			for _, w := range waiters {
				w(err)
			}
			return
		}
		tasks = tasks[n:]
	}
	for _, w := range waiters {
		w(nil)
	}
}

// replicate makes one Replicate call: framed on the peer's Raft port (see
// transport.PeerRPCGroup), or through its PeerService when it serves no
// framed calls.
func (s *replicaSender) replicate(ctx context.Context, req *nornv1.ReplicateRequest) error {
	if addr := s.raftAddr.Load(); addr != nil && *addr != "" {
		body, err := proto.Marshal(req)
		if err != nil {
			return err
		}
		_, err = s.c.peers.RPC(*addr).Call(ctx, transport.MethodReplicate, s.c.peers.Meta(), body)
		if !errors.Is(err, transport.ErrRPCUnsupported) {
			return err
		}
	}
	_, err := s.p.Peer.Replicate(ctx, transport.Request(s.c.peers, req))
	return err
}
