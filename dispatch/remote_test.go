package dispatch

import (
	"errors"
	"math"
	"testing"
	"time"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/storage"
)

// idAt is a sonyflake-shaped id of a task enqueued at ms milliseconds.
func idAt(ms int64, seq uint64) uint64 { return uint64(ms/10)<<24 | seq }

// Another leader's head goes first on a higher priority, or on the same
// priority when it is older by more than fifoSlack; otherwise the
// claim's own node keeps the turn.
func TestRemoteFirst(t *testing.T) {
	local := storage.ReadyEntry{ID: idAt(10_000, 1), Priority: 2}
	for _, c := range []struct {
		name   string
		remote storage.ReadyEntry
		want   bool
	}{
		{"higher priority, newer", storage.ReadyEntry{ID: idAt(20_000, 1), Priority: 3}, true},
		{"lower priority, older", storage.ReadyEntry{ID: idAt(1_000, 1), Priority: 1}, false},
		{"same priority, older by more than the slack", storage.ReadyEntry{ID: idAt(10_000-fifoSlack.Milliseconds()-20, 1), Priority: 2}, true},
		{"same priority, older within the slack", storage.ReadyEntry{ID: idAt(10_000-fifoSlack.Milliseconds()+20, 1), Priority: 2}, false},
		{"same priority, newer", storage.ReadyEntry{ID: idAt(10_100, 1), Priority: 2}, false},
	} {
		if got := remoteFirst(c.remote, local, nil); got != c.want {
			t.Errorf("%s: remoteFirst = %v, want %v", c.name, got, c.want)
		}
	}
}

// The cache of another leader's heads: a proxied claim that got what it
// asked for drops those heads; one that got fewer, or failed, has the
// leader asked again (at once, or after headsRetry); an answer newer
// than the claim's view is left alone.
func TestRemoteHeadsBookkeeping(t *testing.T) {
	d := &Dispatcher{cfg: Config{HeadsTTL: time.Hour}}
	rh := &remoteHeads{d: d, queues: map[string]*queueHeads{}}
	heads := []storage.ReadyEntry{{ID: 1, Priority: 5}, {ID: 2, Priority: 5}, {ID: 3, Priority: 1}}
	p := &peerHeads{addr: "b:1", heads: heads, more: true, asked: 3, at: time.Now(), gen: 1}
	q := &queueHeads{peers: map[string]*peerHeads{"b": p}}
	rh.queues["q"] = q
	stale := func(need int) bool {
		ask, must := rh.stale(q, need, time.Now())
		if must && len(ask) == 0 {
			t.Fatal("a claim must wait for answers nobody is asked for")
		}
		return must
	}
	if stale(3) {
		t.Fatal("a fresh answer with enough heads is stale")
	}
	v := q.snapshot()
	if len(v.rivals) != 1 || !v.answered["b"] {
		t.Fatalf("snapshot: %d rivals, answered %v", len(v.rivals), v.answered)
	}
	rh.took("q", takeN(v.rivals[0], 2), 2)
	if len(p.heads) != 1 || p.heads[0].ID != 3 {
		t.Fatalf("after taking 2: heads %v", p.heads)
	}
	if !stale(2) {
		t.Fatal("a leader that may hold more than the one head left is not asked again for 2")
	}
	// A claim whose view predates the leader's last answer changes nothing.
	old := &rival{node: "b", gen: 0, picks: []uint64{3}}
	rh.took("q", old, 0)
	if p.at.IsZero() {
		t.Fatal("a shortfall seen in an older answer dropped the newer one")
	}
	rh.took("q", takeN(q.snapshot().rivals[0], 1), 0)
	if !p.at.IsZero() || !stale(1) {
		t.Fatal("a leader that gave fewer than it reported is not asked again")
	}
	p.record(nil, errors.New("unreachable"), 16, time.Now())
	if ask, must := rh.stale(q, 1, time.Now()); len(ask) > 0 || must {
		t.Fatal("a leader that just failed is asked again before headsRetry")
	}
	if v := q.snapshot(); len(v.rivals) != 0 || v.answered["b"] || v.lastErr == nil {
		t.Fatalf("a failed leader in the snapshot: %d rivals, answered %v, err %v", len(v.rivals), v.answered, v.lastErr)
	}
	p.at = time.Now().Add(-headsRetry - time.Millisecond)
	if ask, must := rh.stale(q, 1, time.Now()); len(ask) != 1 || must {
		t.Fatalf("after headsRetry a failed leader is asked again (%v) without a claim waiting for it (%v)", ask, must)
	}
	// An answer past half its TTL is asked for again in the background;
	// past its TTL, a claim waits for the new one.
	p.record(&nornv1.ReadyHeadsResponse{Heads: []*nornv1.ReadyHead{{Id: 9, Priority: 1}}}, nil, 16, time.Now())
	p.at = time.Now().Add(-d.cfg.HeadsTTL/2 - time.Millisecond)
	if ask, must := rh.stale(q, 1, time.Now()); len(ask) != 1 || must {
		t.Fatalf("past half its TTL: asked %v, must wait %v", ask, must)
	}
	p.at = time.Now().Add(-d.cfg.HeadsTTL - time.Millisecond)
	if ask, must := rh.stale(q, 1, time.Now()); len(ask) != 1 || !must {
		t.Fatalf("past its TTL: asked %v, must wait %v", ask, must)
	}
}

