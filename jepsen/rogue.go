package jepsen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/jepsen/check"
	"github.com/norn-dev/norn/transport"
)

// The rogue-node scenario: while the workload runs, outsiders try the
// secure cluster's doors (docs/SECURITY.md). A nornd "n9" with a
// certificate and a gossip key of another CA tries to join; and the
// harness, from the addresses of members, opens Raft streams and sends
// PeerService writes of tasks in the queue "rogue" with certificates of
// another CA (claiming a member's id), with a certificate of the right CA
// for a node that is not a member (n9), and with a client's certificate.
// Every attempt must be refused, n9 must never show among any node's
// members, and no task of queue "rogue" may exist at the end; the other
// checkers must pass as always.

// rogueID is the outsider's node id; rogueQueue the queue of its writes.
const (
	rogueID    = "n9"
	rogueQueue = "rogue"
)

// Rogue records the attempts and what got through.
type Rogue struct {
	mu       sync.Mutex
	attempts map[string]int
	through  []string
}

func (r *Rogue) note(kind string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attempts == nil {
		r.attempts = map[string]int{}
	}
	r.attempts[kind]++
	if err != nil {
		r.through = append(r.through, fmt.Sprintf("%s: %v", kind, err))
	}
}

// nemesisRogue runs the outsider nornd and the harness's attempts until
// ctx ends.
func nemesisRogue(ctx context.Context, e *Env) {
	r := e.Rogue
	sec := e.C.sec
	if sec == nil {
		r.note("setup", errors.New("the cluster does not run secure: nothing to attack"))
		return
	}
	foreign := filepath.Join(e.C.DataRoot, "rogue-certs")
	members := e.C.Active()
	setup := []error{transport.CreateCA(foreign, "rogue CA"), transport.CreateGossipKey(foreign),
		transport.CreateNodeCert(foreign, rogueID, []string{NodeIP(9)}),
		transport.CreateNodeCert(sec.dir, rogueID, []string{NodeIP(9)})} // the right CA, not a member
	for _, n := range members {
		setup = append(setup, transport.CreateNodeCert(foreign, n.ID, []string{n.IP}))
	}
	if err := errors.Join(setup...); err != nil {
		r.note("setup", err)
		return
	}
	stop, err := startRogueNode(e, foreign, members)
	e.TL.Log("start", "rogue", rogueID+" with another CA's certificate and gossip key joins; the harness opens Raft streams and PeerService writes with wrong certificates", err)
	if err != nil {
		r.note("setup", err)
		return
	}
	defer func() {
		stop()
		e.TL.Log("end", "rogue", rogueID+" stopped", nil)
	}()
	type cred struct {
		name      string
		dir, node string // the certificate: dir's node-<node> (or client-<node> when user)
		user      bool
	}
	creds := func(claim *Node) []cred {
		return []cred{
			{name: "another CA's certificate of " + claim.ID, dir: foreign, node: claim.ID},
			{name: "the CA's certificate of non-member " + rogueID, dir: sec.dir, node: rogueID},
			{name: "a client's certificate", dir: sec.dir, node: "jepsen", user: true},
		}
	}
	for i := 0; ctx.Err() == nil; i++ {
		target := members[e.Rng.IntN(len(members))]
		from := members[e.Rng.IntN(len(members))] // an address a member has
		cs := creds(from)
		c := cs[e.Rng.IntN(len(cs))]
		cert, key := transport.NodeCertFiles(c.dir, c.node)
		if c.user {
			cert, key = transport.ClientCertFiles(c.dir, c.node)
		}
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			r.note("setup", err)
			return
		}
		if i%2 == 0 {
			r.note("raft stream ("+c.name+")", rogueRaft(ctx, target, from, kp))
		} else {
			r.note("PeerService write ("+c.name+")", rogueReplicate(ctx, target, from, kp, uint64(0x7000_0000_0000_0000)+uint64(i)))
		}
		if !sleep(ctx, e.between(50*time.Millisecond, 300*time.Millisecond)) {
			return
		}
	}
}

// startRogueNode starts nornd n9 on 127.0.0.19 with foreign's
// certificates and gossip key, joining the members' gossip; stop kills it.
func startRogueNode(e *Env, foreign string, members []*Node) (stop func(), err error) {
	var join []string
	for _, n := range members {
		join = append(join, fmt.Sprintf("%s:%d", n.IP, gossipPort))
	}
	ip := NodeIP(9)
	cert, key := transport.NodeCertFiles(foreign, rogueID)
	dir, err := os.MkdirTemp(e.C.DataRoot, "rogue-")
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(e.C.Cfg.Dir, "logs", rogueID+"-rogue.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(e.C.Cfg.Bin, "-node-id", rogueID, "-machine-id", "9", "-data-dir", dir,
		"-listen", fmt.Sprintf("%s:%d", ip, apiPort), "-raft-addr", fmt.Sprintf("%s:%d", ip, raftPort),
		"-gossip-addr", fmt.Sprintf("%s:%d", ip, gossipPort), "-join", strings.Join(join, ","),
		"-partitions", fmt.Sprint(e.C.Cfg.Partitions), "-log-level", "info",
		"-tls-ca", filepath.Join(foreign, transport.CACertFile), "-tls-cert", cert, "-tls-key", key,
		"-gossip-key", filepath.Join(foreign, transport.GossipKeyFile))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	return func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		logf.Close()
	}, nil
}

