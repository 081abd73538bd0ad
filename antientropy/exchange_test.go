package antientropy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// randomDiff returns the states to merge into two replicas of a partition:
// many equal tasks, tasks only one side has, and tasks both have in
// different states; with same, both sides get the same states.
func randomDiff(rng *rand.Rand, same bool) (aTasks, bTasks []*crdt.Task) {
	shared := 100 + rng.IntN(300)
	var sharedIDs []uint64
	for i := range shared {
		id := rng.Uint64()
		sharedIDs = append(sharedIDs, id)
		ts := []*crdt.Task{newTask(id)}
		switch i % 5 {
		case 1:
			ts = append(ts, updateOf(id, 3, uint64(i)))
		case 2:
			ts = append(ts, terminalOf(id, t0+int64(i), crdt.Completed, 3))
		}
		aTasks = append(aTasks, ts...)
		bTasks = append(bTasks, ts...)
	}
	if same {
		return aTasks, bTasks
	}
	// Tasks one side lacks: a new task, or a state without its spec (a
	// replica that got the terminal event before the enqueue).
	one := func() []*crdt.Task {
		id := rng.Uint64()
		if rng.IntN(4) == 0 {
			return []*crdt.Task{terminalOf(id, t0+5, crdt.Cancelled, 0)}
		}
		return []*crdt.Task{newTask(id)}
	}
	for range rng.IntN(30) {
		aTasks = append(aTasks, one()...)
	}
	for range rng.IntN(30) {
		bTasks = append(bTasks, one()...)
	}
	// Shared tasks whose states differ: one side has an extra event, or
	// each has one the other lacks.
	for _, id := range sharedIDs[:rng.IntN(30)] {
		seq := 100 + rng.Uint64N(1000)
		switch rng.IntN(4) {
		case 0:
			aTasks = append(aTasks, terminalOf(id, t0+7, crdt.Completed, 9))
		case 1:
			bTasks = append(bTasks, updateOf(id, 9, seq))
		case 2:
			aTasks = append(aTasks, updateOf(id, 9, seq))
			bTasks = append(bTasks, terminalOf(id, t0+8, crdt.Aborted, 9))
		case 3:
			aTasks = append(aTasks, updateOf(id, 9, seq))
			bTasks = append(bTasks, updateOf(id, 9, seq+1))
		}
	}
	rng.Shuffle(len(aTasks), func(i, j int) { aTasks[i], aTasks[j] = aTasks[j], aTasks[i] })
	rng.Shuffle(len(bTasks), func(i, j int) { bTasks[i], bTasks[j] = bTasks[j], bTasks[i] })
	return aTasks, bTasks
}

// wantTransfer is the brute-force answer of an exchange started by a
// replica holding mine with a peer holding theirs: the ids whose states
// differ (what the peer is asked for), the ids the peer has of those (the
// states pulled), and the ids whose joined state the peer lacks (the
// states pushed).
func wantTransfer(tb testing.TB, mine, theirs map[uint64]string) (differ, pulled, pushed []uint64) {
	tb.Helper()
	joined := joinAll(tb, mine, theirs)
	for _, id := range sortedIDs(joined) {
		m, okm := mine[id]
		o, oko := theirs[id]
		if okm && oko && m == o {
			continue
		}
		differ = append(differ, id)
		if oko {
			pulled = append(pulled, id)
		}
		if joined[id] != o {
			pushed = append(pushed, id)
		}
	}
	return differ, pulled, pushed
}

// leavesOf returns the number of distinct leaves the ids fall in.
func leavesOf(t *Tree, ids []uint64) int {
	seen := map[uint32]bool{}
	for _, id := range ids {
		seen[t.Leaf(storage.Segment(id))] = true
	}
	return len(seen)
}