// A leader whose reported heads a claim took in full, and that may hold
// more, keeps the claim from taking anything (its own node's heads or
// another leader's) of a lower priority than the last one it reported;
// and a claim asks for at most maxHeadsAsked heads.
func TestFloorOfRivals(t *testing.T) {
	a := &rival{heads: []storage.ReadyEntry{{ID: 1, Priority: 5}, {ID: 2, Priority: 3}}, more: true}
	b := &rival{heads: []storage.ReadyEntry{{ID: 3, Priority: 1}}, more: false, i: 1}
	rs := []*rival{a, b}
	if f := floorOf(rs); f != math.MinInt32 {
		t.Fatalf("a rival with heads left sets the floor %d", f)
	}
	a.i = 2
	if f := floorOf(rs); f != 3 {
		t.Fatalf("exhausted rival that may hold more, last priority 3: floor %d", f)
	}
	a.more = false
	if f := floorOf(rs); f != math.MinInt32 {
		t.Fatalf("rivals that reported all they hold set the floor %d", f)
	}
	// Earlier claims took all a leader reported, and it may hold more: a
	// claim whose view has its answer (no fresher one came in time) keeps
	// its floor (the large-batch claims of TestClusterClaimsStrictPriority
	// took priority 1 over a 2 under load when it did not).
	q := &queueHeads{peers: map[string]*peerHeads{"c": {addr: "c", at: time.Now(), more: true,
		heads: []storage.ReadyEntry{{ID: 4, Priority: 2}, {ID: 5, Priority: 2}}}}}
	d := &Dispatcher{}
	rh := &remoteHeads{d: d, queues: map[string]*queueHeads{"q": q}}
	rh.took("q", takeN(q.snapshot().rivals[0], 2), 2)
	v := q.snapshot()
	if rv, _ := bestRival(v.rivals, nil); len(v.rivals) != 1 || floorOf(v.rivals) != 2 || rv != nil {
		t.Fatalf("a drained leader that may hold more: %d rivals, floor %d", len(v.rivals), floorOf(v.rivals))
	}
	q.peers["c"].record(&nornv1.ReadyHeadsResponse{}, nil, 16, time.Now())
	if v := q.snapshot(); len(v.rivals) != 0 {
		t.Fatalf("a fresh empty answer still sets a floor: %d rivals", len(v.rivals))
	}
	if headsToAsk(1) != minHeadsAsked || headsToAsk(100) != 100 || headsToAsk(1000) != maxHeadsAsked {
		t.Fatalf("headsToAsk: %d %d %d", headsToAsk(1), headsToAsk(100), headsToAsk(1000))
	}
}

// takeN takes rv's first n heads, as a claim's pick does.
func takeN(rv *rival, n int) *rival {
	for range n {
		j, _ := rv.head(nil)
		rv.take(j)
	}
	return rv
}
