package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"
)

// RPCServer serves framed calls on a mux group's connections.
type RPCServer struct {
	stream net.Listener
	h      RPCHandler
	logger *slog.Logger
	cfg    RPCServerConfig

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup // the accept loop, connections and their calls
}

// RPCServerConfig is what an RPCServer checks before it reads a request
// frame's body (ServeRPCWith).
type RPCServerConfig struct {
	// MaxFrame bounds a request frame, in bytes (0: 64 MiB, the most): a
	// larger one is read past, never held, and answered
	// RESOURCE_EXHAUSTED.
	MaxFrame uint32
	// Admit, when set, decides each call from its frame's header, before
	// its body is read: its method and what it says of its caller (the
	// connection's certificate and remote address, the frame's node and
	// cluster ids). A call it refuses is answered with its error and its
	// body read past, never held. Cancels (MethodCancel) are not asked
	// about.
	Admit func(m RPCMethod, meta RPCMeta) error
	// Budget, when set, bounds the request bytes the server holds: a
	// frame is taken from it before it is read (waiting while it is full,
	// which holds up the connection's later frames) and given back when
	// its call has been answered. A frame that does not fit in time is
	// read past and answered with Budget.Acquire's error.
	Budget *Budget
	// Refused, when set, is told of every call answered without its
	// handler: refused by Admit, over MaxFrame, or out of Budget.
	Refused func(m RPCMethod, err error)
}

// ServeRPC serves framed calls on the connections of stream until Close.
// Each call runs in its own goroutine.
func ServeRPC(stream *GroupStream, h RPCHandler, logger *slog.Logger) *RPCServer {
	return ServeRPCWith(stream, RPCServerConfig{}, h, logger)
}

// ServeRPCListener serves framed calls on ln's connections until Close
// (the framed client calls on the API port: SplitListener). A request
// frame over maxFrame bytes (0: 64 MiB) is read past and answered
// RESOURCE_EXHAUSTED.
func ServeRPCListener(ln net.Listener, maxFrame uint32, h RPCHandler, logger *slog.Logger) *RPCServer {
	return ServeRPCWith(ln, RPCServerConfig{MaxFrame: maxFrame}, h, logger)
}

// ServeRPCWith serves framed calls on ln's connections until Close, with
// cfg's checks before each frame's body is read.
func ServeRPCWith(ln net.Listener, cfg RPCServerConfig, h RPCHandler, logger *slog.Logger) *RPCServer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxFrame == 0 || cfg.MaxFrame > maxRPCFrame {
		cfg.MaxFrame = maxRPCFrame
	}
	s := &RPCServer{stream: ln, h: h, logger: logger, cfg: cfg, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.acceptLoop()
	return s
}

// Close stops accepting, closes every connection and waits for the calls
// under way to return: after it, the handler is not called again.
func (s *RPCServer) Close() {
	s.stream.Close()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *RPCServer) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.stream.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

func (s *RPCServer) serveConn(c net.Conn) {
	w := newFrameWriter(c)
	defer w.close()
	if err := w.send([]byte{rpcHello}); err != nil {
		c.Close()
		return
	}
	meta := RPCMeta{Remote: c.RemoteAddr().String()}
	if tc, ok := c.(*tls.Conn); ok {
		if id, ok := IdentityOf(tc.ConnectionState()); ok {
			meta.Cert = &id
		}
	}
	r := bufio.NewReaderSize(c, 64<<10)
	// Each call's context ends when its caller cancels it (a MethodCancel
	// frame) or the connection closes: a long-polling Claim whose caller
	// gave up must not claim tasks for nobody.
	connCtx, cancelConn := context.WithCancel(context.Background())
	var calls sync.WaitGroup
	defer calls.Wait()
	defer cancelConn()
	var mu sync.Mutex
	cancels := map[uint64]context.CancelFunc{}
	for {
		frame, taken, err := s.readRequest(connCtx, r, w, meta)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.logger.Debug("peer call connection closed", "remote", meta.Remote, "err", err)
			}
			c.Close()
			return
		}
		if frame == nil {
			continue // refused before its body, read past
		}
		id, m, callMeta, body, err := parseRequest(frame, meta)
		if err != nil {
			s.release(taken)
			s.logger.Warn("bad peer call frame", "remote", meta.Remote, "err", err)
			c.Close()
			return
		}
		if m == MethodCancel {
			s.release(taken)
			if len(body) == 8 {
				mu.Lock()
				if cancel := cancels[binary.BigEndian.Uint64(body)]; cancel != nil {
					cancel()
				}
				mu.Unlock()
			}
			continue
		}
		ctx, cancel := context.WithCancel(connCtx)
		if callMeta.Trace.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, callMeta.Trace)
		}
		mu.Lock()
		cancels[id] = cancel
		mu.Unlock()
		calls.Add(1)
		Go(func() {
			defer calls.Done()
			out, err := s.h(ctx, m, callMeta, body)
			s.release(taken)
			mu.Lock()
			delete(cancels, id)
			mu.Unlock()
			cancel()
			w.send(encodeResponse(id, out, err)) //nolint:errcheck // a dead connection fails the caller
		})
	}
}

