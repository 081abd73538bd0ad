// Command nornd is a Norn node. It parses flags (and an optional JSON config
// file), starts a node.Node and serves its API until SIGTERM or SIGINT,
// then shuts down gracefully: it stops accepting requests, lets those in
// flight finish, and closes the Raft groups and the store.
//
// Every option is listed by `nornd -h` and documented in docs/OPERATIONS.md.
package main
