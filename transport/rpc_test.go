package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// echoServer serves framed calls that echo their body, with the caller's
// meta in front, or fail as the body asks.
func echoServer(t *testing.T, m *RaftMux) *RPCServer {
	t.Helper()
	stream, err := m.Register(PeerRPCGroup)
	if err != nil {
		t.Fatal(err)
	}
	s := ServeRPC(stream, func(ctx context.Context, method RPCMethod, meta RPCMeta, body []byte) ([]byte, error) {
		switch string(body) {
		case "refuse":
			return nil, connect.NewError(connect.CodePermissionDenied, errors.New("not you"))
		case "crash":
			return nil, errors.New("plain error")
		case "slow":
			time.Sleep(200 * time.Millisecond)
		}
		return fmt.Appendf(nil, "%d|%s|%s|%d|%s", method, meta.Node, meta.Cluster, meta.Epoch, body), nil
	}, nil)
	t.Cleanup(s.Close)
	return s
}

func TestRPCRoundTrips(t *testing.T) {
	m := newMux(t, MuxConfig{})
	echoServer(t, m)
	c := NewRPCClient(m.Addr().String(), nil, nil)
	defer c.Close()
	ctx := context.Background()
	meta := RPCMeta{Node: "n1", Cluster: "c9", Epoch: 42}

	// Many concurrent calls share the connection; each gets its own answer.
	var wg sync.WaitGroup
	var bad atomic.Int32
	for i := range 200 {
		wg.Go(func() {
			body := fmt.Appendf(nil, "call-%d", i)
			out, err := c.Call(ctx, MethodReplicate, meta, body)
			if err != nil || !bytes.Equal(out, fmt.Appendf(nil, "1|n1|c9|42|call-%d", i)) {
				t.Errorf("call %d: %q, %v", i, out, err)
				bad.Add(1)
			}
		})
	}
	wg.Wait()
	if bad.Load() > 0 {
		t.FailNow()
	}
	// A large body.
	big := bytes.Repeat([]byte("x"), 1<<20)
	out, err := c.Call(ctx, MethodReplicate, meta, big)
	if err != nil || !bytes.HasSuffix(out, big) {
		t.Fatalf("1 MiB call: %d bytes, %v", len(out), err)
	}
	// Errors keep their code and message; other errors are INTERNAL.
	_, err = c.Call(ctx, MethodReplicate, meta, []byte("refuse"))
	if connect.CodeOf(err) != connect.CodePermissionDenied || !bytes.Contains([]byte(err.Error()), []byte("not you")) {
		t.Fatalf("refused call: %v", err)
	}
	_, err = c.Call(ctx, MethodReplicate, meta, []byte("crash"))
	if connect.CodeOf(err) != connect.CodeInternal {
		t.Fatalf("failed call: %v", err)
	}
	// A deadline ends the wait.
	dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = c.Call(dctx, MethodReplicate, meta, []byte("slow"))
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("call past its deadline: %v", err)
	}
	// The connection is still good after all that.
	if _, err := c.Call(ctx, MethodReplicate, meta, []byte("again")); err != nil {
		t.Fatal(err)
	}
}

// A server that goes away fails the calls waiting on it as UNAVAILABLE,
// and the client dials again when it is back.
func TestRPCConnectionLossAndRedial(t *testing.T) {
	m := newMux(t, MuxConfig{})
	s := echoServer(t, m)
	c := NewRPCClient(m.Addr().String(), nil, nil)
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Call(ctx, MethodReplicate, RPCMeta{}, []byte("a")); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, MethodReplicate, RPCMeta{}, []byte("slow"))
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the slow call reach the server
	s.Close()                         // waits for the slow call, closes the connection
	if err := <-errc; err != nil && connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("call cut by a closing server: %v", err)
	}
	// No server for the group now: the mux closes new connections unread.
	if _, err := c.Call(ctx, MethodReplicate, RPCMeta{}, []byte("b")); !errors.Is(err, ErrRPCUnsupported) && connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("call with no server: %v", err)
	}
}

// A peer whose mux serves no framed calls (an older node) is reported as
// such, for the caller to use connect instead.
func TestRPCUnsupportedPeer(t *testing.T) {
	m := newMux(t, MuxConfig{})
	c := NewRPCClient(m.Addr().String(), nil, nil)
	defer c.Close()
	_, err := c.Call(context.Background(), MethodReplicate, RPCMeta{}, []byte("x"))
	if !errors.Is(err, ErrRPCUnsupported) {
		t.Fatalf("call to a mux without the group: %v", err)
	}
}

