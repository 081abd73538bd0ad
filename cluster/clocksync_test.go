package cluster

import (
	"testing"
	"time"
)

func TestOffsetWindow(t *testing.T) {
	ms := time.Millisecond
	s := func(rtt, offset time.Duration) clockSample { return clockSample{rtt: rtt, offset: offset} }
	for _, tc := range []struct {
		name    string
		samples []clockSample
		want    time.Duration
		ok      bool
	}{
		{"empty", nil, 0, false},
		{"one", []clockSample{s(4*ms, 7*ms)}, 7 * ms, true},
		{"smallest round trip wins", []clockSample{s(9*ms, 14*ms), s(1*ms, 10*ms), s(5*ms, 12*ms)}, 10 * ms, true},
		{"newest wins a tie", []clockSample{s(2*ms, 1*ms), s(2*ms, 2*ms), s(3*ms, 3*ms)}, 2 * ms, true},
		{"negative round trip ignored", []clockSample{s(5*ms, 50*ms), s(-1*ms, 0)}, 50 * ms, true},
		{"only negative", []clockSample{s(-1*ms, 0)}, 0, false},
		{
			"the fast sample ages out after offsetSamples more",
			[]clockSample{s(1*ms, 10*ms), s(5*ms, 11*ms), s(5*ms, 12*ms), s(5*ms, 13*ms), s(5*ms, 14*ms), s(5*ms, 15*ms), s(5*ms, 16*ms), s(5*ms, 17*ms), s(6*ms, 20*ms)},
			17 * ms, true,
		},
		{
			"still there with offsetSamples-1 after it",
			[]clockSample{s(1*ms, 10*ms), s(5*ms, 11*ms), s(5*ms, 12*ms), s(5*ms, 13*ms), s(5*ms, 14*ms), s(5*ms, 15*ms), s(5*ms, 16*ms), s(5*ms, 17*ms)},
			10 * ms, true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w offsetWindow
			for _, smp := range tc.samples {
				w.add(smp, time.Time{})
			}
			if got, ok := w.estimate(0); got != tc.want || ok != tc.ok {
				t.Errorf("estimate() = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestOffsetWindowCorrectsOwnSteps: after this node's clock steps by d,
// every peer's offset reads d less at once, whichever sample is chosen.
func TestOffsetWindowCorrectsOwnSteps(t *testing.T) {
	ms := time.Millisecond
	var w offsetWindow
	w.add(clockSample{rtt: 1 * ms, offset: 10 * ms, step: 0}, time.Time{})
	if got, _ := w.estimate(0); got != 10*ms {
		t.Fatalf("before the step: %v", got)
	}
	if got, _ := w.estimate(3 * time.Second); got != 10*ms-3*time.Second {
		t.Fatalf("after a 3 s step forward: %v, want %v", got, 10*ms-3*time.Second)
	}
	// A sample taken after the step needs no correction.
	w.add(clockSample{rtt: 1 * ms, offset: 10*ms - 3*time.Second, step: 3 * time.Second}, time.Time{})
	if got, _ := w.estimate(3 * time.Second); got != 10*ms-3*time.Second {
		t.Fatalf("a sample after the step: %v", got)
	}
	// Stepping back by the same.
	if got, _ := w.estimate(0); got != 10*ms {
		t.Fatalf("stepped back: %v", got)
	}
}

// TestOffsetWindowSeesPeerSteps: a sample that cannot agree with the
// estimate (the peer's clock stepped) replaces the window at once, even
// when older samples had smaller round trips; one within the error bounds
// does not.
func TestOffsetWindowSeesPeerSteps(t *testing.T) {
	ms := time.Millisecond
	var w offsetWindow
	w.add(clockSample{rtt: 1 * ms, offset: 10 * ms}, time.Time{})
	w.add(clockSample{rtt: 40 * ms, offset: 10*ms + 35*ms}, time.Time{}) // within 20.5 ms + tolerance
	if got, _ := w.estimate(0); got != 10*ms {
		t.Fatalf("a slow sample within its bound replaced the estimate: %v", got)
	}
	w.add(clockSample{rtt: 2 * ms, offset: 53 * time.Second}, time.Time{}) // the peer stepped
	if got, _ := w.estimate(0); got != 53*time.Second {
		t.Fatalf("after the peer's step: %v, want 53s", got)
	}
	w.add(clockSample{rtt: 3 * ms, offset: 12 * ms}, time.Time{}) // and back
	if got, _ := w.estimate(0); got != 12*ms {
		t.Fatalf("after the peer stepped back: %v, want 12ms", got)
	}
	// This node's own step is not a peer step: corrected, not dropped.
	w.add(clockSample{rtt: 5 * ms, offset: 12*ms - 2*time.Second, step: 2 * time.Second}, time.Time{})
	if got, _ := w.estimate(2 * time.Second); got != 12*ms-2*time.Second || w.n != 2 {
		t.Fatalf("own step: estimate %v with %d samples", got, w.n)
	}
}

// TestStepMeter: a steady clock has no step; a clock shifted by d reads d.
func TestStepMeter(t *testing.T) {
	m := newStepMeter(time.Now())
	if s := m.step(time.Now()); s < -50*time.Millisecond || s > 50*time.Millisecond {
		t.Fatalf("steady clock: step %v", s)
	}
	// time.Now().Add keeps the monotonic reading: step must use the wall
	// reading only.
	if s := m.step(time.Now().Add(2 * time.Second)); s < 1950*time.Millisecond || s > 2050*time.Millisecond {
		t.Fatalf("clock 2 s ahead: step %v", s)
	}
}

func TestSampleOffset(t *testing.T) {
	local := time.Unix(1000, 0)
	for _, tc := range []struct {
		peer time.Time
		rtt  time.Duration
		want time.Duration
	}{
		{local, 0, 0},
		{local.Add(-5 * time.Millisecond), 10 * time.Millisecond, 0}, // read mid-trip
		{local.Add(3 * time.Second), 10 * time.Millisecond, 3*time.Second + 5*time.Millisecond},
		{local.Add(-3 * time.Second), 0, -3 * time.Second},
	} {
		if got := sampleOffset(tc.peer, local, tc.rtt); got.offset != tc.want || got.rtt != tc.rtt {
			t.Errorf("sampleOffset(%v, %v, %v) = %+v, want offset %v", tc.peer, local, tc.rtt, got, tc.want)
		}
	}
}

func TestAckTime(t *testing.T) {
	now := time.Unix(1_700_000_000, 123456789)
	if got, ok := decodeAckTime(encodeAckTime(now)); !ok || !got.Equal(now) {
		t.Errorf("round trip: %v, %v; want %v", got, ok, now)
	}
	for _, b := range [][]byte{nil, {}, {1, 2, 3}, make([]byte, 7), make([]byte, 9)} {
		if _, ok := decodeAckTime(b); ok {
			t.Errorf("decodeAckTime accepted %d bytes", len(b))
		}
	}
}

func FuzzDecodeAckTime(f *testing.F) {
	f.Add(encodeAckTime(time.Unix(1_700_000_000, 1)))
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := decodeAckTime(b)
		if ok != (len(b) == ackTimeBytes) {
			t.Fatalf("decodeAckTime(%x) ok = %v", b, ok)
		}
		if ok && string(encodeAckTime(got)) != string(b) {
			t.Fatalf("decodeAckTime(%x) = %v, which encodes back to %x", b, got, encodeAckTime(got))
		}
	})
}
