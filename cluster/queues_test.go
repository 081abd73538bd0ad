package cluster

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/norn-dev/norn/crdt"
)

// The meta group applies queue settings after the first ring: each
// change makes a new table whose version is the entry's index; zero
// settings remove the queue; bad ones, and settings before any ring, are
// refused and change nothing.
func TestMetaQueues(t *testing.T) {
	l := startLeader(t)
	if _, err := l.meta.ProposeQueue("q", QueueSettings{Paused: true}, proposeTimeout); err == nil {
		t.Fatal("queue settings before the first ring were taken")
	}
	propose(t, l.meta, firstRing(t))
	v1, err := l.meta.ProposeQueue("mail", QueueSettings{Paused: true}, proposeTimeout)
	if err != nil {
		t.Fatal(err)
	}
	lease := QueueSettings{DefaultLeaseMs: 5000, DefaultRetry: &crdt.RetryPolicy{MaxAttempts: 3, InitialMs: 10, MaxMs: 100, MultiplierMilli: 2000}}
	v2, err := l.meta.ProposeQueue("jobs", lease, proposeTimeout)
	if err != nil {
		t.Fatal(err)
	}
	q := l.meta.Queues()
	if v2 <= v1 || q.Version != v2 || !q.Get("mail").Paused || !reflect.DeepEqual(q.Get("jobs"), lease) ||
		q.ClusterID != l.meta.Ring().ClusterID || strings.Join(q.Names(), ",") != "jobs,mail" {
		t.Fatalf("table %+v after versions %d, %d", q, v1, v2)
	}
	for _, bad := range []struct {
		queue string
		s     QueueSettings
	}{
		{"", QueueSettings{Paused: true}},
		{"a b", QueueSettings{Paused: true}},
		{"q", QueueSettings{DefaultLeaseMs: -1}},
		{"q", QueueSettings{DefaultRetry: &crdt.RetryPolicy{MultiplierMilli: 10}}},
	} {
		if _, err := l.meta.ProposeQueue(bad.queue, bad.s, proposeTimeout); err == nil {
			t.Errorf("ProposeQueue(%q, %+v) was taken", bad.queue, bad.s)
		}
	}
	if _, err := l.meta.ProposeQueue("mail", QueueSettings{}, proposeTimeout); err != nil {
		t.Fatal(err)
	}
	if q2 := l.meta.Queues(); q2.Version <= v2 || strings.Join(q2.Names(), ",") != "jobs" || q.Get("mail") != (QueueSettings{Paused: true}) {
		t.Fatalf("after removing mail: %+v (the old table %+v must not change)", q2, q)
	}
}

// A snapshot without queue settings is the ring alone, as before they
// existed (a node of an older build restores it); one with settings
// carries both, and a restore gives both back and tells OnQueues.
func TestMetaSnapshotQueues(t *testing.T) {
	r1 := firstRing(t)
	old := persist(t, &metaFSM{ring: r1})
	var asRing Ring
	if err := json.Unmarshal([]byte(old), &asRing); err != nil || asRing.Validate() != nil {
		t.Fatalf("a snapshot without settings is not a bare ring: %v", err)
	}
	tab := (*Queues)(nil).with(r1.ClusterID, "mail", QueueSettings{Paused: true}, 9)
	withQueues := persist(t, &metaFSM{ring: r1, queues: tab})
	var told []*Queues
	f := &metaFSM{onQueues: func(q *Queues) { told = append(told, q) }}
	if err := f.Restore(io.NopCloser(strings.NewReader(withQueues))); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.ring, r1) || !reflect.DeepEqual(f.queues, tab) || len(told) != 1 {
		t.Fatalf("restored ring %+v, queues %+v, told %d", f.ring, f.queues, len(told))
	}
	if err := f.Restore(io.NopCloser(strings.NewReader(old))); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.ring, r1) || f.queues != nil {
		t.Fatalf("an old snapshot restored queues %+v", f.queues)
	}
	bad := strings.Replace(withQueues, `"paused":true`, `"default_lease_ms":-5`, 1)
	if err := f.Restore(io.NopCloser(strings.NewReader(bad))); !errors.Is(err, ErrBadSettings) {
		t.Fatalf("a snapshot with bad settings: %v", err)
	}
}

// The table a node keeps survives a save and a load; a damaged file is
// refused.
func TestQueuesFile(t *testing.T) {
	dir := t.TempDir()
	if q, err := LoadQueues(dir); q != nil || err != nil {
		t.Fatalf("no file: %v %v", q, err)
	}
	tab := (*Queues)(nil).with("c1", "mail", QueueSettings{Paused: true, DefaultLeaseMs: 1000}, 4)
	if err := SaveQueues(dir, tab); err != nil {
		t.Fatal(err)
	}
	got, err := LoadQueues(dir)
	if err != nil || !reflect.DeepEqual(got, tab) {
		t.Fatalf("loaded %+v, %v; want %+v", got, err, tab)
	}
	if err := os.WriteFile(filepath.Join(dir, queuesFile), []byte(`{"queues":{"a b":{"paused":true}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadQueues(dir); !errors.Is(err, ErrBadSettings) {
		t.Fatalf("a bad queue name loaded: %v", err)
	}
}
