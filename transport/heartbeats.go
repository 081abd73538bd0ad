//lint:file-ignore SA1019 hashicorp/raft still fills and reads the legacy Leader and Candidate fields (a heartbeat is told by its Leader); a transport must carry them.

package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Heartbeats carries the Raft traffic of every partition group of this
// node as framed peer calls (RPCClient, one connection per peer node)
// instead of each group's own NetworkTransport connections, and
// coalesces the heartbeats that go to one peer node into one call
// (MethodRaftHeartbeats), as CockroachDB coalesces the heartbeats of its
// ranges per node pair. Appends with entries, votes, pre-votes and
// leadership transfers travel one per call (MethodRaft); snapshots keep
// the NetworkTransport (rare and large: streamed).
//
// Why: a leader heartbeats each follower every HeartbeatTimeout/10, each
// heartbeat its own NetworkTransport RPC (msgpack, a write and a read on
// the group's own connection, a goroutine woken on each side). With 1,024
// partitions on 3 idle nodes that was about 7,000 heartbeats a second per
// node and 43% of a core (issue 26). Heartbeats that leave within Linger
// of each other now travel in one frame, each answered by its group's
// heartbeat handler on the receiving node as NetworkTransport would. The
// Raft protocol does not change: timeouts, elections and leases are the
// groups' own; a heartbeat is late by at most Linger.
//
// Why not the NetworkTransport for the rest: each group kept its own
// pooled connections to each peer, each with 256 KiB read and write
// buffers and a goroutine per side: about 0.6 MB and 9 goroutines per
// idle replica. A call to a peer that serves no framed calls (an older
// node) goes through the NetworkTransport, as does a heartbeat whose
// coalesced call failed.
//
// Appends are not pipelined (AppendEntriesPipeline answers
// raft.ErrPipelineReplicationNotSupported): Raft then has one append in
// flight per follower, each carrying every entry that waited for it.
type Heartbeats struct {
	call    func(ctx context.Context, addr string, m RPCMethod, body []byte) ([]byte, error)
	linger  time.Duration
	timeout time.Duration

	mu     sync.Mutex
	groups map[uint32]*GroupTransport
	out    map[string]*hbQueue // by peer Raft address
}

// DefaultHeartbeatLinger is the default of HeartbeatsConfig.Linger (and of
// nornd's -raft-heartbeat-linger): idle P=1024 nodes used 12-14% of a core
// with it, 13-17% with 5 ms (docs/SCALING.md).
const DefaultHeartbeatLinger = 10 * time.Millisecond

// HeartbeatsConfig configures Heartbeats.
type HeartbeatsConfig struct {
	// Call makes one framed call (MethodRaft, MethodRaftHeartbeats) to the
	// node at Raft address addr (Peers.RPC(addr).Call, with the node's
	// RPCMeta). Required.
	Call func(ctx context.Context, addr string, m RPCMethod, body []byte) ([]byte, error)
	// Linger is how long a heartbeat waits for others to the same peer.
	// Default 10 ms (heartbeats leave every 100 ms with a 1 s Raft timeout).
	Linger time.Duration
	// Timeout bounds one coalesced call. Default 2 s.
	Timeout time.Duration
}

// NewHeartbeats returns the node's Raft call carrier: wrap each
// partition group's NetworkTransport with Wrap, and serve
// MethodRaftHeartbeats with Serve and MethodRaft with ServeRaft.
func NewHeartbeats(cfg HeartbeatsConfig) *Heartbeats {
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultHeartbeatLinger
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	return &Heartbeats{call: cfg.Call, linger: cfg.Linger, timeout: cfg.Timeout,
		groups: map[uint32]*GroupTransport{}, out: map[string]*hbQueue{}}
}

// GroupTransport is one partition group's raft.Transport: framed calls
// through Heartbeats, and the group's NetworkTransport for snapshots,
// for peers without framed calls, and to receive what such peers send.
type GroupTransport struct {
	*raft.NetworkTransport
	hb       *Heartbeats
	group    uint32
	handler  func(raft.RPC) // set once by raft.NewRaft, before it serves
	consumer chan raft.RPC
	closed   chan struct{}
	once     sync.Once
	gate     heartbeatGate // the heartbeat handler, closed by Close
}

