package jepsen

// A node's process: start, kill, pause and resume it, and ask it whether
// it is healthy and what it sees.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// Start starts node n's process (from its data dir, if it has one).
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("%s already running", n.ID)
	}
	cfg := n.cfg
	args := []string{"-node-id", n.ID, "-machine-id", fmt.Sprint(n.Index), "-data-dir", n.DataDir,
		"-listen", n.API, "-raft-addr", fmt.Sprintf("%s:%d", n.IP, raftPort),
		"-gossip-addr", fmt.Sprintf("%s:%d", n.IP, gossipPort)}
	if n.Index <= cfg.Initial {
		// A spare has no -bootstrap-expect: it gossips with the cluster
		// and takes its ring without being a member until it is joined
		// (as scripts/cluster.sh add starts one). A restarted node
		// ignores the flag (it rejoins from its data dir).
		args = append(args, "-bootstrap-expect", fmt.Sprint(cfg.Initial))
	}
	args = append(args, "-join", strings.Join(n.join, ","),
		"-replication", fmt.Sprint(Replication), "-partitions", fmt.Sprint(cfg.Partitions),
		"-raft-timeout", cfg.RaftTimeout.String(), "-write-timeout", "2s",
		"-skew-buffer", cfg.SkewBuffer.String(), "-max-clock-offset", cfg.MaxClockOffset.String(),
		"-antientropy-interval", "2s", "-log-level", "warn")
	if cfg.Hooks {
		args = append(args, "-test-hooks")
		if len(cfg.Bugs) > 0 {
			args = append(args, "-test-bug", strings.Join(cfg.Bugs, ","))
		}
	}
	if n.sec != nil {
		args = append(args, n.sec.nodeArgs(n.ID)...)
	}
	args = append(args, cfg.ExtraArgs...)
	logf, err := os.OpenFile(n.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "=== %s start: %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), cfg.Bin, strings.Join(args, " "))
	cmd := exec.Command(cfg.Bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(n.UID), Gid: uint32(n.UID)},
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL, // the harness dying takes its nodes with it
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	n.cmd, n.paused = cmd, false
	n.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		err := cmd.Wait()
		fmt.Fprintf(logf, "=== %s exit: %v\n", time.Now().UTC().Format(time.RFC3339Nano), err)
		logf.Close()
		close(done)
	}(cmd, n.exited)
	return nil
}

// Running reports whether n's process is up (possibly paused).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		n.cmd = nil
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL to n's process (paused or not) and waits for it to
// exit.
func (n *Node) Kill() {
	n.mu.Lock()
	cmd, done := n.cmd, n.exited
	n.cmd, n.paused = nil, false
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Pause sends SIGSTOP; Resume sends SIGCONT.
func (n *Node) Pause() error { return n.signal(syscall.SIGSTOP, true) }

// Resume sends SIGCONT to a paused node.
func (n *Node) Resume() error { return n.signal(syscall.SIGCONT, false) }

func (n *Node) signal(s syscall.Signal, paused bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return fmt.Errorf("%s is not running", n.ID)
	}
	if err := n.cmd.Process.Signal(s); err != nil {
		return err
	}
	n.paused = paused
	return nil
}

// Paused reports whether n was paused and not resumed.
func (n *Node) Paused() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paused
}

// Healthy reports whether n answers GET /healthz with 200.
func (n *Node) Healthy() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.url("/healthz"), nil)
	resp, err := n.hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Status calls AdminService.Status on n.
func (n *Node) Status(ctx context.Context, counts bool) (*nornv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	r, err := n.Admin.Status(ctx, connect.NewRequest(&nornv1.StatusRequest{SkipCounts: !counts, ClaimDigests: counts}))
	if err != nil {
		return nil, err
	}
	return r.Msg, nil
}
