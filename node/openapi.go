package node

import (
	"net/http"

	"github.com/norn-dev/norn/api/openapi"
)

// mountOpenAPI serves the OpenAPI 3.1 document of the HTTP/JSON API
// (package openapi: TaskService, QueueService and AdminService) at GET
// /openapi.yaml and /openapi.json. They are open to anyone, as /healthz
// is: the document describes the public API, as the published .proto
// files do, and holds no data of the node's. The edge (admit.go) passes
// them on unchecked, as every path outside the services'.
func mountOpenAPI(mux *http.ServeMux) {
	openapi.Mount(mux)
}
