package main

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/client"
)

// tlsHint is what nornctl adds to a failed call made in cleartext to a
// node that speaks TLS (`make cluster` runs TLS by default): the server
// drops the connection, and the client alone cannot say why.
const tlsHint = "hint: the node speaks TLS; give nornctl the cluster's CA and a client certificate " +
	"(--ca/--cert/--key or NORN_CA/NORN_CERT/NORN_KEY; `make cluster` writes them to data/certs/env: run `. data/certs/env`)"

// needsTLSHint reports whether err, of a call made without TLS, came
// from a node at addrs (nornctl's --addr) that answers a TLS handshake.
func needsTLSHint(ctx context.Context, g globals, err error) bool {
	if g.ca != "" || err == nil {
		return false
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return false
	}
	switch ce.Code() {
	case connect.CodeUnavailable, connect.CodeCanceled, connect.CodeUnknown, connect.CodeInternal, connect.CodeDeadlineExceeded:
	default:
		return false
	}
	addr, _, _ := strings.Cut(g.addr, ",")
	addr = strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(addr), "http://"), "https://")
	addr = strings.TrimSuffix(addr, "/")
	return speaksTLS(ctx, addr)
}

// speaksTLS reports whether the server at addr completes a TLS handshake.
// It checks the protocol only, not who the server is: nothing is sent
// over the connection.
func speaksTLS(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: &tls.Config{
		InsecureSkipVerify: true, // a probe for the protocol only; it carries no data
		NextProtos:         []string{"h2"},
		MinVersion:         tls.VersionTLS13,
	}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// certRefused reports why the node at g's first address refuses the
// client certificate nornctl presents (the TLS alert it sends, such as
// "unknown certificate authority"), for a failed call over TLS: the
// refusal reaches the client as a broken pipe or a reset, which says
// nothing. It makes a handshake with the same certificate and reads the
// server's first answer: an alert, or nothing within a moment (accepted).
func certRefused(ctx context.Context, g globals, err error) (string, bool) {
	if g.ca == "" || err == nil {
		return "", false
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return "", false
	}
	switch ce.Code() {
	case connect.CodeUnavailable, connect.CodeCanceled, connect.CodeUnknown, connect.CodeInternal:
	default:
		return "", false
	}
	conf, lerr := client.LoadTLSConfig(g.ca, g.cert, g.key)
	if lerr != nil {
		return "", false
	}
	addr, _, _ := strings.Cut(g.addr, ",")
	addr = strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(addr), "http://"), "https://")
	addr = strings.TrimSuffix(addr, "/")
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conf.NextProtos = []string{"h2"}
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: conf}
	conn, derr := d.DialContext(ctx, "tcp", addr)
	if derr == nil {
		defer conn.Close()
		conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) //nolint:errcheck // the read says
		_, derr = conn.Read(make([]byte, 1))
	}
	if derr != nil {
		if _, alert, ok := strings.Cut(derr.Error(), "remote error: tls: "); ok {
			return alert, true
		}
	}
	return "", false
}

// certHint is what nornctl adds when the node refused its certificate.
func certHint(alert string) string {
	return "hint: the node refused nornctl's client certificate (" + alert + "): it must be signed by the CA the node trusts " +
		"and name a user (--cert/--key or NORN_CERT/NORN_KEY; `nornctl cert create-client` with the cluster's CA makes one)"
}
