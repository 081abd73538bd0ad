// Package nornv1 holds the Go types of Norn's public API, version 1:
// the protobuf messages of norn.v1.TaskService and norn.v1.AdminService,
// generated from the .proto files in this directory. The .proto files are
// the contract and carry the documentation of every field (meaning, unit,
// default, limits); the Go types mirror them one to one.
//
// Servers and clients use the Connect handlers and clients of the
// nornv1connect subpackage, which speak gRPC, gRPC-Web and the Connect
// protocol (JSON over plain HTTP, so curl works) on one port:
//
//	mux := http.NewServeMux()
//	mux.Handle(nornv1connect.NewTaskServiceHandler(srv)) // srv implements nornv1connect.TaskServiceHandler
//	mux.Handle(nornv1connect.NewAdminServiceHandler(adm))
//
//	c := nornv1connect.NewTaskServiceClient(http.DefaultClient, "http://127.0.0.1:7400")
//	res, err := c.Enqueue(ctx, connect.NewRequest(&nornv1.EnqueueRequest{
//		Task: &nornv1.TaskSpec{Queue: "emails", Payload: body},
//	}))
//
// A write that misses its quorum fails with connect.CodeUnavailable and a
// WriteFailure detail naming the task ids to retry with:
//
//	var cerr *connect.Error
//	if errors.As(err, &cerr) && cerr.Code() == connect.CodeUnavailable {
//		for _, d := range cerr.Details() {
//			if m, err := d.Value(); err == nil {
//				if wf, ok := m.(*nornv1.WriteFailure); ok {
//					// retry the same request with wf.Ids
//				}
//			}
//		}
//	}
//
// (A server attaches it with connect.NewErrorDetail(&nornv1.WriteFailure{...})
// and (*connect.Error).AddDetail.)
//
// # JSON
//
// Over HTTP/JSON the field names are proto3 JSON's lowerCamelCase
// (notBefore, claimId, dependsOn), uint64 ids are strings, timestamps RFC
// 3339 strings, durations strings like "30s", bytes base64 and enums their
// full names (TASK_STATUS_READY). json_test.go pins this down.
//
// # Regenerating
//
// Everything named *.pb.go here and *.connect.go in nornv1connect is
// generated: never edit it. After changing a .proto file, run
//
//	make proto        # buf generate at the pinned versions (api/buf.gen.yaml)
//	make proto-check  # buf lint, and fail if the generated code is stale
//
// make proto also regenerates the OpenAPI document of the HTTP/JSON API
// (package github.com/norn-dev/norn/api/openapi, api/buf.openapi.yaml),
// which make proto-check checks the same way.
//
// buf runs through `go run` at the version pinned in the Makefile, and the
// protoc-gen-go and protoc-gen-connect-go plugins are `tool` directives in
// go.mod, so they match the protobuf and connect runtimes the module links
// against. Nothing needs installing. Keep changes wire compatible: add
// fields and values, never renumber, retype or reuse them.
package nornv1