// rogueRaft opens a Raft stream to target's Raft port from from's
// address with kp, names partition 0's group and waits: a refused stream
// ends (a TLS alert or a close) within a second; one still open then was
// handed to the group (got through).
func rogueRaft(ctx context.Context, target, from *Node, kp tls.Certificate) error {
	d := &net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from.IP)}}
	conf := &tls.Config{Certificates: []tls.Certificate{kp}, InsecureSkipVerify: true, NextProtos: []string{transport.RaftALPN}, MinVersion: tls.VersionTLS13}
	c, err := tls.DialWithDialer(d, "tcp", fmt.Sprintf("%s:%d", target.IP, raftPort), conf)
	if err != nil {
		return nil // refused at the handshake
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(transport.RaftMuxHeader(0)); err != nil {
		return nil
	}
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%s's Raft port kept a stream from %s open (handed to a group)", target.ID, from.IP)
	}
	return nil
}

// rogueReplicate sends target a PeerService Replicate of a task in queue
// "rogue" from from's address with kp, its node header naming from. Only
// a refusal is right: a failed handshake or PERMISSION_DENIED.
func rogueReplicate(ctx context.Context, target, from *Node, kp tls.Certificate, id uint64) error {
	d := &net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from.IP)}}
	p := new(http.Protocols)
	p.SetHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{Protocols: p, DialContext: d.DialContext,
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{kp}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}}
	defer hc.CloseIdleConnections()
	peer := nornv1connect.NewPeerServiceClient(hc, "https://"+target.API, connect.WithGRPC())
	task := &crdt.Task{ID: id, Spec: &crdt.Spec{Queue: rogueQueue}}
	req := connect.NewRequest(&nornv1.ReplicateRequest{Tasks: [][]byte{task.Encode()}})
	req.Header().Set(transport.HeaderNode, from.ID)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err := peer.Replicate(ctx, req)
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeNotFound, connect.CodeAlreadyExists,
		connect.CodeOutOfRange, connect.CodeResourceExhausted, connect.CodeAborted, connect.CodeDataLoss:
		// The request reached the handler: it passed the checks.
		return fmt.Errorf("%s answered a rogue Replicate from %s with %v: past the checks", target.ID, from.IP, err)
	}
	if err == nil {
		return fmt.Errorf("%s stored a Replicate from %s", target.ID, from.IP)
	}
	// PERMISSION_DENIED, or the transport failing: a refused TLS client
	// certificate shows (TLS 1.3) as a connection that breaks after the
	// client's side of the handshake. CheckRogue also looks for the tasks.
	return nil
}

// CheckRogue is the rogue-node verdict: every attempt refused, n9 among
// no node's members, no task of queue "rogue" on any node.
func CheckRogue(ctx context.Context, c *Cluster, r *Rogue) check.Verdict {
	v := check.Verdict{Checker: "rogue", Counts: map[string]int{}}
	r.mu.Lock()
	total := 0
	for _, n := range r.attempts {
		total += n
	}
	v.Counts["attempts"] = total
	v.Counts["through"] = len(r.through)
	for _, t := range r.through {
		v.Addf("got through: %s", t)
	}
	r.mu.Unlock()
	if total < 10 {
		v.Addf("only %d attempts: the nemesis did not run", total)
	}
	for _, n := range c.Active() {
		st, err := n.Status(ctx, false)
		if err != nil {
			v.Addf("%s: status: %v", n.ID, err)
			continue
		}
		if slices.ContainsFunc(st.Nodes, func(ns *nornv1.NodeStatus) bool { return ns.GetId() == rogueID }) {
			v.Addf("%s lists the rogue %s among its nodes", n.ID, rogueID)
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cnt, err := n.Tasks.CountTasks(cctx, connect.NewRequest(&nornv1.CountTasksRequest{Queue: rogueQueue}))
		cancel()
		if err != nil {
			v.Addf("%s: count of queue %s: %v", n.ID, rogueQueue, err)
		} else if cnt.Msg.GetTotal() != 0 {
			v.Addf("%s holds %d tasks of the rogue's queue", n.ID, cnt.Msg.GetTotal())
		}
	}
	v.Valid = len(v.Details) == 0
	return v
}