// TestExchangeEqualsBruteForce is the property: for random pairs
// of replicas one Exchange leaves both holding the join of their states
// (so their roots are equal), and it transfers exactly the brute-force
// difference: the peer is asked for each differing id once, the states it
// has of them are pulled, and the joined states it lacks are pushed.
func TestExchangeEqualsBruteForce(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(50) {
		leafBits := []int{4, 5, 8, 14}[seed%4]
		same := seed%10 == 0
		t.Run(fmt.Sprintf("seed=%d/leafbits=%d/same=%v", seed, leafBits, same), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0xae))
			addFirst := rng.IntN(2) == 0 // trees built before the writes, or from the index after
			var a, b *side
			if addFirst {
				a, b = newSide(t, sideConfig{leafBits: leafBits}, 0), newSide(t, sideConfig{leafBits: leafBits}, 0)
			} else {
				a, b = newSide(t, sideConfig{leafBits: leafBits}), newSide(t, sideConfig{leafBits: leafBits})
			}
			aTasks, bTasks := randomDiff(rng, same)
			mergeAll(t, a.store, 0, aTasks...)
			mergeAll(t, b.store, 0, bTasks...)
			if !addFirst {
				for _, s := range []*side{a, b} {
					if err := s.r.Add(0); err != nil {
						t.Fatal(err)
					}
				}
			}
			if rng.IntN(2) == 0 {
				a, b = b, a // either side starts
			}
			sa, sb := stored(t, a.store, 0), stored(t, b.store, 0)
			for _, s := range []struct {
				r      *Replica
				states map[uint64]string
			}{{a.r, sa}, {b.r, sb}} {
				if got, want := s.r.Tree(0).Root(), bruteRoot(s.states); got != want {
					t.Fatalf("root before the exchange %x, brute force %x", got, want)
				}
			}
			differ, pulled, pushed := wantTransfer(t, sa, sb)
			if same != (len(differ) == 0) {
				t.Fatalf("same=%v but %d ids differ", same, len(differ))
			}
			want := joinAll(t, sa, sb)

			st, err := a.r.Exchange(ctx, b.peer, []uint16{0}, Options{})
			if err != nil {
				t.Fatal(err)
			}

			for name, s := range map[string]*side{"caller": a, "peer": b} {
				if got := stored(t, s.store, 0); !maps.Equal(got, want) {
					t.Fatalf("%s holds %d tasks after the exchange, want the join of both (%d tasks)", name, len(got), len(want))
				}
				if got := s.r.Tree(0).Root(); got != bruteRoot(want) {
					t.Fatalf("%s's root %x, want %x", name, got, bruteRoot(want))
				}
			}
			if got := sorted(b.peer.read); !slices.Equal(got, differ) {
				t.Fatalf("peer asked for %d ids, want the %d differing ids", len(got), len(differ))
			}
			if got := sorted(b.peer.sent); !slices.Equal(got, pulled) || st.Pulled != len(pulled) {
				t.Fatalf("pulled %d states (%d by Stats), want %d", len(got), st.Pulled, len(pulled))
			}
			if got := sorted(b.peer.pushed); !slices.Equal(got, pushed) || st.Pushed != len(pushed) {
				t.Fatalf("pushed %d states (%d by Stats), want the %d whose joined state the peer lacked", len(got), st.Pushed, len(pushed))
			}
			if !slices.Equal(st.Converged, []uint16{0}) || st.Partitions != 1 {
				t.Fatalf("Stats %+v: want partition 0 compared and converged", st)
			}
			if len(differ) == 0 {
				if st.Differing != 0 || st.Leaves != 0 || b.peer.entries != 0 {
					t.Fatalf("no difference, Stats %+v, %d SegmentEntries calls", st, b.peer.entries)
				}
				if n := st.BytesSent + st.BytesRecv; n > 64 {
					t.Fatalf("an exchange of equal replicas took %d bytes", n)
				}
			} else if st.Differing != 1 || st.Leaves != leavesOf(a.r.Tree(0), differ) {
				t.Fatalf("Stats %+v: want 1 differing partition and the %d leaves of the differing ids", st, leavesOf(a.r.Tree(0), differ))
			}
			if st.BytesRecv != b.peer.respBytes {
				t.Fatalf("Stats.BytesRecv %d, the peer sent %d", st.BytesRecv, b.peer.respBytes)
			}

			// A second exchange, either way, finds nothing.
			a.peer.reset()
			st, err = b.r.Exchange(ctx, a.peer, []uint16{0}, Options{})
			if err != nil || st.Differing != 0 || len(a.peer.read) != 0 {
				t.Fatalf("second exchange: %+v, %v", st, err)
			}
		})
	}
}