// Wrap returns group's transport over t.
func (h *Heartbeats) Wrap(group uint32, t *raft.NetworkTransport) *GroupTransport {
	g := &GroupTransport{NetworkTransport: t, hb: h, group: group,
		consumer: make(chan raft.RPC), closed: make(chan struct{})}
	h.mu.Lock()
	h.groups[group] = g
	h.mu.Unlock()
	if t == nil {
		return g // a test's group without a NetworkTransport
	}
	// What arrives the NetworkTransport's way (snapshots, older peers)
	// reaches Raft through the same channel.
	go func() {
		for {
			select {
			case rpc := <-t.Consumer():
				select {
				case g.consumer <- rpc:
				case <-g.closed:
					return
				}
			case <-g.closed:
				return
			}
		}
	}()
	return g
}

// Consumer is where Raft reads the RPCs for the group, whichever way
// they came.
func (t *GroupTransport) Consumer() <-chan raft.RPC { return t.consumer }

// AppendEntries sends a heartbeat coalesced with others to the same
// peer, and anything else as a framed call.
func (t *GroupTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	// Heartbeats and the empty appends an idle leader sends to tell the
	// last commit travel coalesced.
	if len(args.Entries) == 0 && t.hb.send(string(target), t.group, args, resp) == nil {
		return nil
	}
	err := t.call(target, kindAppend, encodeAppend(args), func(r *frameReader) { decodeAppendResp(r, resp) })
	if errors.Is(err, ErrRPCUnsupported) {
		return t.NetworkTransport.AppendEntries(id, target, args, resp)
	}
	return err
}

// AppendEntriesPipeline is not supported: Raft replicates one append at
// a time per follower.
func (t *GroupTransport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

// RequestVote sends a vote request as a framed call.
func (t *GroupTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	err := t.call(target, kindVote, encodeVote(args), func(r *frameReader) { decodeVoteResp(r, resp) })
	if errors.Is(err, ErrRPCUnsupported) {
		return t.NetworkTransport.RequestVote(id, target, args, resp)
	}
	return err
}

// RequestPreVote sends a pre-vote request as a framed call.
func (t *GroupTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	err := t.call(target, kindPreVote, encodePreVote(args), func(r *frameReader) { decodePreVoteResp(r, resp) })
	if errors.Is(err, ErrRPCUnsupported) {
		return t.NetworkTransport.RequestPreVote(id, target, args, resp)
	}
	return err
}

// TimeoutNow sends a leadership transfer as a framed call.
func (t *GroupTransport) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	err := t.call(target, kindTimeoutNow, encodeHeader(nil, args.RPCHeader), func(r *frameReader) { resp.RPCHeader = decodeHeader(r) })
	if errors.Is(err, ErrRPCUnsupported) {
		return t.NetworkTransport.TimeoutNow(id, target, args, resp)
	}
	return err
}

// raftCallTimeout bounds one framed Raft call, as NetworkTransport's
// Timeout does.
const raftCallTimeout = 10 * time.Second

// call makes one MethodRaft call of kind with the encoded request body
// and decodes the answer with dec.
func (t *GroupTransport) call(target raft.ServerAddress, kind byte, req []byte, dec func(*frameReader)) error {
	body := binary.AppendUvarint([]byte{kind}, uint64(t.group))
	body = append(body, req...)
	ctx, cancel := context.WithTimeout(context.Background(), raftCallTimeout)
	defer cancel()
	out, err := t.hb.call(ctx, string(target), MethodRaft, body)
	if err != nil {
		return err
	}
	r := &frameReader{b: out}
	dec(r)
	if r.err == nil && len(r.b) > 0 {
		r.err = errors.New("transport: trailing bytes in a Raft answer")
	}
	return r.err
}

// SetHeartbeatHandler registers the group's heartbeat fast path (Raft
// calls it once, in NewRaft) for coalesced heartbeats and the
// NetworkTransport's alike.
func (t *GroupTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	cb = t.gate.wrap(cb)
	t.hb.mu.Lock()
	t.handler = cb
	t.hb.mu.Unlock()
	t.NetworkTransport.SetHeartbeatHandler(cb)
}