// rpcHeaderMost bounds a request frame's header: id, method, epoch, node
// and cluster ids and a trace context, each of at most 255 bytes.
const rpcHeaderMost = 8 + 1 + 8 + 3*256

// readRequest reads the next request frame, after the checks of the
// server's config on its header: nil (and nil error) for a frame they
// refused, which was answered and read past. A frame it returns holds
// taken bytes of the budget, which the caller gives back (release) when
// its call has been answered. An error ends the connection.
func (s *RPCServer) readRequest(ctx context.Context, r *bufio.Reader, w *frameWriter, conn RPCMeta) (frame []byte, taken uint32, err error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, 0, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxRPCFrame || size < 8 {
		return nil, 0, fmt.Errorf("frame of %d bytes exceeds %d", size, maxRPCFrame)
	}
	head, err := r.Peek(int(min(size, rpcHeaderMost)))
	if err != nil {
		return nil, 0, err
	}
	id, m := binary.BigEndian.Uint64(head), RPCMethod(0)
	refuse := func(err error) ([]byte, uint32, error) {
		if m != MethodCancel {
			w.send(encodeResponse(id, nil, err)) //nolint:errcheck // a dead connection ends the loop
			if s.cfg.Refused != nil {
				s.cfg.Refused(m, err)
			}
		}
		_, derr := r.Discard(int(size))
		return nil, 0, derr
	}
	if s.cfg.Admit != nil {
		_, hm, meta, _, err := parseRequest(head, conn)
		if err != nil {
			return nil, 0, fmt.Errorf("bad request frame header: %w", err)
		}
		m = hm
		if m != MethodCancel {
			if err := s.cfg.Admit(m, meta); err != nil {
				return refuse(err)
			}
		}
	} else if len(head) > 8 {
		m = RPCMethod(head[8]) &^ rpcTraced
		if head[8] == byte(MethodCancel) {
			m = MethodCancel
		}
	}
	if size > s.cfg.MaxFrame {
		return refuse(connect.NewError(connect.CodeResourceExhausted, &oversizedFrame{id: id, size: size, most: s.cfg.MaxFrame}))
	}
	if b := s.cfg.Budget; b != nil {
		if err := b.Acquire(ctx, int64(size)); err != nil {
			return refuse(err)
		}
		taken = size
	}
	frame = make([]byte, size)
	if _, err := io.ReadFull(r, frame); err != nil {
		s.release(taken)
		return nil, 0, err
	}
	return frame, taken, nil
}

// release gives n bytes of a frame back to the budget.
func (s *RPCServer) release(n uint32) {
	if s.cfg.Budget != nil {
		s.cfg.Budget.Release(int64(n))
	}
}

// oversizedFrame is a request frame over the server's limit, read past:
// its call id, to answer RESOURCE_EXHAUSTED.
type oversizedFrame struct {
	id         uint64
	size, most uint32
}

func (e *oversizedFrame) Error() string {
	return fmt.Sprintf("request frame of %d bytes exceeds %d", e.size, e.most)
}
