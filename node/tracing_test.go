package node

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/norn-dev/norn/antientropy"
	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/client"
	"github.com/norn-dev/norn/coord"
)

// tracedCluster starts a 3-node cluster whose nodes trace every request
// (each with its own provider, naming the node in its resource) into one
// recorder.
func tracedCluster(t *testing.T) ([]*member, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	ms := testClusterWith(t, 3, func(_ int, cfg *Config) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr),
			sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.instance.id", cfg.NodeID))))
		t.Cleanup(func() { tp.Shutdown(context.Background()) })
		cfg.TracerProvider = tp
	})
	return ms, sr
}

// spanNode is the node that recorded s.
func spanNode(s sdktrace.ReadOnlySpan) string {
	v, _ := s.Resource().Set().Value("service.instance.id")
	return v.AsString()
}

func spanAttr(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, a := range s.Attributes() {
		if a.Key == key {
			return a.Value
		}
	}
	return attribute.Value{}
}

// inTrace returns the ended spans of trace id, by span id.
func inTrace(sr *tracetest.SpanRecorder, id trace.TraceID) map[trace.SpanID]sdktrace.ReadOnlySpan {
	out := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range sr.Ended() {
		if s.SpanContext().TraceID() == id {
			out[s.SpanContext().SpanID()] = s
		}
	}
	return out
}

// TestTracingEnqueueAcrossNodes: one enqueue from the Go client under a
// producer's span is one trace across the three nodes. The coordinator's
// server span is the producer span's child, norn.coord.write is below
// it, each of the three replicas has its norn.replica.write under that,
// and the two other nodes' Replicate server spans are children of their
// replica's span, recorded by those nodes: the trace context crossed the
// client hop and the peer hop. Both ways a call travels: framed (the
// client's default in cleartext, replication framed on the Raft port) and
// connect.
func TestTracingEnqueueAcrossNodes(t *testing.T) {
	ms, sr := tracedCluster(t)
	producer := sdktrace.NewTracerProvider() // the application's own tracing
	defer producer.Shutdown(context.Background())

	// n1's API as nornd serves it: HTTP and the framed client calls.
	addr, framedCalls := serveSplit(t, ms[0].node)
	for _, framed := range []bool{true, false} {
		t.Run(fmt.Sprintf("framed=%v", framed), func(t *testing.T) {
			before := framedCalls.Load()
			c, err := client.New(addr, client.WithFramedCalls(framed), client.WithDiscovery(0))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, root := producer.Tracer("app").Start(context.Background(), "app.enqueue")
			id, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "traced", Payload: []byte("secret payload")}, client.WithQuorum(3))
			root.End()
			if err != nil {
				t.Fatal(err)
			}
			if sent := framedCalls.Load() > before; sent != framed {
				t.Fatalf("framed calls answered: %v, want %v", sent, framed)
			}
			tid := root.SpanContext().TraceID()

			// Every replica acked (w=3) before the answer; the spans end
			// as their calls return.
			var spans map[trace.SpanID]sdktrace.ReadOnlySpan
			byName := func(name string) []sdktrace.ReadOnlySpan {
				var out []sdktrace.ReadOnlySpan
				for _, s := range spans {
					if s.Name() == name {
						out = append(out, s)
					}
				}
				return out
			}
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				spans = inTrace(sr, tid)
				if len(byName("norn.v1.TaskService/Enqueue")) == 1 && len(byName(coord.SpanWrite)) == 1 &&
					len(byName(coord.SpanReplicaWrite)) == 3 && len(byName("norn.v1.PeerService/Replicate")) == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the enqueue's trace holds %s", spanNames(spans))
				}
			}

			server := byName("norn.v1.TaskService/Enqueue")[0]
			if server.Parent().SpanID() != root.SpanContext().SpanID() || server.SpanKind() != trace.SpanKindServer {
				t.Fatalf("the node's Enqueue span: parent %v, want the producer's %v", server.Parent().SpanID(), root.SpanContext().SpanID())
			}
			coordinator := spanNode(server)
			write := byName(coord.SpanWrite)[0]
			if spanNode(write) != coordinator || !descends(spans, write, server) {
				t.Fatalf("%s on %s is not below the Enqueue span on %s", coord.SpanWrite, spanNode(write), coordinator)
			}
			p := int64(ms[0].node.partition(id))
			if spanAttr(write, coord.AttrTasks).AsInt64() != 1 || spanAttr(write, coord.AttrW).AsInt64() != 3 ||
				spanAttr(write, coord.AttrAcks).AsInt64() != 3 || spanAttr(write, coord.AttrPartition).AsInt64() != p {
				t.Fatalf("%s attributes %v (partition %d)", coord.SpanWrite, write.Attributes(), p)
			}
			replicaSpan := map[string]sdktrace.ReadOnlySpan{}
			for _, s := range byName(coord.SpanReplicaWrite) {
				if s.Parent().SpanID() != write.SpanContext().SpanID() || spanNode(s) != coordinator {
					t.Fatalf("%s %v is not a child of %s on the coordinator", coord.SpanReplicaWrite, s.Attributes(), coord.SpanWrite)
				}
				replicaSpan[spanAttr(s, coord.AttrReplica).AsString()] = s
				if local := spanAttr(s, coord.AttrLocal).AsBool(); local != (spanAttr(s, coord.AttrReplica).AsString() == coordinator) {
					t.Fatalf("%s %v: norn.local %v", coord.SpanReplicaWrite, s.Attributes(), local)
				}
			}
			if len(replicaSpan) != 3 {
				t.Fatalf("replica spans for %v, want n1, n2 and n3", replicaSpan)
			}
			// The peer hop: each other node's server span is the child of
			// the coordinator's span for that node's replica.
			var remote []string
			for _, s := range byName("norn.v1.PeerService/Replicate") {
				node := spanNode(s)
				remote = append(remote, node)
				rs := replicaSpan[node]
				if node == coordinator || rs == nil || s.Parent().SpanID() != rs.SpanContext().SpanID() {
					t.Fatalf("Replicate span on %s: parent %v, want %s's replica span", node, s.Parent().SpanID(), node)
				}
			}
			slices.Sort(remote)
			if len(remote) != 2 || remote[0] == remote[1] {
				t.Fatalf("Replicate spans on %v, want the two other nodes", remote)
			}
			system := spanAttr(server, "rpc.system.name").AsString()
			if framed != (system == "norn_framed") {
				t.Fatalf("Enqueue span's rpc.system %q with framed calls %v", system, framed)
			}
			for _, s := range spans {
				for _, a := range s.Attributes() {
					if a.Value.Type() == attribute.STRING && a.Value.AsString() == "secret payload" {
						t.Fatalf("span %s carries the payload in %s", s.Name(), a.Key)
					}
				}
			}
		})
	}
}