// Close stops serving the group's framed calls, waits for the heartbeats
// under way and refuses later ones (heartbeatGate), and closes the
// NetworkTransport.
func (t *GroupTransport) Close() error {
	t.gate.close()
	t.once.Do(func() {
		close(t.closed)
		t.hb.mu.Lock()
		if t.hb.groups[t.group] == t {
			delete(t.hb.groups, t.group)
		}
		t.hb.mu.Unlock()
	})
	return t.NetworkTransport.Close()
}

// The kinds of MethodRaft calls; a call's body is the kind (1 byte), the
// group (uvarint), then the request.
const (
	kindAppend     byte = 1
	kindVote       byte = 2
	kindPreVote    byte = 3
	kindTimeoutNow byte = 4
)

// ServeRaft answers one MethodRaft call: the request goes to its group's
// Raft through the group's Consumer, and the call waits for Raft's
// answer (at most raftCallTimeout).
func (h *Heartbeats) ServeRaft(ctx context.Context, body []byte) ([]byte, error) {
	if len(body) < 2 {
		return nil, errors.New("transport: short Raft call")
	}
	kind := body[0]
	r := &frameReader{b: body[1:]}
	group := r.uvarint()
	var cmd any
	switch kind {
	case kindAppend:
		cmd = decodeAppend(r)
	case kindVote:
		cmd = decodeVote(r)
	case kindPreVote:
		cmd = decodePreVote(r)
	case kindTimeoutNow:
		cmd = &raft.TimeoutNowRequest{RPCHeader: decodeHeader(r)}
	default:
		return nil, fmt.Errorf("transport: unknown Raft call kind %d", kind)
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = errors.New("transport: trailing bytes in a Raft call")
	}
	if r.err != nil {
		return nil, r.err
	}
	if group > 0xFFFF_FFFF {
		return nil, fmt.Errorf("transport: no Raft group %d here", group)
	}
	resp, err := h.dispatch(ctx, uint32(group), cmd)
	if err != nil {
		return nil, err
	}
	switch a := resp.(type) {
	case *raft.AppendEntriesResponse:
		return encodeAppendResp(a), nil
	case *raft.RequestVoteResponse:
		return encodeVoteResp(a), nil
	case *raft.RequestPreVoteResponse:
		return encodePreVoteResp(a), nil
	case *raft.TimeoutNowResponse:
		return encodeHeader(nil, a.RPCHeader), nil
	}
	return nil, fmt.Errorf("transport: Raft answered %T", resp)
}

// dispatch hands cmd to group's Raft through its Consumer and waits for
// the answer (at most raftCallTimeout).
func (h *Heartbeats) dispatch(ctx context.Context, group uint32, cmd any) (any, error) {
	h.mu.Lock()
	g := h.groups[group]
	h.mu.Unlock()
	if g == nil {
		return nil, fmt.Errorf("transport: no Raft group %d here", group)
	}
	ctx, cancel := context.WithTimeout(ctx, raftCallTimeout)
	defer cancel()
	ch := make(chan raft.RPCResponse, 1)
	select {
	case g.consumer <- raft.RPC{Command: cmd, RespChan: ch}:
	case <-g.closed:
		return nil, fmt.Errorf("transport: Raft group %d is closed", group)
	case <-ctx.Done():
		return nil, fmt.Errorf("transport: Raft group %d did not take the call: %w", group, ctx.Err())
	}
	select {
	case resp := <-ch:
		return resp.Response, resp.Error
	case <-g.closed:
		return nil, fmt.Errorf("transport: Raft group %d is closed", group)
	case <-ctx.Done():
		return nil, fmt.Errorf("transport: Raft group %d did not answer: %w", group, ctx.Err())
	}
}

// isHeartbeat is NetworkTransport's test of a heartbeat: a term and a
// leader, and nothing else.
func isHeartbeat(r *raft.AppendEntriesRequest) bool {
	leader := r.Addr
	if len(leader) == 0 {
		leader = r.Leader
	}
	return r.Term != 0 && leader != nil && r.PrevLogEntry == 0 && r.PrevLogTerm == 0 &&
		len(r.Entries) == 0 && r.LeaderCommitIndex == 0
}

