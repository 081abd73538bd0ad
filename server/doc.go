// Package server is the API edge of a node: the connect handlers of
// norn.v1's services. A handler validates every field of its request
// (naming the field in the error, INVALID_ARGUMENT; sizes bounded),
// translates the API's messages into the node's domain types, calls the
// parts that do the work, and translates back. It holds no state and
// makes no decision of its own, so that authorization and request
// metrics have one obvious place: around these handlers.
//
//	sv := server.New(server.Config{Coord: c, Dispatch: d, Host: h, ...})
//	mux.Handle(nornv1connect.NewTaskServiceHandler(sv.TaskService(), opts...))
//	mux.Handle(nornv1connect.NewAdminServiceHandler(sv.AdminService(), opts...))
//	mux.Handle(nornv1connect.NewPeerServiceHandler(sv.PeerService(), opts...))
//
// Where a TaskService call goes:
//
//	Enqueue, EnqueueBatch   specFromAPI -> coord.Write (quorum W)             tasks.go
//	  with a unique key     the key's group decides (decideUnique) first     unique.go
//	GetTask, List, Count    coord.Read / coord.List / coord.Count              tasks.go
//	Claim                   dispatch.Claim (long poll, proxied claims)        claims.go
//	Renew, Yield            coord.Forward to the leader, dispatch.LoadClaimed,
//	                        dispatch.Propose (the claim FSM)                   claims.go
//	Update                  dispatch.LoadClaimed, LiveClaim -> coord.Write     claims.go
//	Complete, Abort         dispatch.LoadClaimed, LiveClaim -> coord.Write     finish.go
//	CompleteBatch           grouped by partition leader, forwarded in batches finish.go
//	Cancel                  coord.Forward, coord.Load (or Read) -> coord.Write tasks.go
//
// AdminService (admin.go, placement.go): Status gathers the node's view
// (its ring, groups, members with their clock offsets, counts and the
// replicas' Merkle roots); the placement calls (Join, Rebalance, Drain,
// Decommission, Remove) go to the meta leader through
// rebalance.ToMetaLeader, and so do the schedule calls (schedules.go),
// whose ticks the meta leader runs (RunSchedulesOnce, scheduler.go).
//
// Who calls is checked twice: before the body is read, by the node's
// HTTP layer through AdmitPeer (PeerService: a node of this cluster) and
// AdmitClient (TaskService, AdminService: with access control on, a
// certificate or a valid token), so that nobody else makes the node read
// a body; then, on the decoded request, by method and queue (auth.go).
//
// PeerService (peer.go) serves the other nodes only: every call first
// passes checkPeer (the caller's node id, address and cluster id against
// the ring and gossip), then goes to coord (Replicate, Read, ListPartition,
// CountPartitions), antientropy (TreeRoots, TreeNodes, SegmentEntries),
// rebalance (ChangeGroup, ReplicaProgress), the host's ring (GetRing) or
// dispatch (ReadyHeads, UniqueKeys: a unique key decided by its
// partition's group).
//
// Errors of the parts come back through apierr, which maps them to
// connect codes (DESIGN section 6).
package server
