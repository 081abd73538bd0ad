package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/norn-dev/norn/transport"
)

const certHelp = `Makes the certificates of a cluster's TLS (docs/SECURITY.md), with the
standard library's crypto: ECDSA P-256 keys, a CA for ten years, node and
client certificates for one year (make new ones before: nodes reload them
when the files change).

  nornctl cert create-ca [--dir certs] [--name "Norn CA"]
      ca.crt and ca.key (mode 0600; keep it off the nodes if you can).
  nornctl cert create-node <id> --host h1,h2 [--dir certs]
      node-<id>.crt and .key: URI SAN norn://node/<id>, the hosts (names
      or IPs clients dial) as SANs; for nornd -tls-cert and -tls-key.
  nornctl cert create-client <user> [--dir certs]
      client-<user>.crt and .key: URI SAN norn://user/<user>; for
      nornctl --cert/--key and client.LoadTLSConfig.
  nornctl cert create-gossip-key [--dir certs]
      gossip.key: a random AES-256 key (base64, mode 0600) for nornd
      -gossip-key; every node of the cluster takes the same file.

Every node and client takes ca.crt (-tls-ca, --ca). During a rotation to a
new CA, give them a bundle of both CAs (cat old.crt new.crt).`

func runCert(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	dir := fs.String("dir", "certs", "directory of the CA and the certificates")
	hosts := fs.String("host", "", "create-node: comma-separated DNS names and IPs of the node")
	name := fs.String("name", "Norn CA", "create-ca: the CA's common name")
	pos, err := e.parse(cmd, fs, args, 1, 2)
	if err != nil {
		return err
	}
	var out []string
	switch pos[0] {
	case "create-ca":
		if len(pos) != 1 {
			return usagef(cmd, "create-ca takes no argument")
		}
		err = transport.CreateCA(*dir, *name)
		out = []string{filepath.Join(*dir, transport.CACertFile), filepath.Join(*dir, transport.CAKeyFile)}
	case "create-node":
		if len(pos) != 2 {
			return usagef(cmd, "create-node <id> --host h1,h2")
		}
		id, perr := parseNode(pos[1])
		if perr != nil {
			return usagef(cmd, "%v", perr)
		}
		if *hosts == "" {
			return usagef(cmd, "create-node needs --host: the names or IPs clients and nodes dial it at")
		}
		err = transport.CreateNodeCert(*dir, id, splitList(*hosts))
		c, k := transport.NodeCertFiles(*dir, id)
		out = []string{c, k}
	case "create-gossip-key":
		if len(pos) != 1 {
			return usagef(cmd, "create-gossip-key takes no argument")
		}
		err = transport.CreateGossipKey(*dir)
		out = []string{filepath.Join(*dir, transport.GossipKeyFile)}
	case "create-client":
		if len(pos) != 2 || pos[1] == "" {
			return usagef(cmd, "create-client <user>")
		}
		err = transport.CreateClientCert(*dir, pos[1])
		c, k := transport.ClientCertFiles(*dir, pos[1])
		out = []string{c, k}
	default:
		return usagef(cmd, "unknown cert command %q: want create-ca, create-node, create-client or create-gossip-key", pos[0])
	}
	if err != nil {
		return err
	}
	for _, f := range out {
		fmt.Fprintln(e.stdout, f)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
