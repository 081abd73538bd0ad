// The project's benchmarks against other systems (make bench-peers). A
// module of its own so that the main module does not depend on their
// clients; it uses the Norn client of the work tree around it.
module github.com/norn-dev/norn/bench

go 1.26.0

require (
	github.com/nats-io/nats.go v1.55.0
	github.com/norn-dev/norn v0.0.0
)

require (
	connectrpc.com/connect v1.21.1 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/norn-dev/norn => ../
