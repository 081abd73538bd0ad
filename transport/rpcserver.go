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

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup // the accept loop, connections and their calls

	maxFrame uint32 // the largest request frame taken
}

// ServeRPC serves framed calls on the connections of stream until Close.
// Each call runs in its own goroutine.
func ServeRPC(stream *GroupStream, h RPCHandler, logger *slog.Logger) *RPCServer {
	return ServeRPCListener(stream, maxRPCFrame, h, logger)
}

// ServeRPCListener serves framed calls on ln's connections until Close
// (the framed client calls on the API port: SplitListener). A request
// frame over maxFrame bytes (0: 64 MiB) is read past and answered
// RESOURCE_EXHAUSTED.
func ServeRPCListener(ln net.Listener, maxFrame uint32, h RPCHandler, logger *slog.Logger) *RPCServer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if maxFrame == 0 || maxFrame > maxRPCFrame {
		maxFrame = maxRPCFrame
	}
	s := &RPCServer{stream: ln, h: h, logger: logger, conns: map[net.Conn]struct{}{}, maxFrame: maxFrame}
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
		frame, err := readFrame(r, s.maxFrame)
		var big *oversizedFrame
		if errors.As(err, &big) {
			err := connect.NewError(connect.CodeResourceExhausted, big)
			w.send(encodeResponse(big.id, nil, err)) //nolint:errcheck // a dead connection ends the loop
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.logger.Debug("peer call connection closed", "remote", meta.Remote, "err", err)
			}
			c.Close()
			return
		}
		id, m, callMeta, body, err := parseRequest(frame, meta)
		if err != nil {
			s.logger.Warn("bad peer call frame", "remote", meta.Remote, "err", err)
			c.Close()
			return
		}
		if m == MethodCancel {
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
			mu.Lock()
			delete(cancels, id)
			mu.Unlock()
			cancel()
			w.send(encodeResponse(id, out, err)) //nolint:errcheck // a dead connection fails the caller
		})
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
