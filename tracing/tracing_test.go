package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/norn-dev/norn/transport"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// Tracing is off unless the environment asks for it, and a value that
// cannot be used fails rather than losing traces silently.
func TestFromEnvOffAndErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		getenv  func(string) string
		wantErr bool
	}{
		{"nothing set", env(), false},
		{"exporter none", env(EnvTracesExporter, "none", EnvEndpoint, "http://127.0.0.1:4318"), false},
		{"sdk disabled", env(EnvSDKDisabled, "true", EnvTracesExporter, "otlp"), false},
		{"only a sampler", env(EnvTracesSampler, "always_on"), false},
		{"unknown exporter", env(EnvTracesExporter, "zipkin"), true},
		{"two exporters", env(EnvTracesExporter, "otlp,console"), true},
		{"unknown protocol", env(EnvTracesExporter, "otlp", EnvProtocol, "http/json"), true},
		{"unknown sampler", env(EnvEndpoint, "http://127.0.0.1:4318", EnvTracesSampler, "sometimes"), true},
		{"ratio not a number", env(EnvTracesExporter, "console", EnvTracesSampler, "traceidratio", EnvTracesSamplerArg, "half"), true},
		{"ratio above 1", env(EnvTracesExporter, "console", EnvTracesSampler, "parentbased_traceidratio", EnvTracesSamplerArg, "2"), true},
	} {
		tp, err := FromEnv(tc.getenv, Resource{}, io.Discard)
		if tp != nil {
			tp.Shutdown(context.Background())
			t.Errorf("%s: tracing on, want off", tc.name)
		}
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err %v, want error %v", tc.name, err, tc.wantErr)
		}
	}
}

// The console exporter writes the spans, with the node's resource, when
// the provider shuts down; the sampler of the environment applies.
func TestFromEnvConsole(t *testing.T) {
	var out bytes.Buffer
	tp, err := FromEnv(env(EnvTracesExporter, "console"), Resource{Instance: "n7", Version: "v1.2.3"}, &out)
	if err != nil || tp == nil {
		t.Fatalf("console: %v, %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(context.Background(), "norn.test.span")
	span.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"Name":"norn.test.span"`, `"Value":"nornd"`, `"Value":"n7"`, `"Value":"v1.2.3"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("console output lacks %s:\n%s", want, out.String())
		}
	}

	out.Reset()
	tp, err = FromEnv(env(EnvTracesExporter, "console", EnvTracesSampler, "traceidratio", EnvTracesSamplerArg, "0"), Resource{}, &out)
	if err != nil {
		t.Fatal(err)
	}
	_, span = tp.Tracer("test").Start(context.Background(), "norn.test.unsampled")
	span.End()
	tp.Shutdown(context.Background())
	if out.Len() != 0 {
		t.Fatalf("ratio 0 exported spans: %s", out.String())
	}
}

