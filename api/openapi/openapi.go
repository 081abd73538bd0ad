// Package openapi holds the OpenAPI 3.1 document of Norn's HTTP/JSON API
// (Connect's unary protocol: POST /norn.v1.TaskService/Enqueue with a
// proto3 JSON body): TaskService, QueueService and AdminService, not the
// nodes' own PeerService. nornd serves it at GET /openapi.yaml and
// /openapi.json on the API port.
//
// The document is generated from the .proto files by `make proto`
// (protoc-gen-connect-openapi, run by buf with ../buf.openapi.yaml; the
// generator is a tool of the separate module ../tools) and committed;
// `make lint` fails when it is stale. Never edit norn.openapi.yaml or
// norn.openapi.json: change the .proto files, base.yaml (info) or
// override.yaml (the schemas that replace the generator's), then run make
// proto. docs/API.md, "OpenAPI".
package openapi

import (
	_ "embed"
	"net/http"
)

// YAML is the document in YAML (norn.openapi.yaml).
//
//go:embed norn.openapi.yaml
var YAML []byte

// JSON is the same document in JSON (norn.openapi.json).
//
//go:embed norn.openapi.json
var JSON []byte

// Paths where Mount serves the document.
const (
	PathYAML = "/openapi.yaml"
	PathJSON = "/openapi.json"
)

// Mount serves the document on mux at GET PathYAML and PathJSON, to
// anyone: it describes the public API, as the published .proto files do.
func Mount(mux *http.ServeMux) {
	mux.Handle("GET "+PathYAML, document("application/yaml", YAML))
	mux.Handle("GET "+PathJSON, document("application/json", JSON))
}

// document serves body with its content type.
func document(contentType string, body []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Write(body) //nolint:errcheck // the caller is gone
	})
}
