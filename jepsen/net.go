package jepsen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Chain is the iptables chain holding every rule the harness adds.
const Chain = "NORN-JEPSEN"

// Net cuts and degrades the links between nodes with iptables rules in
// Chain, matched by the owner (uid) of the sending node's sockets.
type Net struct {
	mu       sync.Mutex
	iptables string
	nodes    []*Node
	probes   []net.PacketConn
	probeTCP []net.Listener
	udpSeen  map[string]chan struct{}
}

// IPTablesPath returns the iptables binary, or "" when missing.
func IPTablesPath() string {
	for _, p := range []string{"/usr/sbin/iptables", "/sbin/iptables"} {
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("iptables"); err == nil {
		return p
	}
	return ""
}

// NewNet creates Chain (flushing any leftover of an interrupted run), jumps
// to it from OUTPUT and starts the probe listeners on every node's
// address.
func NewNet(nodes []*Node) (*Net, error) {
	ipt := IPTablesPath()
	if ipt == "" {
		return nil, fmt.Errorf("iptables not found")
	}
	nt := &Net{iptables: ipt, nodes: nodes, udpSeen: map[string]chan struct{}{}}
	nt.removeChain()
	if err := nt.ipt("-N", Chain); err != nil {
		return nil, err
	}
	if err := nt.ipt("-I", "OUTPUT", "-j", Chain); err != nil {
		nt.removeChain()
		return nil, err
	}
	for _, n := range nodes {
		addr := fmt.Sprintf("%s:%d", n.IP, probePort)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			nt.Close()
			return nil, err
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			l.Close()
			nt.Close()
			return nil, err
		}
		nt.probeTCP = append(nt.probeTCP, l)
		nt.probes = append(nt.probes, pc)
		go nt.readUDP(pc)
	}
	return nt, nil
}

func (nt *Net) readUDP(pc net.PacketConn) {
	buf := make([]byte, 256)
	for {
		k, _, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		nt.mu.Lock()
		if ch, ok := nt.udpSeen[string(buf[:k])]; ok {
			close(ch)
			delete(nt.udpSeen, string(buf[:k]))
		}
		nt.mu.Unlock()
	}
}

func (nt *Net) ipt(args ...string) error {
	out, err := exec.Command(nt.iptables, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (nt *Net) removeChain() {
	for nt.ipt("-D", "OUTPUT", "-j", Chain) == nil {
	}
	for nt.ipt("-D", "INPUT", "-j", Chain) == nil {
	}
	nt.ipt("-F", Chain)
	nt.ipt("-X", Chain)
}

// Close removes every rule and the chain, and the probe listeners.
func (nt *Net) Close() {
	nt.removeChain()
	for _, l := range nt.probeTCP {
		l.Close()
	}
	for _, pc := range nt.probes {
		pc.Close()
	}
}

// Heal removes every rule of Chain.
func (nt *Net) Heal() error { return nt.ipt("-F", Chain) }

// Rules lists the chain's rules (for the timeline).
func (nt *Net) Rules() string {
	out, _ := exec.Command(nt.iptables, "-S", Chain).CombinedOutput()
	return strings.TrimSpace(string(out))
}

func (nt *Net) drop(from, to *Node, extra ...string) error {
	args := []string{"-A", Chain, "-d", to.IP, "-m", "owner", "--uid-owner", fmt.Sprint(from.UID)}
	args = append(args, extra...)
	return nt.ipt(append(args, "-j", "DROP")...)
}

// Cut drops every packet between a and b, both directions, and proves it
// with a probe each way.
func (nt *Net) Cut(a, b *Node) error { return nt.Partition([]*Node{a}, []*Node{b}) }

// Partition cuts every link between the two groups, then proves every cut
// with a probe each way (in parallel).
func (nt *Net) Partition(g1, g2 []*Node) error {
	var links [][2]*Node
	for _, a := range g1 {
		for _, b := range g2 {
			links = append(links, [2]*Node{a, b})
		}
	}
	return nt.CutLinks(links)
}

// CutLinks cuts each link (both directions), then proves every cut with a
// probe each way (in parallel).
func (nt *Net) CutLinks(links [][2]*Node) error {
	var pairs [][2]*Node
	for _, l := range links {
		a, b := l[0], l[1]
		if err := nt.drop(a, b); err != nil {
			return err
		}
		if err := nt.drop(b, a); err != nil {
			return err
		}
		pairs = append(pairs, [2]*Node{a, b}, [2]*Node{b, a})
	}
	errs := make([]error, len(pairs))
	var wg sync.WaitGroup
	for i, p := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if tcp, udp := nt.Probe(p[0], p[1]); tcp || udp {
				errs[i] = fmt.Errorf("cut %s->%s not effective: tcp through %v, udp through %v", p[0].ID, p[1].ID, tcp, udp)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Flaky drops each packet between n and every other node with probability
// p, both directions.
func (nt *Net) Flaky(n *Node, p float64) error {
	st := []string{"-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%.3f", p)}
	for _, o := range nt.nodes {
		if o == n {
			continue
		}
		if err := nt.drop(n, o, st...); err != nil {
			return err
		}
		if err := nt.drop(o, n, st...); err != nil {
			return err
		}
	}
	return nil
}

// Probe reports whether a TCP connection and a UDP datagram from a's uid
// reach b's address.
func (nt *Net) Probe(a, b *Node) (tcp, udp bool) {
	target := fmt.Sprintf("%s/%d", b.IP, probePort)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "timeout", "0.7", "bash", "-c", "exec 3<>/dev/tcp/"+target)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(a.UID), Gid: uint32(a.UID)}}
	tcp = cmd.Run() == nil

	token := fmt.Sprintf("probe-%s-%s-%d", a.ID, b.ID, time.Now().UnixNano())
	seen := make(chan struct{})
	nt.mu.Lock()
	nt.udpSeen[token] = seen
	nt.mu.Unlock()
	cmd = exec.CommandContext(ctx, "timeout", "1", "bash", "-c", "for i in 1 2 3; do printf %s '"+token+"' >/dev/udp/"+target+"; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(a.UID), Gid: uint32(a.UID)}}
	cmd.Run()
	select {
	case <-seen:
		udp = true
	case <-time.After(400 * time.Millisecond):
		nt.mu.Lock()
		delete(nt.udpSeen, token)
		nt.mu.Unlock()
	}
	return tcp, udp
}