// hbCall is one heartbeat waiting for its coalesced call.
type hbCall struct {
	group uint32
	req   *raft.AppendEntriesRequest
	resp  *raft.AppendEntriesResponse
	done  chan error
}

// hbQueue holds the heartbeats for one peer until the next flush.
type hbQueue struct {
	pending []*hbCall
	armed   bool // a flush is scheduled
}

// send queues a heartbeat for the peer at addr and waits for its answer.
func (h *Heartbeats) send(addr string, group uint32, req *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	c := &hbCall{group: group, req: req, resp: resp, done: make(chan error, 1)}
	h.mu.Lock()
	q := h.out[addr]
	if q == nil {
		q = &hbQueue{}
		h.out[addr] = q
	}
	q.pending = append(q.pending, c)
	if !q.armed {
		q.armed = true
		time.AfterFunc(h.linger, func() { h.flush(addr) })
	}
	h.mu.Unlock()
	return <-c.done
}

// flush sends the heartbeats queued for addr in one call and hands each
// its answer.
func (h *Heartbeats) flush(addr string) {
	h.mu.Lock()
	q := h.out[addr]
	calls := q.pending
	q.pending, q.armed = nil, false
	h.mu.Unlock()
	if len(calls) == 0 {
		return
	}
	for len(calls) > 0 {
		n := min(len(calls), maxHeartbeatsPerCall)
		h.flushBatch(addr, calls[:n])
		calls = calls[n:]
	}
}

func (h *Heartbeats) flushBatch(addr string, calls []*hbCall) {
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
	out, err := h.call(ctx, addr, MethodRaftHeartbeats, encodeHeartbeats(calls))
	cancel()
	if err != nil {
		for _, c := range calls {
			c.done <- err
		}
		return
	}
	errs := decodeHeartbeatAnswers(out, calls)
	for i, c := range calls {
		c.done <- errs[i]
	}
}

// Serve answers one MethodRaftHeartbeats call: each heartbeat goes to its
// group's heartbeat handler, as NetworkTransport's fast path would take
// it; a group not open here, or shutting down, answers an error for its
// heartbeat alone.
func (h *Heartbeats) Serve(ctx context.Context, body []byte) ([]byte, error) {
	items, err := decodeHeartbeats(body)
	if err != nil {
		return nil, err
	}
	answers := make([][]byte, len(items))
	var wg sync.WaitGroup
	for i, it := range items {
		if !isHeartbeat(it.req) {
			// An empty append goes through the group's main loop (it
			// moves the commit index): each in its own goroutine, so
			// that a busy group does not hold the others' answers.
			wg.Go(func() {
				resp, err := h.dispatch(ctx, it.group, it.req)
				answers[i] = heartbeatAnswer(resp, err)
			})
			continue
		}
		h.mu.Lock()
		t := h.groups[it.group]
		var fn func(raft.RPC)
		if t != nil {
			fn = t.handler
		}
		h.mu.Unlock()
		if fn == nil {
			answers[i] = appendHeartbeatError(nil, fmt.Sprintf("no Raft group %d here", it.group))
			continue
		}
		ch := make(chan raft.RPCResponse, 1)
		fn(raft.RPC{Command: it.req, RespChan: ch})
		select {
		case r := <-ch:
			answers[i] = heartbeatAnswer(r.Response, r.Error)
		default:
			answers[i] = appendHeartbeatError(nil, fmt.Sprintf("Raft group %d is shutting down", it.group))
		}
	}
	wg.Wait()
	out := binary.AppendUvarint(nil, uint64(len(items)))
	for _, a := range answers {
		out = append(out, a...)
	}
	return out, nil
}

// heartbeatAnswer encodes one heartbeat's (or empty append's) answer.
func heartbeatAnswer(resp any, err error) []byte {
	a, ok := resp.(*raft.AppendEntriesResponse)
	switch {
	case err != nil:
		return appendHeartbeatError(nil, err.Error())
	case !ok || a == nil:
		return appendHeartbeatError(nil, "no answer")
	}
	return appendHeartbeatAnswer(nil, a)
}
