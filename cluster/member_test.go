package cluster

import (
	"encoding/json"
	"strings"
	"testing"
)

// A node's gossiped metadata as a Kubernetes deployment of norn would
// have it at its largest (deploy/k8s: a pod name for an id, DNS names for
// addresses in a long namespace, a release version, TLS, an encrypted
// gossip key and an access file, every feature, a node leading and
// reporting for months) fits memberlist's limit with room to spare for
// what comes next.
func TestNodeMetaFits(t *testing.T) {
	addr := "norn-12.norn.production-queues-eu-west.svc:7400"
	m := NodeMeta{
		ID: "norn-12", APIAddr: addr, RaftAddr: strings.Replace(addr, "7400", "7401", 1), RingEpoch: 123_456,
		Version: "v1.23.4", ClusterID: "0123456789abcdef0123456789abcdef",
		Leaders: LeaderMeta{Count: 4096, Seq: 9_999_999}, InClusterMs: 1_790_000_000_000,
		SkewBufferMs: 10_000, Incarnation: "0123456789abcdef0123456789abcdef",
		Security: SecurityMeta{TLS: true, GossipEncrypted: true, Access: strings.Repeat("f", 64), Known: true},
		Features: FeaturesBuilt, QueuesVersion: 9_999_999,
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > maxMetaBytes-32 {
		t.Fatalf("NodeMeta takes %d bytes of memberlist's %d, less than 32 to spare:\n%s", len(b), maxMetaBytes, b)
	}
	t.Logf("%d of %d bytes", len(b), maxMetaBytes)
}
