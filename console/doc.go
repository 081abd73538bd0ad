// Package console is Norn's web console (issue 45; docs/CONSOLE.md): HTML
// pages served by nornd at /ui/ on the API port, rendered on the server
// from Go templates (html/template escapes every value, so a payload or
// an error holding <script> shows as text), with a few lines of plain
// JavaScript for live updates and no build step. Its assets are embedded
// in the binary.
//
// The console reads and acts only through the public API (TaskService,
// AdminService, QueueService): each page calls the node's own API handler
// in process (apiTransport) with the browser's credentials, its session
// token as a bearer token or its TLS client certificate, so every call
// passes the same checks as any client's (the caller's roles and queues,
// the request budgets, the audit log), and whatever the console shows a
// script can read too. One exception: the overview's sparklines sample
// the node's own metrics registry (sparks.go), the numbers /metrics
// serves to Prometheus, not an API call.
//
// Sessions: with access control on (TLS or an access file) the login
// page takes a bearer token, checked with AdminService.WhoAmI and kept in
// a cookie marked Secure, HttpOnly and SameSite=Strict; a browser with a
// client certificate of the cluster's CA needs no login. Logins are rate
// limited per client address. Every action is a POST carrying a CSRF
// token (an HMAC of the session under a per-process key) and, when the
// browser sends one, an Origin of the console's own host.
package console
