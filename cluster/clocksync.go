package cluster

import (
	"encoding/binary"
	"time"

	"github.com/hashicorp/memberlist"
)

// Clock is the wall clock Membership reads, from memberlist's goroutines:
// it must be safe for concurrent use. crdt.Clock satisfies it.
type Clock interface {
	Now() time.Time
}

// systemClock is the default Clock.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// ackTimeBytes is the size of the payload each node appends to its probe
// acks: its wall-clock time when it builds the ack, unix nanoseconds,
// big-endian.
const ackTimeBytes = 8

func encodeAckTime(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, ackTimeBytes), uint64(t.UnixNano()))
}

// decodeAckTime decodes an ack payload; ok is false for a payload of the
// wrong size (a peer that sends none, or something else).
func decodeAckTime(b []byte) (t time.Time, ok bool) {
	if len(b) != ackTimeBytes {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(b))), true
}

// clockSample is one probe's estimate of a peer's clock offset (its clock
// minus ours) and the round trip it came from, with how far this node's own
// clock had stepped when it was taken (see stepMeter).
type clockSample struct {
	rtt, offset time.Duration
	step        time.Duration
}

// stepMeter measures how far a wall clock has moved against the monotonic
// clock since the meter started: 0 for a steady clock, +d after the clock
// stepped d forward (or ran fast by d in all). Offsets sampled before a
// step of this node's own clock are corrected by it (offsetWindow), so the
// node sees its own step in its offsets at once instead of after its
// samples age out.
type stepMeter struct {
	wall time.Time // the wall clock at the start, without monotonic reading
	mono time.Time // time.Now() at the start (monotonic)
}

func newStepMeter(now time.Time) stepMeter {
	return stepMeter{wall: now.Round(0), mono: time.Now()}
}

// step is the wall clock's drift at now, a reading of that wall clock.
func (m stepMeter) step(now time.Time) time.Duration {
	return now.Round(0).Sub(m.wall) - time.Since(m.mono)
}

// sampleOffset estimates a peer's offset from one probe: the peer read
// its clock (peerTime) somewhere in the round trip, assumed in the middle,
// so when the ack arrived (localRecv, our clock) the peer's clock read
// about peerTime + rtt/2. The error is at most rtt/2 (all of the trip's
// asymmetry), plus the peer's time spent building the ack.
func sampleOffset(peerTime, localRecv time.Time, rtt time.Duration) clockSample {
	return clockSample{rtt: rtt, offset: peerTime.Add(rtt / 2).Sub(localRecv)}
}

// offsetSamples is how many recent samples offsetWindow keeps per peer.
const offsetSamples = 8

// offsetWindow keeps a peer's last offsetSamples clock samples. Its
// estimate is the offset of the sample with the smallest round trip (the
// newest among equals), as NTP's clock filter does: that sample has the
// smallest error bound, and a probe delayed by queueing (which skews its
// offset by up to half the delay) loses to any prompt one. A clock step
// on the peer shows once the samples from before it have left the window
// or a faster one arrives. A deterministic core: no clock, no goroutine.
type offsetWindow struct {
	samples [offsetSamples]clockSample // ring; the oldest at next once full
	n       int                        // samples held, ≤ offsetSamples
	next    int                        // where the next sample goes
	at      time.Time                  // when the newest sample was added (monotonic)
}

// stepTolerance is how far a new sample may disagree with the current
// estimate beyond both samples' error bounds (half their round trips)
// before the peer's clock counts as stepped: the time the peer spends
// building its ack, and slow drift between samples.
const stepTolerance = 20 * time.Millisecond

// add records s, taken at (monotonic); a sample with a negative round trip
// is ignored. A sample that cannot agree with the estimate (they differ
// by more than their error bounds and stepTolerance) means the peer's
// clock stepped: the older samples are dropped, so the step shows at once
// instead of after they age out.
func (w *offsetWindow) add(s clockSample, at time.Time) {
	if s.rtt < 0 {
		return
	}
	if best, ok := w.best(); ok {
		prev := best.offset - (s.step - best.step) // as of s's own clock steps
		if d := s.offset - prev; d > (s.rtt+best.rtt)/2+stepTolerance || d < -(s.rtt+best.rtt)/2-stepTolerance {
			w.n = 0
		}
	}
	w.at = at
	w.samples[w.next] = s
	w.next = (w.next + 1) % offsetSamples
	w.n = min(w.n+1, offsetSamples)
}

// estimate is the offset of the smallest-round-trip sample held, corrected
// by this node's clock steps since it was taken (step is the step now); ok
// is false when there is none.
func (w *offsetWindow) estimate(step time.Duration) (offset time.Duration, ok bool) {
	b, ok := w.best()
	if !ok {
		return 0, false
	}
	return b.offset - (step - b.step), true
}

// best is the sample with the smallest round trip (the newest among
// equals); ok is false when there is none.
func (w *offsetWindow) best() (clockSample, bool) {
	if w.n == 0 {
		return clockSample{}, false
	}
	best := -1
	for i := range w.n { // oldest to newest, so the newest wins a tie
		j := (w.next - w.n + i + offsetSamples) % offsetSamples
		if best < 0 || w.samples[j].rtt <= w.samples[best].rtt {
			best = j
		}
	}
	return w.samples[best], true
}

// pinger is memberlist's PingDelegate: every ack this node sends carries
// its clock, and every direct probe ack it receives (memberlist does not
// report indirect or TCP ones) gives a clock sample of the peer and clears
// the peer's suspicion. Neither blocks.
type pinger Membership

func (p *pinger) AckPayload() []byte { return encodeAckTime(p.clock.Now()) }

func (p *pinger) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, payload []byte) {
	m := (*Membership)(p)
	now := m.clock.Now()
	peerTime, ok := decodeAckTime(payload)
	m.mu.Lock()
	pr := m.members[other.Name]
	if pr == nil {
		m.mu.Unlock()
		return
	}
	if ok {
		smp := sampleOffset(peerTime, now, rtt)
		smp.step = m.steps.step(now)
		pr.offsets.add(smp, time.Now())
	}
	wasSuspect := pr.suspect
	pr.suspect = false
	m.mu.Unlock()
	if wasSuspect {
		m.signal()
	}
}
