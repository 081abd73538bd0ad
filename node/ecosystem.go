package node

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// The gRPC ecosystem's own services on the API port (issue 46): server
// reflection, so grpcurl and grpcui list and call the API without its
// .proto files, and grpc.health.v1, so grpc_health_probe and
// Kubernetes' gRPC probes ask the node's readiness.

// publicServices are the services reflection lists and health answers
// for: the client API. PeerService, the nodes' own, is not listed.
var publicServices = []string{nornv1connect.TaskServiceName, nornv1connect.QueueServiceName, nornv1connect.AdminServiceName}

// healthWatchEvery is how often a Watch of the health service looks at
// the node's readiness (it sends only changes).
const healthWatchEvery = 250 * time.Millisecond

// mountEcosystem mounts reflection (v1 and v1alpha) and health on mux.
// Reflection needs an authenticated caller when the node checks callers
// (the edge admits it as a client call, any role); health is open, as
// GET /healthz is.
func (n *Node) mountEcosystem(mux *http.ServeMux) {
	opts := []connect.HandlerOption{connect.WithInterceptors(n.apiInterceptors()...)}
	names := append(slices.Clone(publicServices), grpchealth.HealthV1ServiceName)
	// The files are compiled in, so this fails only on a build whose
	// descriptors are broken: then no reflection rather than one that
	// would resolve PeerService's symbols.
	if files, err := publicFiles(names, nornv1.File_norn_v1_error_details_proto); err != nil {
		n.cfg.Logger.Error("gRPC reflection not served", "err", err)
	} else {
		reflector := grpcreflect.NewReflector(grpcreflect.NamerFunc(func() []string { return names }), grpcreflect.WithDescriptorResolver(files))
		mux.Handle(grpcreflect.NewHandlerV1(reflector, opts...))
		mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, opts...))
	}
	mux.Handle(grpchealth.NewHandler(healthChecker{ready: n.Ready, stop: n.stop}, opts...))
}

// reflectionPrefixes are the paths of the reflection services, which the
// edge admits as client calls.
var reflectionPrefixes = []string{"/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.ServerReflection/"}

// healthChecker answers grpc.health.v1 from the node's readiness, the
// same truth as GET /healthz: SERVING once every partition the node
// replicates has a leader, NOT_SERVING before (and while any has none),
// for the whole node ("") and for each public service alike.
type healthChecker struct {
	ready func() bool
	stop  <-chan struct{} // the node's: closed when it closes
}

func (h healthChecker) Check(_ context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	if req.Service != "" && !slices.Contains(publicServices, req.Service) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("service: %q is not served here (one of %v, or empty for the node)", req.Service, publicServices))
	}
	if h.ready() {
		return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
	}
	return &grpchealth.CheckResponse{Status: grpchealth.StatusNotServing}, nil
}

// Watch looks at the readiness every healthWatchEvery until the watch
// ends or the node closes; the handler sends a status only when it
// changed.
func (h healthChecker) Watch(_ context.Context, req *grpchealth.CheckRequest, onChange func()) (func(), error) {
	if _, err := h.Check(context.Background(), req); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(healthWatchEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-h.stop:
				return
			case <-t.C:
				onChange()
			}
		}
	}()
	return func() { close(done) }, nil
}

// publicFiles is a registry of the files that define services and what
// they import, and extra, so that reflection resolves no symbol of a file
// outside them (PeerService's).
func publicFiles(services []string, extra ...protoreflect.FileDescriptor) (*protoregistry.Files, error) {
	files := new(protoregistry.Files)
	var add func(f protoreflect.FileDescriptor) error
	add = func(f protoreflect.FileDescriptor) error {
		if _, err := files.FindFileByPath(f.Path()); err == nil {
			return nil
		}
		for i := range f.Imports().Len() {
			if err := add(f.Imports().Get(i).FileDescriptor); err != nil {
				return err
			}
		}
		return files.RegisterFile(f)
	}
	for _, s := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(s))
		if err != nil {
			return nil, fmt.Errorf("service %s: %w", s, err)
		}
		if err := add(d.ParentFile()); err != nil {
			return nil, err
		}
	}
	for _, f := range extra {
		if err := add(f); err != nil {
			return nil, err
		}
	}
	return files, nil
}
