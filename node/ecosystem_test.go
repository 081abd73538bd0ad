package node

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"github.com/hashicorp/go-hclog"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// bearer is an http.RoundTripper that adds a bearer token to each request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// TestReflection: gRPC server reflection (v1; grpcurl's default) lists
// the public services and the health service, not PeerService, and
// resolves TaskService's file; with an access file it needs a token.
func TestReflection(t *testing.T) {
	h, tok, _ := aliceAndRoot(t)
	ctx := context.Background()
	list := func(hc *http.Client) ([]protoreflect.FullName, error) {
		s := grpcreflect.NewClient(hc, h.srv.URL).NewStream(ctx)
		defer s.Close() //nolint:errcheck // the test's
		return s.ListServices()
	}
	if _, err := list(h2cClient()); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("reflection without a token: %v, want UNAUTHENTICATED", err)
	}
	hc := &http.Client{Transport: bearer{tok, h2cClient().Transport}}
	names, err := list(hc)
	if err != nil {
		t.Fatal(err)
	}
	want := []protoreflect.FullName{grpchealth.HealthV1ServiceName, nornv1connect.AdminServiceName,
		nornv1connect.QueueServiceName, nornv1connect.TaskServiceName}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Fatalf("reflection lists %v, want %v", names, want)
	}
	s := grpcreflect.NewClient(hc, h.srv.URL).NewStream(ctx)
	defer s.Close() //nolint:errcheck // the test's
	files, err := s.FileContainingSymbol(nornv1connect.TaskServiceName + ".Enqueue")
	if err != nil || len(files) == 0 || files[0].GetName() != "norn/v1/task_service.proto" {
		t.Fatalf("file of TaskService.Enqueue: %v, %v", files, err)
	}
	if _, err := s.FileContainingSymbol(nornv1connect.PeerServiceName); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("PeerService through reflection: %v, want NOT_FOUND", err)
	}
}

// TestHealth: grpc.health.v1 says what /healthz says: a node that cannot
// serve (its cluster not formed) is NOT_SERVING, a ready one SERVING, for
// the node and each public service; an unknown service is NOT_FOUND;
// Watch sends the change when a node loses its partitions' leaders.
func TestHealth(t *testing.T) {
	ctx := context.Background()
	// A node waiting for a second one to form the cluster: not ready.
	n, err := New(Config{DataDir: t.TempDir(), NodeID: "n1", MachineID: 1, Partitions: 8, BootstrapExpect: 2, Replication: 2,
		APIAddr: "127.0.0.1:1", SkewBuffer: testSkew, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RaftLogger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(n.Handler())
	srv.Config.Protocols = serverProtocols()
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		n.Close() //nolint:errcheck // the test's
	})
	lone := srv.URL
	check := func(url, service string) (grpchealth.Status, error) {
		r, err := grpchealth.NewClient(h2cClient(), url).Check(ctx, &grpchealth.CheckRequest{Service: service})
		if err != nil {
			return 0, err
		}
		return r.Status, nil
	}
	for _, svc := range append([]string{""}, publicServices...) {
		if st, err := check(lone, svc); err != nil || st != grpchealth.StatusNotServing {
			t.Fatalf("a node not formed, service %q: %v, %v; want NOT_SERVING", svc, st, err)
		}
	}
	if resp, err := http.Get(lone + "/healthz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/healthz of a node not formed: %v, %v", resp, err)
	}

	ms := testCluster(t, 3)
	url := "http://" + ms[0].cfg.APIAddr
	for _, svc := range append([]string{""}, publicServices...) {
		if st, err := check(url, svc); err != nil || st != grpchealth.StatusServing {
			t.Fatalf("a ready node, service %q: %v, %v; want SERVING", svc, st, err)
		}
	}
	if _, err := check(url, nornv1connect.PeerServiceName); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("health of PeerService: %v, want NOT_FOUND", err)
	}
	// Watch: SERVING now, NOT_SERVING once the others are gone.
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	stream, err := connect.NewClient[healthpb.HealthCheckRequest, healthpb.HealthCheckResponse](h2cClient(),
		url+"/grpc.health.v1.Health/Watch", connect.WithGRPC()).CallServerStream(wctx, connect.NewRequest(&healthpb.HealthCheckRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch's first status: %v, %v", stream.Msg(), stream.Err())
	}
	ms[1].stop()
	ms[2].stop()
	// The stopping nodes hand their leaderships over, so n1 may lead for
	// a moment before its leases lapse: the status settles at NOT_SERVING.
	waitFor(t, 20*time.Second, "n1 not serving", func() bool {
		st, err := check(url, "")
		return err == nil && st == grpchealth.StatusNotServing
	})
	// The watch sends each change, the last one NOT_SERVING (a change of
	// one status to the same is never sent).
	last := healthpb.HealthCheckResponse_SERVING
	for last != healthpb.HealthCheckResponse_NOT_SERVING {
		if !stream.Receive() {
			t.Fatalf("watch ended before NOT_SERVING: %v", stream.Err())
		}
		if stream.Msg().Status == last {
			t.Fatalf("watch sent %v twice in a row", last)
		}
		last = stream.Msg().Status
	}
}