// TestExchangeManyPartitions: one TreeRoots call covers every partition;
// only those whose roots differ are descended, and each ends equal.
func TestExchangeManyPartitions(t *testing.T) {
	parts := []uint16{0, 1, 7, 300, 1 << 15, 1<<16 - 1}
	a, b := newSide(t, sideConfig{}, parts...), newSide(t, sideConfig{}, parts...)
	rng := rand.New(rand.NewPCG(7, 7))
	for _, p := range parts {
		var ts []*crdt.Task
		for range 50 {
			ts = append(ts, newTask(rng.Uint64()))
		}
		mergeAll(t, a.store, p, ts...)
		mergeAll(t, b.store, p, ts...)
	}
	mergeAll(t, a.store, 7, newTask(rng.Uint64()))
	mergeAll(t, b.store, 1<<16-1, newTask(rng.Uint64()), newTask(rng.Uint64()))
	// The same id in another partition is another task.
	id := rng.Uint64()
	mergeAll(t, a.store, 0, newTask(id))
	mergeAll(t, b.store, 1, newTask(id))

	st, err := a.r.Exchange(context.Background(), b.peer, parts, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Partitions != len(parts) || st.Differing != 4 || st.Pulled != 3 || st.Pushed != 2 {
		t.Fatalf("Stats %+v: want 6 partitions, 4 differing, 3 pulled, 2 pushed", st)
	}
	if got := sorted16(st.Converged); !slices.Equal(got, parts) {
		t.Fatalf("converged %v, want %v", got, parts)
	}
	for _, p := range parts {
		sa, sb := stored(t, a.store, p), stored(t, b.store, p)
		if !maps.Equal(sa, sb) || a.r.Tree(p).Root() != b.r.Tree(p).Root() {
			t.Fatalf("partition %d differs after the exchange", p)
		}
	}
	if _, err := a.r.Exchange(context.Background(), b.peer, nil, Options{}); err != nil {
		t.Fatalf("exchange of no partitions: %v", err)
	}
}

func sorted16(ps []uint16) []uint16 {
	out := slices.Clone(ps)
	slices.Sort(out)
	return out
}

// TestExchangeSettle: a write that reaches the peer between the two
// comparisons (in flight to both replicas when the exchange started) is
// not transferred when Settle is set, nor is one that reaches this replica
// only then; a real difference still is. Without Settle the first race
// transfers the write.
func TestExchangeSettle(t *testing.T) {
	for _, settle := range []time.Duration{0, time.Millisecond} {
		t.Run(fmt.Sprint("settle=", settle), func(t *testing.T) {
			a, b := newSide(t, sideConfig{}, 0), newSide(t, sideConfig{}, 0)
			rng := rand.New(rand.NewPCG(8, 8))
			var shared []*crdt.Task
			for range 200 {
				shared = append(shared, newTask(rng.Uint64()))
			}
			mergeAll(t, a.store, 0, shared...)
			mergeAll(t, b.store, 0, shared...)
			inFlight := newTask(rng.Uint64()) // on a, on its way to b
			lost := newTask(rng.Uint64())     // on a only: b missed it
			mergeAll(t, a.store, 0, inFlight, lost)
			// late is written to a after the first comparison, in a leaf
			// that differs (lost's): only the second comparison sees it
			// (a reads its own entries after b's answer).
			leaf := a.r.Tree(0).Leaf(storage.Segment(lost.ID))
			late := newTask(rng.Uint64())
			for a.r.Tree(0).Leaf(storage.Segment(late.ID)) != leaf {
				late = newTask(rng.Uint64())
			}
			b.peer.afterEntries = func(n int) {
				if n == 1 {
					mergeAll(t, b.store, 0, inFlight)
				}
			}
			b.peer.beforeEntries = func(n int) {
				if n == 2 {
					mergeAll(t, a.store, 0, late)
				}
			}
			st, err := a.r.Exchange(context.Background(), b.peer, []uint16{0}, Options{Settle: settle})
			if err != nil {
				t.Fatal(err)
			}
			want := []uint64{lost.ID}
			if settle == 0 {
				want = sorted([]uint64{lost.ID, inFlight.ID})
			}
			if got := sorted(b.peer.read); !slices.Equal(got, want) || st.Pulled != len(want)-1 {
				t.Fatalf("transferred %v (%d pulled), want %v", got, st.Pulled, want)
			}
			// late's own write reaches both.
			mergeAll(t, a.store, 0, late)
			mergeAll(t, b.store, 0, late)
			if sa, sb := stored(t, a.store, 0), stored(t, b.store, 0); !maps.Equal(sa, sb) || a.r.Tree(0).Root() != b.r.Tree(0).Root() {
				t.Fatal("replicas differ after the exchange")
			}
			if wantCalls := map[bool]int{true: 1, false: 2}[settle == 0]; b.peer.entries != wantCalls {
				t.Fatalf("%d SegmentEntries calls, want %d", b.peer.entries, wantCalls)
			}
		})
	}
}

// TestExchangeSettleCancelled: an exchange waiting to settle stops when
// its context ends.
func TestExchangeSettleCancelled(t *testing.T) {
	a, b := newSide(t, sideConfig{}, 0), newSide(t, sideConfig{}, 0)
	mergeAll(t, a.store, 0, newTask(1))
	ctx, cancel := context.WithCancel(context.Background())
	b.peer.afterEntries = func(int) { cancel() }
	done := make(chan error, 1)
	go func() {
		_, err := a.r.Exchange(ctx, b.peer, []uint16{0}, Options{Settle: time.Hour})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("exchange did not stop when its context was cancelled")
	}
	if len(b.peer.read) != 0 {
		t.Fatal("a cancelled exchange transferred states")
	}
}

// TestExchangePace: Pace is asked before every call, and its error stops
// the exchange before anything is transferred.
func TestExchangePace(t *testing.T) {
	a, b := newSide(t, sideConfig{}, 0), newSide(t, sideConfig{}, 0)
	mergeAll(t, a.store, 0, newTask(1))
	mergeAll(t, b.store, 0, newTask(2))
	calls, paced := 0, 0
	st, err := a.r.Exchange(context.Background(), b.peer, []uint16{0}, Options{Pace: func(_ context.Context, n int) error {
		calls++
		paced += n
		return nil
	}})
	if err != nil || st.Pushed != 1 || st.Pulled != 1 {
		t.Fatalf("paced exchange: %+v, %v", st, err)
	}
	// Twice per call (the request before it, the answer after): TreeRoots,
	// a TreeNodes per level below the root, SegmentEntries, ReadStates and
	// the final root check; once for Push (its size is known after it).
	if want := 2*(1+(a.r.Tree(0).Levels()-1)+1+1+1) + 1; calls != want {
		t.Fatalf("Pace called %d times, want %d", calls, want)
	}
	// Every byte sent or received is paced, states included.
	if paced != st.BytesSent+st.BytesRecv {
		t.Fatalf("paced %d bytes, the exchange moved %d", paced, st.BytesSent+st.BytesRecv)
	}

	errSlow := errors.New("slow down")
	for stop := 1; stop <= 3; stop++ {
		a, b := newSide(t, sideConfig{}, 0), newSide(t, sideConfig{}, 0)
		mergeAll(t, a.store, 0, newTask(1))
		n := 0
		_, err := a.r.Exchange(context.Background(), b.peer, []uint16{0}, Options{Pace: func(context.Context, int) error {
			if n++; n == stop {
				return errSlow
			}
			return nil
		}})
		if !errors.Is(err, errSlow) || len(b.peer.pushed) != 0 {
			t.Fatalf("Pace failing at call %d: err %v, %d pushed", stop, err, len(b.peer.pushed))
		}
	}
}

// TestExchangeRetention: a terminal task past the retention horizon that
// one replica already deleted and the other still holds is deleted by
// the exchange on both, whichever side starts it, and not brought back:
// the replicas agree on the later of their horizons before comparing.
func TestExchangeRetention(t *testing.T) {
	const (
		old      = t0 - 10_000 // the expired tasks' terminal events
		horizonA = t0 - 5_000  // A deletes what ended before this
		horizonB = t0 - 20_000 // B's retention is longer
	)
	for _, aStarts := range []bool{true, false} {
		t.Run(fmt.Sprint("aStarts=", aStarts), func(t *testing.T) {
			a := newSide(t, sideConfig{horizon: horizonA}, 0)
			b := newSide(t, sideConfig{horizon: horizonB}, 0)
			rng := rand.New(rand.NewPCG(9, 9))
			var expired, kept []*crdt.Task
			for i := range 1200 { // more than one DeleteTerminalBefore batch
				id := rng.Uint64()
				expired = append(expired, newTask(id), terminalOf(id, old+int64(i%100), crdt.Completed, 1))
			}
			for range 100 {
				id := rng.Uint64()
				kept = append(kept, newTask(id), terminalOf(id, t0-1_000, crdt.Completed, 1))
			}
			for range 100 {
				kept = append(kept, newTask(rng.Uint64()))
			}
			for _, s := range []*side{a, b} {
				mergeAll(t, s.store, 0, expired...)
				mergeAll(t, s.store, 0, kept...)
			}
			// A's retention pass has run; B's has not.
			if n, err := a.store.DeleteTerminalBefore(0, horizonA, 500, nil); err != nil || n != 1200 {
				t.Fatalf("A deleted %d, %v", n, err)
			}
			keptStates := stored(t, a.store, 0)
			if len(keptStates) != 200 || len(stored(t, b.store, 0)) != 1400 {
				t.Fatalf("before: A holds %d, B %d", len(keptStates), len(stored(t, b.store, 0)))
			}

			caller, peer := a, b
			if !aStarts {
				caller, peer = b, a
			}
			st, err := caller.r.Exchange(context.Background(), peer.peer, []uint16{0}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if st.Differing != 0 || st.Pushed+st.Pulled != 0 {
				t.Fatalf("Stats %+v: the expired tasks were compared or transferred", st)
			}
			for name, s := range map[string]*side{"A": a, "B": b} {
				if got := stored(t, s.store, 0); !maps.Equal(got, keptStates) {
					t.Fatalf("%s holds %d tasks, want the %d unexpired", name, len(got), len(keptStates))
				}
				if s.store.DeleteHorizon() != horizonA {
					t.Fatalf("%s's delete horizon %d, want the later one %d", name, s.store.DeleteHorizon(), horizonA)
				}
				if s.r.Tree(0).Root() != bruteRoot(keptStates) {
					t.Fatalf("%s's root is not that of the unexpired tasks", name)
				}
			}
			// A late copy of an expired task (a write in flight, read
			// repair) is not stored either.
			mergeAll(t, b.store, 0, expired[:10]...)
			if got := stored(t, b.store, 0); !maps.Equal(got, keptStates) {
				t.Fatal("a merge brought an expired task back")
			}
		})
	}
}

// TestExchangeStaleStateNotStored: when the peer still holds a task past
// the agreed horizon (its expiry has not run), neither the pulled copy
// nor a pushed one is stored by a replica whose delete horizon is later.
func TestExchangeStaleStateNotStored(t *testing.T) {
	const old, late, early = t0 - 10_000, t0 - 5_000, t0 - 20_000
	noExpire := func(uint16, storage.Horizons) error { return nil }
	id := uint64(42)
	stale := []*crdt.Task{newTask(id), terminalOf(id, old, crdt.Cancelled, 0)}
	live := newTask(43)

	t.Run("pull", func(t *testing.T) {
		a := newSide(t, sideConfig{horizon: late}, 0)
		b := newSide(t, sideConfig{horizon: early, expire: noExpire}, 0)
		mergeAll(t, a.store, 0, stale...)
		mergeAll(t, b.store, 0, stale...)
		mergeAll(t, a.store, 0, live)
		mergeAll(t, b.store, 0, live)
		if _, err := a.store.DeleteTerminalBefore(0, late, 100, nil); err != nil {
			t.Fatal(err)
		}
		st, err := a.r.Exchange(context.Background(), b.peer, []uint16{0}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Pulled != 1 || st.Pushed != 0 {
			t.Fatalf("Stats %+v: want the stale state pulled and nothing pushed", st)
		}
		if _, err := a.store.TaskState(0, id); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("the pulled stale state was stored: %v", err)
		}
		if got := stored(t, a.store, 0); len(got) != 1 || a.r.Tree(0).Root() != bruteRoot(got) {
			t.Fatalf("A holds %d tasks", len(got))
		}
	})
	t.Run("push", func(t *testing.T) {
		a := newSide(t, sideConfig{horizon: early, expire: noExpire}, 0)
		b := newSide(t, sideConfig{horizon: late}, 0)
		mergeAll(t, a.store, 0, stale...)
		mergeAll(t, a.store, 0, live)
		mergeAll(t, b.store, 0, live)
		st, err := a.r.Exchange(context.Background(), b.peer, []uint16{0}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Pulled != 0 || st.Pushed != 1 {
			t.Fatalf("Stats %+v: want the stale state pushed", st)
		}
		if b.store.DeleteHorizon() != late {
			t.Fatalf("B's delete horizon %d, want %d", b.store.DeleteHorizon(), late)
		}
		if _, err := b.store.TaskState(0, id); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("the pushed stale state was stored: %v", err)
		}
		if got := stored(t, b.store, 0); len(got) != 1 || b.r.Tree(0).Root() != bruteRoot(got) {
			t.Fatalf("B holds %d tasks", len(got))
		}
	})
}

// TestExchangeConcurrent: exchanges both ways at once, racing with writes
// to both replicas, are safe (run it with -race), and one quiet exchange
// afterwards leaves the replicas equal.
func TestExchangeConcurrent(t *testing.T) {
	a, b := newSide(t, sideConfig{leafBits: 8}, 0), newSide(t, sideConfig{leafBits: 8}, 0)
	rng := rand.New(rand.NewPCG(10, 10))
	aTasks, bTasks := randomDiff(rng, false)
	mergeAll(t, a.store, 0, aTasks...)
	mergeAll(t, b.store, 0, bTasks...)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i, s := range []*side{a, b} {
		wg.Go(func() { // writes
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			for range 20 {
				if _, err := s.store.MergeTasks([]storage.MergeItem{{Task: newTask(rng.Uint64())}}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for _, pair := range [][2]*side{{a, b}, {b, a}} {
		wg.Go(func() { // exchanges
			for range 5 {
				if _, err := pair[0].r.Exchange(ctx, pair[1].peer, []uint16{0}, Options{Settle: time.Millisecond}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if _, err := a.r.Exchange(ctx, b.peer, []uint16{0}, Options{}); err != nil {
		t.Fatal(err)
	}
	sa, sb := stored(t, a.store, 0), stored(t, b.store, 0)
	if !maps.Equal(sa, sb) || a.r.Tree(0).Root() != b.r.Tree(0).Root() || a.r.Tree(0).Root() != bruteRoot(sa) {
		t.Fatalf("replicas differ after the quiet exchange: %d and %d tasks", len(sa), len(sb))
	}
}

// TestExchangeSettlesOnce: with Settle, every differing partition is
// compared once before the single settle wait and again after it (one
// wait per exchange, not one per partition: after a restart most
// partitions differ), and each ends converged.
func TestExchangeSettlesOnce(t *testing.T) {
	parts := []uint16{2, 5, 9}
	a, b := newSide(t, sideConfig{}, parts...), newSide(t, sideConfig{}, parts...)
	rng := rand.New(rand.NewPCG(3, 3))
	for _, p := range parts {
		mergeAll(t, a.store, p, newTask(rng.Uint64()))
	}
	st, err := a.r.Exchange(context.Background(), b.peer, parts, Options{Settle: time.Millisecond})
	if err != nil || st.Pushed != 3 {
		t.Fatalf("exchange: %+v, %v; want 3 pushed", st, err)
	}
	if want := []uint32{2, 5, 9, 2, 5, 9}; !slices.Equal(b.peer.entryOf, want) {
		t.Fatalf("SegmentEntries calls for partitions %v, want %v (all first comparisons, then all second)", b.peer.entryOf, want)
	}
	if got := sorted16(st.Converged); !slices.Equal(got, parts) {
		t.Fatalf("converged %v, want %v", got, parts)
	}
}