// descends reports whether s is below ancestor in spans.
func descends(spans map[trace.SpanID]sdktrace.ReadOnlySpan, s, ancestor sdktrace.ReadOnlySpan) bool {
	for p := s.Parent().SpanID(); p.IsValid(); {
		if p == ancestor.SpanContext().SpanID() {
			return true
		}
		next, ok := spans[p]
		if !ok {
			return false
		}
		p = next.Parent().SpanID()
	}
	return false
}

// spanNames lists spans as name@node, for failure messages.
func spanNames(spans map[trace.SpanID]sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name()+"@"+spanNode(s))
	}
	slices.Sort(out)
	return out
}

// TestTracingClaimAcrossNodes: a claim sent to a node that does not lead
// the task's partition is proxied over connect to the leader, which
// proposes it: the proposal's span (norn.claims.propose, on the leader)
// is in the worker's trace below the proxied call, and every replica's
// apply of the entry (norn.claims.apply, on all three nodes) is its
// child: the trace context crossed the connect peer hop and travelled in
// the Raft entry.
func TestTracingClaimAcrossNodes(t *testing.T) {
	ms, sr := tracedCluster(t)
	producer := sdktrace.NewTracerProvider()
	defer producer.Shutdown(context.Background())
	resp, err := ms[0].api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{
		Task: &nornv1.TaskSpec{Queue: "traced-claim"}, W: 3}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.Id
	leader, others := partitionRoles(t, ms, ms[0].node.partition(id))
	c, err := client.New(others[0].cfg.APIAddr, client.WithDiscovery(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, root := producer.Tracer("app").Start(context.Background(), "app.claim")
	got, err := c.Claim(ctx, client.ClaimRequest{Queue: "traced-claim", Worker: "w1", Lease: time.Minute})
	root.End()
	if err != nil || len(got) != 1 || got[0].GetTask().GetId() != id {
		t.Fatalf("claim: %v, %v", got, err)
	}

	var spans map[trace.SpanID]sdktrace.ReadOnlySpan
	var propose sdktrace.ReadOnlySpan
	applied := map[string]sdktrace.ReadOnlySpan{}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		spans = inTrace(sr, root.SpanContext().TraceID())
		clear(applied)
		propose = nil
		for _, s := range spans {
			switch s.Name() {
			case claims.SpanPropose:
				propose = s
			case claims.SpanApply:
				applied[spanNode(s)] = s
			}
		}
		if propose != nil && len(applied) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the claim's trace holds %s", spanNames(spans))
		}
	}
	if spanNode(propose) != leader.cfg.NodeID || spanAttr(propose, claims.AttrOp).AsString() != "claim" ||
		spanAttr(propose, claims.AttrTasks).AsInt64() != 1 {
		t.Fatalf("%s on %s with %v, want on the leader %s", claims.SpanPropose, spanNode(propose), propose.Attributes(), leader.cfg.NodeID)
	}
	// Up the parents from the proposal: the leader's server span of the
	// proxied Claim, the asking node's client span, its server span, the
	// worker's span.
	var path []string
	for s := propose; ; {
		p, ok := spans[s.Parent().SpanID()]
		if !ok {
			if s.Parent().SpanID() != root.SpanContext().SpanID() {
				t.Fatalf("the path up from the proposal %q ends at %v, not the worker's span", path, s.Parent().SpanID())
			}
			break
		}
		path = append(path, fmt.Sprintf("%s@%s/%s", p.Name(), spanNode(p), p.SpanKind()))
		s = p
	}
	want := []string{
		"norn.v1.TaskService/Claim@" + leader.cfg.NodeID + "/server",
		"norn.v1.TaskService/Claim@" + others[0].cfg.NodeID + "/client",
		"norn.v1.TaskService/Claim@" + others[0].cfg.NodeID + "/server",
	}
	if !slices.Equal(path, want) {
		t.Fatalf("the proposal's ancestors %q, want %q", path, want)
	}
	for node, s := range applied {
		if s.Parent().SpanID() != propose.SpanContext().SpanID() || spanAttr(s, claims.AttrRaftIndex).AsInt64() == 0 {
			t.Fatalf("%s on %s: parent %v, attributes %v", claims.SpanApply, node, s.Parent().SpanID(), s.Attributes())
		}
	}
}

// TestTracingAntiEntropyRound: a round is a root span on the node that
// runs it, and the peer's answers to its PeerService calls are in the
// same trace (the connect peer hop).
func TestTracingAntiEntropyRound(t *testing.T) {
	ms, sr := tracedCluster(t)
	ms[0].node.ae.Kick()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		for _, s := range sr.Ended() {
			if s.Name() != antientropy.SpanRound || spanNode(s) != "n1" {
				continue
			}
			peer := spanAttr(s, antientropy.AttrPeer).AsString()
			// Any round of n1 will do (a round may cover fewer than the
			// 8 partitions: seen under load in make test-stress).
			if s.Parent().IsValid() || peer == "" || spanAttr(s, antientropy.AttrPartitions).AsInt64() < 1 {
				t.Fatalf("round span: parent %v, attributes %v", s.Parent(), s.Attributes())
			}
			for _, c := range inTrace(sr, s.SpanContext().TraceID()) {
				if c.Name() == "norn.v1.PeerService/TreeRoots" && spanNode(c) == peer && c.SpanKind() == trace.SpanKindServer {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no round of n1 with its peer's answer in its trace; spans: %d", len(sr.Ended()))
		}
	}
}
