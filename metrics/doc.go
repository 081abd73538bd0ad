// Package metrics holds the node's Prometheus metrics that are not a
// part's own counters: the RPC metrics of every call served and made
// (one connect interceptor, and wrappers of the framed calls), the task
// metrics by queue, the Raft apply latency and Pebble's metrics. The
// node (package node) builds one registry per node, registers these and
// its own collector of the parts' counters, and serves it on /metrics.
//
// Use:
//
//	reg := metrics.NewRegistry()             // Go runtime and process collectors
//	rpc := metrics.NewRPC(reg)
//	peers := transport.NewPeers(transport.PeersConfig{
//		Interceptors: []connect.Interceptor{rpc.Interceptor()},
//		ObserveRPC:   rpc.ObserveFramedClient,
//	})
//	handlerOpts := connect.WithInterceptors(rpc.Interceptor(), auth) // first: outermost
//	framed := rpc.FramedServer(handler)      // transport.RPCHandler
//	refused := rpc.ObserveFramedRefused      // transport.RPCServerConfig.Refused
//	rpc.ObserveRefused(procedure, start, err) // a call refused before connect read it
//	tasks := metrics.NewTasks(reg)           // server.Config.Events, dispatch OnExpired/OnAborted
//	raft := metrics.NewRaft(reg, partitions) // replicas.Config.OnProposed
//	reg.MustRegister(metrics.NewPebble(store.Metrics, diskUsage))
//	http.Handle("GET /metrics", metrics.Handler(reg))
//
// Cost: the per-call paths (RPC, task events) find their series without
// a lock or an allocation once a series exists (see RPC and Tasks) and
// make a series on first use; everything else is read at scrape time.
//
// Cardinality bounds (docs/OPERATIONS.md, Metrics): queue label values
// MaxQueueLabels, then OtherQueue; per-partition Raft series only up to
// MaxPartitionLabels partitions; RPC series by the API's methods, two
// transports and 17 codes, made only when called.
package metrics
