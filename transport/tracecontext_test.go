package transport

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"
)

var testSpan = trace.NewSpanContext(trace.SpanContextConfig{
	TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
	SpanID:     trace.SpanID{0xa, 0xb, 0xc, 0xd, 0xe, 0xf, 1, 2},
	TraceFlags: trace.FlagsSampled,
})

func TestTraceContextEncoding(t *testing.T) {
	good := AppendTraceContext(nil, testSpan)
	if len(good) != TraceContextLen {
		t.Fatalf("encoded %d bytes, want %d", len(good), TraceContextLen)
	}
	unsampled := AppendTraceContext(nil, testSpan.WithTraceFlags(0))
	for _, tc := range []struct {
		name string
		in   []byte
		ok   bool
		want trace.SpanContext
	}{
		{"sampled", good, true, testSpan.WithRemote(true)},
		{"unsampled", unsampled, true, testSpan.WithTraceFlags(0).WithRemote(true)},
		{"longer (a later version's extension)", append(append([]byte{}, good...), 9, 9), true, testSpan.WithRemote(true)},
		{"unknown flag bits dropped", append(append([]byte{}, good[:25]...), 0xff), true, testSpan.WithRemote(true)},
		{"empty", nil, false, trace.SpanContext{}},
		{"short", good[:25], false, trace.SpanContext{}},
		{"other version", append([]byte{1}, good[1:]...), false, trace.SpanContext{}},
		{"zero trace id", append(append([]byte{0}, make([]byte, 16)...), good[17:]...), false, trace.SpanContext{}},
		{"zero span id", append(append(append([]byte{}, good[:17]...), make([]byte, 8)...), 1), false, trace.SpanContext{}},
	} {
		got, ok := ParseTraceContext(tc.in)
		if ok != tc.ok || (ok && !got.Equal(tc.want)) || (ok && !got.IsRemote()) {
			t.Errorf("%s: got %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// A framed call made under a span carries its trace context: the handler
// finds it in its context as the remote parent, and in the meta.
func TestRPCCarriesTraceContext(t *testing.T) {
	m := newMux(t, MuxConfig{})
	stream, err := m.Register(PeerRPCGroup)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan [2]trace.SpanContext, 2)
	s := ServeRPC(stream, func(ctx context.Context, _ RPCMethod, meta RPCMeta, body []byte) ([]byte, error) {
		got <- [2]trace.SpanContext{trace.SpanContextFromContext(ctx), meta.Trace}
		return body, nil
	}, nil)
	defer s.Close()
	c := NewRPCClient(m.Addr().String(), nil, nil)
	defer c.Close()

	ctx := trace.ContextWithSpanContext(context.Background(), testSpan)
	if out, err := c.Call(ctx, MethodReplicate, RPCMeta{Node: "n1"}, []byte("x")); err != nil || string(out) != "x" {
		t.Fatalf("traced call: %q, %v", out, err)
	}
	sc := <-got
	if !sc[0].Equal(testSpan.WithRemote(true)) || !sc[1].Equal(sc[0]) {
		t.Fatalf("handler saw %v (ctx) and %v (meta), want %v", sc[0], sc[1], testSpan)
	}
	if _, err := c.Call(context.Background(), MethodReplicate, RPCMeta{Node: "n1"}, []byte("y")); err != nil {
		t.Fatal(err)
	}
	if sc := <-got; sc[0].IsValid() || sc[1].IsValid() {
		t.Fatalf("untraced call arrived with %v / %v", sc[0], sc[1])
	}
}

// oldPeer serves framed calls as a node from before traced frames did: a
// method byte it does not know is answered UNIMPLEMENTED, and the body is
// whatever follows the cluster id. It counts the traced frames it saw.
func oldPeer(t *testing.T, m *RaftMux, traced *atomic.Int32) {
	t.Helper()
	stream, err := m.Register(PeerRPCGroup)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := stream.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte{rpcHello})
				r := bufio.NewReader(c)
				for {
					f, err := readFrame(r, maxRPCFrame)
					if err != nil {
						return
					}
					id, method := binary.BigEndian.Uint64(f), RPCMethod(f[8])
					var resp []byte
					if method != MethodReplicate {
						traced.Add(1)
						resp = encodeResponse(id, nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("no framed peer call %d", method)))
					} else {
						nl := int(f[17])
						body := f[17+1+nl+1+int(f[18+nl]):]
						resp = encodeResponse(id, body, nil)
					}
					if _, err := c.Write(resp); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// A traced call to a node of an older version still goes through: the
// peer refuses the traced frame UNIMPLEMENTED, the call is sent again
// untraced, and the connection sends untraced frames from then on.
func TestRPCTraceToOldPeer(t *testing.T) {
	m := newMux(t, MuxConfig{})
	var traced atomic.Int32
	oldPeer(t, m, &traced)
	c := NewRPCClient(m.Addr().String(), nil, nil)
	defer c.Close()
	ctx := trace.ContextWithSpanContext(context.Background(), testSpan)
	for i := range 5 {
		body := fmt.Appendf(nil, "call-%d", i)
		out, err := c.Call(ctx, MethodReplicate, RPCMeta{Node: "n1", Cluster: "c"}, body)
		if err != nil || string(out) != string(body) {
			t.Fatalf("call %d to an old peer: %q, %v", i, out, err)
		}
	}
	if n := traced.Load(); n != 1 {
		t.Fatalf("the old peer got %d traced frames, want 1 (then untraced ones)", n)
	}
	// The old peer's own refusals still reach the caller.
	_, err := c.Call(ctx, MethodRaft, RPCMeta{}, nil)
	if connect.CodeOf(err) != connect.CodeUnimplemented || errors.Is(err, ErrRPCUnsupported) {
		t.Fatalf("unknown method: %v", err)
	}
}
