package console

import (
	"bytes"
	"errors"
	"io"
	"net/http"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// apiBase is the base URL of the in-process calls: the host is never
// dialled (apiTransport serves every request).
const apiBase = "http://console.invalid"

// clients are the API's clients for one browser request: each call is
// served in process by the node's API handler, as the browser: its
// session token as a bearer token, its TLS connection state (a client
// certificate) and address as its own.
type clients struct {
	tasks  nornv1connect.TaskServiceClient
	admin  nornv1connect.AdminServiceClient
	queues nornv1connect.QueueServiceClient
}

func (c *Console) clientsFor(r *http.Request, s session) clients {
	hc := &http.Client{Transport: apiTransport{api: c.cfg.API, from: r, token: s.token}}
	return clients{
		tasks:  nornv1connect.NewTaskServiceClient(hc, apiBase),
		admin:  nornv1connect.NewAdminServiceClient(hc, apiBase),
		queues: nornv1connect.NewQueueServiceClient(hc, apiBase),
	}
}

// apiTransport serves a client's request with the API handler in process.
type apiTransport struct {
	api   http.Handler
	from  *http.Request // the browser's request
	token string
}

func (t apiTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.RemoteAddr = t.from.RemoteAddr
	r.TLS = t.from.TLS
	r.RequestURI = r.URL.RequestURI()
	r.Host = t.from.Host
	if t.token != "" {
		r.Header.Set("Authorization", "Bearer "+t.token)
	}
	if r.Body == nil {
		r.Body = http.NoBody
	}
	w := &recorder{header: http.Header{}}
	t.api.ServeHTTP(w, r)
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return &http.Response{
		Status: http.StatusText(w.status), StatusCode: w.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.header, Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len()), Request: req,
	}, nil
}

// recorder is the http.ResponseWriter of an in-process call.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *recorder) Header() http.Header { return w.header }

func (w *recorder) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *recorder) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

// errText is an API error as the pages show it: its code and message.
func errText(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code().String() + ": " + ce.Message()
	}
	return err.Error()
}
