package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
)

// TestBudgetAcquire: bytes are taken while they fit; a request larger
// than the budget is refused at once; one that does not fit waits for a
// release, or is refused RESOURCE_EXHAUSTED (ErrBudgetExhausted) once the
// wait is over; a cancelled request takes nothing.
func TestBudgetAcquire(t *testing.T) {
	b := NewBudget("client", 100, 50*time.Millisecond)
	if err := b.Acquire(context.Background(), 60); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		n     int64
		ctx   func() context.Context
		code  connect.Code
		full  bool // ErrBudgetExhausted
		later bool // a RetryInfo: the same request may fit later
	}{
		{"larger than the budget", 101, context.Background, connect.CodeResourceExhausted, true, false},
		{"no room within the wait", 41, context.Background, connect.CodeResourceExhausted, true, true},
		{"cancelled", 41, func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, connect.CodeCanceled, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := b.Refused()
			err := b.Acquire(tc.ctx(), tc.n)
			if connect.CodeOf(err) != tc.code || errors.Is(err, ErrBudgetExhausted) != tc.full {
				t.Fatalf("Acquire(%d): %v, want %v (exhausted %v)", tc.n, err, tc.code, tc.full)
			}
			if delay, ok := retryInfo(err); ok != tc.later || (ok && delay != BudgetRetryDelay) {
				t.Fatalf("Acquire(%d): RetryInfo %v (%v), want %v (of %v)", tc.n, ok, delay, tc.later, BudgetRetryDelay)
			}
			if b.InUse() != 60 || b.Refused() != before+1 {
				t.Fatalf("in use %d, refused %d: want 60 and %d", b.InUse(), b.Refused(), before+1)
			}
		})
	}
	if err := b.Acquire(context.Background(), 40); err != nil {
		t.Fatalf("what fits: %v", err)
	}
	b.Release(100)
	if b.InUse() != 0 {
		t.Fatalf("in use %d after every release", b.InUse())
	}

	// A waiter gets its bytes when they are given back.
	b = NewBudget("client", 100, 5*time.Second)
	if err := b.Acquire(context.Background(), 100); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Acquire(context.Background(), 30) }()
	time.Sleep(10 * time.Millisecond)
	b.Release(40)
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	b.Release(90)
	if b.InUse() != 0 {
		t.Fatalf("in use %d after every release", b.InUse())
	}
}

// TestBudgetBody: a body takes each byte from its budget before reading
// it, all at its first read: its length when known (a Content-Length, or
// a gRPC envelope's prefix), else its limit (what it did not use goes
// back at its end); bytes past its declared length as they come; nothing
// past its limit (what a reader throws away); its limit again when
// encoded. Release gives it all back; a body that finds no room fails its
// read RESOURCE_EXHAUSTED.
func TestBudgetBody(t *testing.T) {
	envelope := func(size, sent int) []byte {
		b := make([]byte, 5+sent)
		binary.BigEndian.PutUint32(b[1:], uint32(size))
		return b
	}
	for _, tc := range []struct {
		name   string
		body   []byte
		shape  BodyShape
		budget int64
		// taken after the first read of 1 byte, and at the end
		first, end int64
		code       connect.Code // of the reads; 0: none fails
	}{
		{"known length", make([]byte, 1000), BodyShape{Limit: 4096, Length: 1000}, 1 << 20, 1000, 1000, 0},
		{"unknown length", make([]byte, 100<<10), BodyShape{Limit: 1 << 20, Length: -1}, 4 << 20, 1<<20 + 1, 100 << 10, 0},
		{"unknown length, short", make([]byte, 100), BodyShape{Limit: 1 << 20, Length: -1}, 4 << 20, 1<<20 + 1, 100, 0},
		{"past the limit", make([]byte, 100<<10), BodyShape{Limit: 40 << 10, Length: -1}, 4 << 20, 40<<10 + 1, 40<<10 + 1, 0},
		{"past the limit, known", make([]byte, 100<<10), BodyShape{Limit: 40 << 10, Length: 100 << 10}, 4 << 20, 40<<10 + 1, 40<<10 + 1, 0},
		{"enveloped", envelope(100<<10, 100<<10), BodyShape{Limit: 1 << 20, Length: -1, Enveloped: true}, 4 << 20, 5 + 100<<10, 5 + 100<<10, 0},
		{"enveloped, past the limit", envelope(100<<10, 100<<10), BodyShape{Limit: 40 << 10, Length: -1, Enveloped: true}, 4 << 20, 5 + 40<<10 + 1, 5 + 40<<10 + 1, 0},
		{"enveloped, cut short", envelope(100<<10, 10), BodyShape{Limit: 1 << 20, Length: -1, Enveloped: true}, 4 << 20, 5 + 100<<10, 15, 0},
		{"enveloped, no prefix", []byte{0, 0}, BodyShape{Limit: 1 << 20, Length: -1, Enveloped: true}, 4 << 20, 1<<20 + 6, 2, 0},
		{"enveloped, a second envelope", append(envelope(100, 100), make([]byte, 200)...), BodyShape{Limit: 1 << 20, Length: -1, Enveloped: true}, 4 << 20, 105, 305, 0},
		{"encoded", make([]byte, 1000), BodyShape{Limit: 4096, Length: 1000, Encoding: "gzip"}, 1 << 20, 1000 + 4096, 1000 + 4096, 0},
		{"identity is not encoded", make([]byte, 1000), BodyShape{Limit: 4096, Length: 1000, Encoding: "identity"}, 1 << 20, 1000, 1000, 0},
		{"no room", make([]byte, 1000), BodyShape{Limit: 4096, Length: 1000}, 1500, 0, 0, connect.CodeResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBudget("client", tc.budget, 10*time.Millisecond)
			if tc.code != 0 {
				if err := b.Acquire(context.Background(), 1000); err != nil { // another request's
					t.Fatal(err)
				}
				defer b.Release(1000)
			}
			body := b.Body(context.Background(), io.NopCloser(bytes.NewReader(tc.body)), tc.shape)
			_, err := body.Read(make([]byte, 1))
			if connect.CodeOf(err) != tc.code && (tc.code != 0 || err != nil) {
				t.Fatalf("first read: %v, want %v", err, tc.code)
			}
			if got := body.Taken(); got != tc.first || (tc.code == 0 && b.InUse() != got) {
				t.Fatalf("after the first read: %d taken (budget %d in use), want %d", got, b.InUse(), tc.first)
			}
			if tc.code != 0 {
				if _, err := io.ReadAll(body); connect.CodeOf(err) != tc.code {
					t.Fatalf("later read: %v, want %v", err, tc.code)
				}
				return
			}
			n, err := io.Copy(io.Discard, body)
			if err != nil || n != int64(len(tc.body))-1 {
				t.Fatalf("read %d, %v; want %d", n, err, len(tc.body)-1)
			}
			if got := body.Taken(); got != tc.end || b.InUse() != got {
				t.Fatalf("at the end: %d taken (budget %d in use), want %d", got, b.InUse(), tc.end)
			}
			body.Release()
			body.Release()
			if b.InUse() != 0 || body.Taken() != 0 {
				t.Fatalf("after Release: budget %d in use, body %d", b.InUse(), body.Taken())
			}
		})
	}
}

