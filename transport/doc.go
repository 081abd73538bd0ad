// Package transport holds the node-to-node plumbing below the protocols:
// the Raft stream mux, through which every Raft group of a node (one per
// partition, and the meta group) talks over one TCP listener, and Peers,
// the node's clients of other nodes' APIs.
//
// # Peers
//
// Peers holds one Peer (PeerService, TaskService and AdminService clients)
// per API address, made on first use over one shared HTTP/2 (h2c)
// transport whose calls leave from the node's own API IP. Request wraps a
// node-to-node request with the caller's identity: its node id
// (HeaderNode), and once the node holds a ring (Peers.SetRing, which
// replicas.Host sets as it starts) its cluster id and ring epoch
// (HeaderCluster, HeaderEpoch). A receiver checks the caller against its
// ring and gossip, refuses writes of a moving partition from an older
// ring, and pulls a newer one. HeaderHops marks calls one node forwarded
// to another, so that they travel at most a bounded number of hops.
//
// # Framed peer calls
//
// The hot peer call (Replicate) travels framed on the Raft port instead:
// ServeRPC serves the mux group PeerRPCGroup with an RPCHandler; an
// RPCClient (Peers.RPC, one per peer Raft address) keeps one connection,
// dialed on first use and again after a failure, on which concurrent
// calls are multiplexed by call id. Each call carries the caller's
// identity (RPCMeta, Peers.Meta: what Request puts in the headers), which
// the handler checks as PeerService does. Errors keep their connect code;
// a lost connection fails the calls waiting on it with UNAVAILABLE; a
// peer that serves no framed calls yields ErrRPCUnsupported, and the
// caller falls back to PeerService.
//
// # Framed client calls
//
// The same framing serves the Go client's hot TaskService calls on a
// node's API port: SplitListener routes connections that open with
// ClientRPCMagic to ServeRPCListener and the rest to net/http;
// NewClientRPCClient dials them. Client calls carry their timeout
// (ClientCallMeta) and cancel (MethodCancel); error answers carry their
// details.
//
// # Checks before a body is read, and the request budget
//
// ServeRPCWith's RPCServerConfig decides each framed call from its
// frame's header before the body is read (Admit: who calls; MaxFrame),
// and reads frames through a Budget: the bytes of requests a node holds
// at once, taken before they are read and given back when the call has
// been answered; a request that finds no room in time is refused
// RESOURCE_EXHAUSTED (ErrBudgetExhausted). Budget.Body does the same for
// an HTTP request's body (BudgetBody), which the node's API handler
// wraps around every call once it has admitted the caller.
//
// # Raft traffic of the partition groups
//
// Heartbeats wraps each partition group's NetworkTransport in a
// GroupTransport that sends its appends, votes, pre-votes and leadership
// transfers as framed calls (MethodRaft) and coalesces the heartbeats of
// all groups to one peer within a linger into one call
// (MethodRaftHeartbeats). The receiving node's Heartbeats hands each to
// its group (ServeRaft, Serve). Snapshots, and peers without framed
// calls, use the NetworkTransport. See Heartbeats for why.
//
// # Raft stream mux
//
// hashicorp/raft's NetworkTransport runs over a StreamLayer: a listener and
// a dialer. RaftMux gives each group its own StreamLayer (a GroupStream)
// over the node's one Raft port. A dialed connection starts with a 10-byte
// header, the magic "NRAFT\x01" and the group id (uint32, big endian);
// the accepting mux reads it (within HandshakeTimeout) and hands the
// connection to that group's Accept, or closes it when no such group is
// registered, the header is malformed, or the remote address is not
// allowed (MuxConfig.Allow, the membership check). After the header the
// connection is the group's alone: Raft's own framing, its own connection
// pool (NetworkTransportConfig.MaxPool). Pooled TCP connections, rather
// than a stream multiplexer such as yamux, keep one group's slow follower
// from blocking another group's traffic behind it and need no extra
// dependency; the cost is a few TCP connections per group and peer.
//
// Shut a group down in this order: close its GroupStream (the mux refuses
// new connections for it at once; closing the group's NetworkTransport does
// this), shut the Raft group down, then drop its data. A heartbeat that
// arrives late finds no group and is refused; it can never reach a group
// whose data is being dropped. Gate wraps a group's NetworkTransport so
// that its Close also waits for the heartbeats under way; Hold does the
// same and, until Release, answers every Raft request ErrHeld (the meta
// group's replica, until its node has checked the ring: replicas.Host).
package transport
