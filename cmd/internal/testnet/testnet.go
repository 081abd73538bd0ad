// Package testnet helps the tests of the commands that start real nornd
// processes: it picks free loopback addresses for them.
package testnet

import (
	"net"
	"testing"
)

// FreeAddrs returns n distinct free addresses of 127.0.0.1: each stays
// bound until all are picked (one at a time, a port just released could
// come back).
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	return FreeAddrsOn(t, "127.0.0.1", n)
}

// FreeAddrsOn is FreeAddrs on the IP address ip (Linux answers on all of
// 127.0.0.0/8 without setup: 127.0.0.2 is a second host's address).
func FreeAddrsOn(t testing.TB, ip string, n int) []string {
	t.Helper()
	var out []string
	for range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		out = append(out, ln.Addr().String())
	}
	return out
}