// TestBudgetBodySharedDoesNotWait: a body that shares its connection's
// flow control (HTTP/2) is refused at once when there is no room; one
// that does not waits, and gets the room given back meanwhile.
func TestBudgetBodySharedDoesNotWait(t *testing.T) {
	b := NewBudget("client", 1000, 5*time.Second)
	if err := b.Acquire(context.Background(), 1000); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	shared := b.Body(context.Background(), io.NopCloser(bytes.NewReader(make([]byte, 100))), BodyShape{Limit: 1000, Length: 100, Shared: true})
	if _, err := shared.Read(make([]byte, 10)); connect.CodeOf(err) != connect.CodeResourceExhausted || time.Since(start) > time.Second {
		t.Fatalf("shared body: %v after %s, want RESOURCE_EXHAUSTED at once", err, time.Since(start))
	}
	go func() { time.Sleep(20 * time.Millisecond); b.Release(1000) }()
	alone := b.Body(context.Background(), io.NopCloser(bytes.NewReader(make([]byte, 100))), BodyShape{Limit: 1000, Length: 100})
	defer alone.Release()
	if n, err := alone.Read(make([]byte, 10)); err != nil || n != 10 {
		t.Fatalf("body alone on its connection: %d, %v", n, err)
	}
}

// TestBudgetBodiesTakeTurns: many requests for a budget that holds a few
// of them at once all get their turn: each takes its whole body at once
// and nothing more to find that it has ended, so none holds a part of
// the budget while it waits for more (which could leave every request
// waiting for a room the others hold).
func TestBudgetBodiesTakeTurns(t *testing.T) {
	b := NewBudget("client", 4<<10, 5*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for i := range 24 {
		wg.Go(func() {
			size := 1000 + i
			in := make([]byte, 5+size)
			binary.BigEndian.PutUint32(in[1:], uint32(size))
			body := b.Body(context.Background(), io.NopCloser(bytes.NewReader(in)), BodyShape{Limit: 4 << 10, Length: -1, Enveloped: true})
			defer body.Release()
			// As connect reads a unary gRPC request: the prefix, the
			// message, then the end.
			if _, err := io.ReadFull(body, make([]byte, 5)); err != nil {
				errs <- err
				return
			}
			if _, err := io.ReadFull(body, make([]byte, size)); err != nil {
				errs <- err
				return
			}
			if n, err := body.Read(make([]byte, 5)); n != 0 || err != io.EOF {
				errs <- fmt.Errorf("after the message: %d, %v", n, err)
				return
			}
			time.Sleep(5 * time.Millisecond) // the handler
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if b.InUse() != 0 || b.Refused() != 0 {
		t.Fatalf("%d bytes in use, %d refused", b.InUse(), b.Refused())
	}
}

// framedConn dials a framed server's listener and reads its hello.
func framedConn(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := bufio.NewReader(c)
	if h, err := r.ReadByte(); err != nil || h != rpcHello {
		t.Fatalf("hello: %v %v", h, err)
	}
	return c, r
}

// readAnswer reads one answer frame within a second.
func readAnswer(t *testing.T, c net.Conn, r *bufio.Reader) (uint64, rpcResult) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
	f, err := readFrame(r, maxRPCFrame)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	id, res, err := parseResponse(f)
	if err != nil {
		t.Fatal(err)
	}
	return id, res
}

// TestRPCServerAdmitsBeforeBody: a call Admit refuses is answered from
// its frame's header, before its body has arrived, and its handler never
// runs; the connection goes on (the body is read past), and an admitted
// call on it is served.
func TestRPCServerAdmitsBeforeBody(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var served, refused atomic.Int32
	s := ServeRPCWith(ln, RPCServerConfig{
		Admit: func(m RPCMethod, meta RPCMeta) error {
			if meta.Node == "" || m != MethodReplicate {
				return connect.NewError(connect.CodePermissionDenied, errors.New("who are you"))
			}
			return nil
		},
		Refused: func(RPCMethod, error) { refused.Add(1) },
	}, func(_ context.Context, _ RPCMethod, _ RPCMeta, body []byte) ([]byte, error) {
		served.Add(1)
		return body[:2], nil
	}, nil)
	defer s.Close()
	c, r := framedConn(t, ln.Addr().String())

	f, err := encodeRequest(7, MethodReplicate, RPCMeta{}, make([]byte, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	// The header and a first part only: the answer comes without the rest.
	if _, err := c.Write(f[:64<<10]); err != nil {
		t.Fatal(err)
	}
	id, res := readAnswer(t, c, r)
	if id != 7 || connect.CodeOf(res.err) != connect.CodePermissionDenied {
		t.Fatalf("answer %d: %v, want 7 PERMISSION_DENIED", id, res.err)
	}
	if _, err := c.Write(f[64<<10:]); err != nil {
		t.Fatal(err)
	}
	ok, err := encodeRequest(8, MethodReplicate, RPCMeta{Node: "n2"}, []byte("ok!"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(ok); err != nil {
		t.Fatal(err)
	}
	if id, res := readAnswer(t, c, r); id != 8 || res.err != nil || string(res.body) != "ok" {
		t.Fatalf("admitted call %d: %q %v", id, res.body, res.err)
	}
	if served.Load() != 1 || refused.Load() != 1 {
		t.Fatalf("%d calls served, %d refused; want 1 and 1", served.Load(), refused.Load())
	}
}

// TestRPCServerBudget: frames are taken from the budget before they are
// read and given back when answered; one that does not fit within the
// wait is answered RESOURCE_EXHAUSTED, read past, and the connection goes
// on.
func TestRPCServerBudget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := NewBudget("peer", 3<<10, 50*time.Millisecond)
	hold := make(chan struct{})
	s := ServeRPCWith(ln, RPCServerConfig{Budget: b}, func(_ context.Context, _ RPCMethod, _ RPCMeta, body []byte) ([]byte, error) {
		if string(body[:4]) == "hold" {
			<-hold
		}
		return body[:4], nil
	}, nil)
	defer s.Close()
	c, r := framedConn(t, ln.Addr().String())
	send := func(id uint64, body string, size int) {
		t.Helper()
		f, err := encodeRequest(id, MethodRaft, RPCMeta{}, append([]byte(body), make([]byte, size-len(body))...))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(f); err != nil {
			t.Fatal(err)
		}
	}
	send(1, "hold", 2<<10) // held by its handler
	waitUntil(t, func() bool { return b.InUse() > 2<<10 })
	send(2, "full", 2<<10) // does not fit
	if id, res := readAnswer(t, c, r); id != 2 || connect.CodeOf(res.err) != connect.CodeResourceExhausted || !strings.Contains(res.err.Error(), "retry later") {
		t.Fatalf("answer %d: %v, want 2 RESOURCE_EXHAUSTED", id, res.err)
	}
	send(3, "fits", 512)
	if id, res := readAnswer(t, c, r); id != 3 || res.err != nil || string(res.body) != "fits" {
		t.Fatalf("answer %d: %q %v, want 3 fits", id, res.body, res.err)
	}
	close(hold)
	if id, res := readAnswer(t, c, r); id != 1 || res.err != nil {
		t.Fatalf("answer %d: %v, want 1", id, res.err)
	}
	waitUntil(t, func() bool { return b.InUse() == 0 })
	if b.Refused() != 1 {
		t.Fatalf("%d refused, want 1", b.Refused())
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// retryInfo is the delay of err's google.rpc.RetryInfo detail, if any.
func retryInfo(err error) (time.Duration, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return 0, false
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ri, ok := v.(*errdetails.RetryInfo); ok {
				return ri.GetRetryDelay().AsDuration(), true
			}
		}
	}
	return 0, false
}
