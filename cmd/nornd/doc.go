// Command nornd is a Norn node. It parses flags (and an optional JSON config
// file), starts a node.Node and serves its API until SIGTERM or SIGINT,
// then shuts down gracefully: it stops accepting requests, lets those in
// flight finish, and closes the Raft groups and the store.
//
// Every option is a flag, a NORN_* environment variable and a key of the
// -config file (command line > environment > file > default), listed by
// `nornd -h` and in one table in docs/CONFIGURATION.md (flags.go defines
// them; TestConfigurationTable checks the table). Logs are log/slog, text
// or JSON, with levels per component (logging.go).
package main