// Malformed frames close the connection without calling the handler.
func TestRPCBadFrames(t *testing.T) {
	m := newMux(t, MuxConfig{})
	var calls atomic.Int32
	stream, err := m.Register(PeerRPCGroup)
	if err != nil {
		t.Fatal(err)
	}
	s := ServeRPC(stream, func(context.Context, RPCMethod, RPCMeta, []byte) ([]byte, error) {
		calls.Add(1)
		return nil, nil
	}, nil)
	defer s.Close()
	for _, frame := range [][]byte{
		{0, 0, 0, 3, 1, 2, 3},    // shorter than a request header
		{0xff, 0xff, 0xff, 0xff}, // longer than the limit
	} {
		conn, err := DialGroup(m.Addr().String(), PeerRPCGroup, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(frame)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 16)
		for err == nil {
			_, err = conn.Read(buf) // the hello, then the close
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("frame %x: connection not closed", frame)
		}
		conn.Close()
	}
	if calls.Load() != 0 {
		t.Fatalf("handler called %d times on bad frames", calls.Load())
	}
}

// FuzzRPCFrames: no frame crashes the decoders; a request or response
// that decodes encodes back to the same frame (so nothing is lost or
// invented between a caller and its peer).
func FuzzRPCFrames(f *testing.F) {
	req, _ := encodeRequest(7, MethodReplicate, RPCMeta{Node: "n1", Cluster: "c", Epoch: 3}, []byte("body"))
	f.Add(req[4:])
	f.Add(encodeResponse(9, []byte("ok"), nil)[4:])
	f.Add(encodeResponse(9, nil, connect.NewError(connect.CodeUnavailable, errors.New("down")))[4:])
	f.Add([]byte{})
	traced, _ := encodeRequest(8, MethodEnqueue, RPCMeta{Node: "n1", Trace: testSpan}, []byte("body"))
	f.Add(traced[4:])
	f.Fuzz(func(t *testing.T, frame []byte) {
		if id, m, meta, body, err := parseRequest(frame, RPCMeta{Remote: "r"}); err == nil {
			again, err := encodeRequest(id, m, RPCMeta{Node: meta.Node, Cluster: meta.Cluster, Epoch: meta.Epoch, Trace: meta.Trace}, body)
			if err != nil {
				t.Fatalf("request %x decoded to (%d, %d, %+v, %x), encodes with %v", frame, id, m, meta, body, err)
			}
			// A traced frame's trace context is rewritten in its one
			// form (or dropped when unreadable): the call must decode
			// to the same again.
			if (frame[8] == byte(MethodCancel) || frame[8]&byte(rpcTraced) == 0) && !bytes.Equal(again[4:], frame) {
				t.Fatalf("request %x decoded to (%d, %d, %+v, %x), encoded back to %x", frame, id, m, meta, body, again)
			}
			id2, m2, meta2, body2, err := parseRequest(again[4:], RPCMeta{Remote: "r"})
			if err != nil || id2 != id || m2 != m || meta2.Node != meta.Node || meta2.Cluster != meta.Cluster ||
				meta2.Epoch != meta.Epoch || !meta2.Trace.Equal(meta.Trace) || !bytes.Equal(body2, body) {
				t.Fatalf("request %x decoded to (%d, %d, %+v, %x), again to (%d, %d, %+v, %x), %v", frame, id, m, meta, body, id2, m2, meta2, body2, err)
			}
		}
		if id, res, err := parseResponse(frame); err == nil {
			again := encodeResponse(id, res.body, res.err)
			if res.err != nil {
				// A code outside connect's, or 0 with a message, does not
				// come back the same; it must still decode to an error.
				if _, res2, err := parseResponse(again[4:]); err != nil || res2.err == nil {
					t.Fatalf("error response %x re-encoded to %x: %v, %v", frame, again, res2.err, err)
				}
				return
			}
			if _, res2, err := parseResponse(again[4:]); err != nil || !bytes.Equal(res2.body, res.body) || res2.err != nil {
				t.Fatalf("response %x re-encoded to %x", frame, again)
			}
		}
	})
}
