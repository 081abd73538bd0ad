// Package access is who may call what on a Norn node (docs/SECURITY.md):
// the access file's format (users, their grants of a role on queue
// patterns, and bearer tokens kept as SHA-256 hashes), the roles, and the
// node's Rules, read again when the file changes. The API edge
// (server.AuthInterceptor) enforces them; nornctl token and grant, and
// the Jepsen harness, write the file.
package access