// With only OTEL_EXPORTER_OTLP_ENDPOINT set, spans go to that collector
// over OTLP/HTTP protobuf (the default protocol), and OTEL_SERVICE_NAME
// names the service.
func TestFromEnvOTLPHTTP(t *testing.T) {
	var mu sync.Mutex
	var names []string
	var service string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.GetKey() == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					names = append(names, s.GetName())
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Write(b)
	}))
	defer srv.Close()
	t.Setenv(EnvEndpoint, srv.URL) // the exporter reads the process environment
	t.Setenv("OTEL_SERVICE_NAME", "norn-east")
	tp, err := FromEnv(env(EnvEndpoint, srv.URL), Resource{Instance: "n1"}, io.Discard)
	if err != nil || tp == nil {
		t.Fatalf("otlp: %v, %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(context.Background(), "norn.test.exported")
	span.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(names) != 1 || names[0] != "norn.test.exported" || service != "norn-east" {
		t.Fatalf("collector got spans %q of service %q", names, service)
	}
}

func recorder() (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	sr := tracetest.NewSpanRecorder()
	return sr, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
}

// FramedServer makes a server span per client call, a child of the
// caller's span when the call carried one; a peer call only when its
// caller traced it.
func TestFramedServer(t *testing.T) {
	sr, tp := recorder()
	var seen trace.SpanContext
	h := FramedServer(tp, func(ctx context.Context, m transport.RPCMethod, _ transport.RPCMeta, _ []byte) ([]byte, error) {
		seen = trace.SpanContextFromContext(ctx)
		if m == transport.MethodClaim {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("superseded"))
		}
		return nil, nil
	})
	ctx := context.Background()
	// A client call without a trace: a root span.
	h(ctx, transport.MethodEnqueue, transport.RPCMeta{}, nil)
	// A peer call without a trace: none.
	h(ctx, transport.MethodReplicate, transport.RPCMeta{}, nil)
	// A peer call with the caller's trace: a child.
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{9}, SpanID: trace.SpanID{8}, TraceFlags: trace.FlagsSampled, Remote: true})
	h(trace.ContextWithRemoteSpanContext(ctx, parent), transport.MethodReplicate, transport.RPCMeta{Trace: parent}, nil)
	if seen.TraceID() != parent.TraceID() || seen.SpanID() == parent.SpanID() {
		t.Fatalf("the handler ran under %v, want a child of %v", seen, parent)
	}
	// A failed call.
	h(ctx, transport.MethodClaim, transport.RPCMeta{}, nil)
	// A Raft call: none.
	h(ctx, transport.MethodRaftHeartbeats, transport.RPCMeta{}, nil)

	spans := sr.Ended()
	var got []string
	for _, s := range spans {
		got = append(got, s.Name())
	}
	want := []string{"norn.v1.TaskService/Enqueue", "norn.v1.PeerService/Replicate", "norn.v1.TaskService/Claim"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("spans %q, want %q", got, want)
	}
	if spans[0].Parent().IsValid() || spans[0].SpanKind() != trace.SpanKindServer {
		t.Errorf("client call span: parent %v, kind %v", spans[0].Parent(), spans[0].SpanKind())
	}
	if spans[1].Parent().SpanID() != parent.SpanID() || spans[1].SpanContext().TraceID() != parent.TraceID() {
		t.Errorf("peer call span: parent %v, trace %v", spans[1].Parent(), spans[1].SpanContext().TraceID())
	}
	if spans[2].Status().Code.String() != "Error" {
		t.Errorf("failed call's status: %v", spans[2].Status())
	}
	attrs := map[string]string{}
	for _, a := range spans[0].Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	if attrs["rpc.system.name"] != RPCSystemFramed || attrs["rpc.method"] != "norn.v1.TaskService/Enqueue" || attrs["rpc.response.status_code"] != "OK" {
		t.Errorf("attributes %v", attrs)
	}
	for _, a := range spans[2].Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	if attrs["rpc.response.status_code"] != "FAILED_PRECONDITION" || attrs["error.type"] != "FAILED_PRECONDITION" {
		t.Errorf("failed call's attributes %v", attrs)
	}
}

// A record logged under a span carries its trace and span ids; others
// none.
func TestLogHandler(t *testing.T) {
	_, tp := recorder()
	var buf bytes.Buffer
	logger := slog.New(LogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "coord")
	ctx, span := tp.Tracer("test").Start(context.Background(), "req")
	logger.InfoContext(ctx, "traced", "id", 1)
	span.End()
	logger.InfoContext(context.Background(), "untraced")
	logger.Info("no context")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines: %s", len(lines), buf.String())
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	sc := span.SpanContext()
	if first[LogTraceIDKey] != sc.TraceID().String() || first[LogSpanIDKey] != sc.SpanID().String() || first["component"] != "coord" {
		t.Fatalf("traced line %v, want trace %s span %s", first, sc.TraceID(), sc.SpanID())
	}
	for _, l := range lines[1:] {
		if strings.Contains(l, LogTraceIDKey) || strings.Contains(l, LogSpanIDKey) {
			t.Fatalf("untraced line carries ids: %s", l)
		}
	}
}
