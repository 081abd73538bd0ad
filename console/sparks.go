package console

// The overview's throughput and latency sparklines, from the node's own
// RPC metrics (package metrics, rpc.go): a sampler gathers the registry
// every sampleEvery and keeps, per public method, the last sampleKeep
// intervals' calls and errors per second and their p50 and p99 latency.
// Unlike the pages' other contents this is no API call: the console reads
// the registry of the node serving it (what GET /metrics serves), so the
// charts show this node's calls only.

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

const (
	// sampleEvery is the default interval between two samples
	// (Config.SampleEvery).
	sampleEvery = 10 * time.Second
	// sampleKeep is how many intervals a chart shows: 10 minutes at the
	// default interval.
	sampleKeep = 60
)

// The metrics read (metrics.NewRPC).
const (
	callsMetric    = "norn_rpc_server_calls_total"
	durationMetric = "norn_rpc_server_duration_seconds"
)

// publicServices are the services charted; PeerService (the nodes'
// calls to each other) and the framed Raft calls are left out.
var publicServices = map[string]string{
	"norn.v1.TaskService":  "TaskService",
	"norn.v1.QueueService": "QueueService",
	"norn.v1.AdminService": "AdminService",
}

// The size of a sparkline, in pixels and SVG user units (the "spark"
// template of templates/overview.html has them too).
const (
	sparkW   = 120
	sparkH   = 24
	sparkPad = 2
)

// totals are one method's cumulative counts at one gather, summed over
// its transports (and codes).
type totals struct {
	calls, errs float64  // calls, and calls whose code was not ok
	count       uint64   // observations of its latency histograms
	buckets     []bucket // their classic buckets, cumulative, by upper bound
}

type bucket struct {
	upper float64
	n     uint64
}

// point is one method's interval between two gathers.
type point struct {
	calls, errs float64 // per second, when rated
	p50, p99    float64 // seconds, when timed
	rated       bool    // no call counter went down in the interval
	timed       bool    // calls were timed in it, and the histogram did not go down
}

// sampler keeps the charts' points. Safe for concurrent use.
type sampler struct {
	g     prometheus.Gatherer
	every time.Duration
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once

	mu     sync.Mutex
	prev   map[string]totals // the last gather's, by "norn.v1.Service/Method"; nil before the first
	prevAt time.Time
	n      int                // intervals in the window, at most sampleKeep
	series map[string][]point // by method, n each, the newest last
}

func newSampler(g prometheus.Gatherer, every time.Duration) *sampler {
	if every <= 0 {
		every = sampleEvery
	}
	return &sampler{g: g, every: every, stop: make(chan struct{}), done: make(chan struct{}), series: map[string][]point{}}
}

// start samples now and then every s.every, until close.
func (s *sampler) start() {
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.every)
		defer t.Stop()
		s.sample(time.Now())
		for {
			select {
			case <-s.stop:
				return
			case now := <-t.C:
				s.sample(now)
			}
		}
	}()
}

// close stops the sampling and waits for it to end; later calls return
// at once.
func (s *sampler) close() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

// sample gathers the registry at now and adds the interval since the
// previous gather to every method's series (the first gather is the
// base of the next).
func (s *sampler) sample(now time.Time) {
	// A collector's error leaves its series out, and the RPC ones are
	// plain vectors: use what came.
	mfs, _ := s.g.Gather()
	cur := rpcTotals(mfs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prev == nil {
		s.prev, s.prevAt = cur, now
		return
	}
	dt := now.Sub(s.prevAt).Seconds()
	if dt <= 0 {
		return
	}
	for m := range cur {
		if _, ok := s.series[m]; !ok {
			// Series are made at a method's first call: none before.
			s.series[m] = make([]point, s.n, sampleKeep)
			for i := range s.series[m] {
				s.series[m][i].rated = true
			}
		}
	}
	for m, ser := range s.series {
		var pt point // a series gone from the registry: unknown
		if c, ok := cur[m]; ok {
			pt = interval(s.prev[m], c, dt)
		}
		if len(ser) == sampleKeep {
			copy(ser, ser[1:])
			ser = ser[:len(ser)-1]
		}
		s.series[m] = append(ser, pt)
	}
	s.n = min(s.n+1, sampleKeep)
	s.prev, s.prevAt = cur, now
}

// rpcTotals sums the public methods' server-side RPC metrics of mfs.
func rpcTotals(mfs []*dto.MetricFamily) map[string]totals {
	out := map[string]totals{}
	for _, mf := range mfs {
		name := mf.GetName()
		if name != callsMetric && name != durationMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			var service, method, code string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "service":
					service = l.GetValue()
				case "method":
					method = l.GetValue()
				case "code":
					code = l.GetValue()
				}
			}
			if _, ok := publicServices[service]; !ok {
				continue
			}
			key := service + "/" + method
			t := out[key]
			if name == callsMetric {
				v := m.GetCounter().GetValue()
				t.calls += v
				if code != "ok" {
					t.errs += v
				}
			} else {
				h := m.GetHistogram()
				t.count += h.GetSampleCount()
				for _, b := range h.GetBucket() {
					t.buckets = addBucket(t.buckets, b.GetUpperBound(), b.GetCumulativeCount())
				}
			}
			out[key] = t
		}
	}
	return out
}

// addBucket adds n to the bucket of bs with upper bound upper, made if
// missing; bs stays sorted by bound (the transports' histograms have the
// same bounds).
func addBucket(bs []bucket, upper float64, n uint64) []bucket {
	i, found := slices.BinarySearchFunc(bs, upper, func(b bucket, u float64) int { return cmp.Compare(b.upper, u) })
	if found {
		bs[i].n += n
		return bs
	}
	return slices.Insert(bs, i, bucket{upper, n})
}

// interval is the point of the dt seconds between prev and cur: none of
// what went down (a counter reset: a restart, or the native histogram's
// reset, which resets its classic buckets too).
func interval(prev, cur totals, dt float64) point {
	var pt point
	if dc, de := cur.calls-prev.calls, cur.errs-prev.errs; dc >= 0 && de >= 0 {
		pt.calls, pt.errs, pt.rated = dc/dt, de/dt, true
	}
	if cur.count <= prev.count {
		return pt
	}
	// The interval's buckets: the cumulative counts' differences.
	total := float64(cur.count - prev.count)
	d := make([]bucket, len(cur.buckets))
	for i, b := range cur.buckets {
		var was uint64
		if j, ok := slices.BinarySearchFunc(prev.buckets, b.upper, func(b bucket, u float64) int { return cmp.Compare(b.upper, u) }); ok {
			was = prev.buckets[j].n
		}
		if b.n < was {
			return pt
		}
		d[i] = bucket{b.upper, b.n - was}
	}
	pt.p50, pt.p99, pt.timed = quantile(0.5, d, total), quantile(0.99, d, total), true
	return pt
}

// quantile is the q-quantile of total observations counted in the
// cumulative buckets bs, as Prometheus' histogram_quantile estimates it:
// linear interpolation inside the bucket the rank falls in (the first
// bucket starting at 0), and the highest finite bound when it falls in
// the +Inf bucket (beyond the last bound).
func quantile(q float64, bs []bucket, total float64) float64 {
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range bs {
		n := float64(b.n)
		if n >= rank && n > below {
			return lower + (b.upper-lower)*(rank-below)/(n-below)
		}
		lower, below = b.upper, n
	}
	return lower
}

// sparksView is the overview's charts.
type sparksView struct {
	Off    bool   // the console has no metrics to chart
	Window string // what a chart spans ("10 minutes")
	Every  string // the interval of a point ("10s")
	Rows   []sparkRow
}

// sparkRow is one method's charts, and its newest values.
type sparkRow struct {
	Method         string // "TaskService/Enqueue"
	Calls, Latency chart
	CallsNow       string // per second
	ErrsNow        string
	Erring         bool // errors in the newest interval
	P50, P99       string
}

// chart is one sparkline: an SVG of polylines.
type chart struct {
	Label string // its accessible name
	Lines []chartLine
}

// chartLine is one polyline: a CSS class (its colour) and its points,
// "x,y x,y ..." (digits, dots, commas and spaces only).
type chartLine struct {
	Class, Points string
}

// view returns the charts of the methods called in the window, busiest
// first.
func (s *sampler) view() *sparksView {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := &sparksView{Window: span(s.every * sampleKeep), Every: s.every.String()}
	sums := map[string]float64{}
	for m, ser := range s.series {
		for _, p := range ser {
			sums[m] += p.calls
		}
		if sums[m] > 0 {
			v.Rows = append(v.Rows, row(m, ser))
		}
	}
	slices.SortFunc(v.Rows, func(a, b sparkRow) int {
		return cmp.Or(cmp.Compare(sums[b.Method], sums[a.Method]), strings.Compare(a.Method, b.Method))
	})
	for i := range v.Rows {
		v.Rows[i].Method = shortMethod(v.Rows[i].Method)
	}
	return v
}

// row is method's row of points ser.
func row(method string, ser []point) sparkRow {
	r := sparkRow{Method: method, CallsNow: "–", ErrsNow: "–", P50: "–", P99: "–"}
	var top, lat float64
	for _, p := range ser {
		top, lat = max(top, p.calls), max(lat, p.p99)
	}
	rate := func(f func(point) float64) func(int) (float64, bool) {
		return func(i int) (float64, bool) { return f(ser[i]), ser[i].rated }
	}
	timed := func(f func(point) float64) func(int) (float64, bool) {
		return func(i int) (float64, bool) { return f(ser[i]), ser[i].timed }
	}
	r.Calls = chart{Label: "calls per second", Lines: lines("calls", len(ser), rate(func(p point) float64 { return p.calls }), top)}
	for _, p := range ser {
		if p.errs > 0 {
			// Errors on the calls' scale.
			r.Calls.Label = "calls and errors per second"
			r.Calls.Lines = append(r.Calls.Lines, lines("errs", len(ser), rate(func(p point) float64 { return p.errs }), top)...)
			break
		}
	}
	r.Latency = chart{Label: "latency p99 and p50", Lines: append(
		lines("p99", len(ser), timed(func(p point) float64 { return p.p99 }), lat),
		lines("p50", len(ser), timed(func(p point) float64 { return p.p50 }), lat)...)}
	for i := len(ser) - 1; i >= 0; i-- {
		if ser[i].rated {
			r.CallsNow, r.ErrsNow, r.Erring = rateText(ser[i].calls), rateText(ser[i].errs), ser[i].errs > 0
			break
		}
	}
	for i := len(ser) - 1; i >= 0; i-- {
		if ser[i].timed {
			r.P50, r.P99 = latencyText(ser[i].p50), latencyText(ser[i].p99)
			break
		}
	}
	return r
}

// lines returns the polylines, of class class, of the n values val
// gives: one per run of known values (an interval without a sample
// breaks the line), scaled to top, the newest at the right edge and a
// full window across the width.
func lines(class string, n int, val func(int) (float64, bool), top float64) []chartLine {
	step := float64(sparkW-2*sparkPad) / (sampleKeep - 1)
	var out []chartLine
	var b strings.Builder
	run := 0
	flush := func() {
		if run == 1 {
			// One point alone: a line of no length, drawn as a dot
			// (stroke-linecap round).
			b.WriteString(" " + b.String())
		}
		if run > 0 {
			out = append(out, chartLine{Class: class, Points: b.String()})
		}
		b.Reset()
		run = 0
	}
	for i := range n {
		v, ok := val(i)
		if !ok {
			flush()
			continue
		}
		y := float64(sparkH - sparkPad)
		if top > 0 {
			y -= v / top * (sparkH - 2*sparkPad)
		}
		if run > 0 {
			b.WriteByte(' ')
		}
		x := float64(sparkW-sparkPad) - float64(n-1-i)*step
		b.WriteString(strconv.FormatFloat(x, 'f', 1, 64) + "," + strconv.FormatFloat(y, 'f', 1, 64))
		run++
	}
	flush()
	return out
}

// shortMethod is "TaskService/Enqueue" for "norn.v1.TaskService/Enqueue".
func shortMethod(m string) string {
	service, method, _ := strings.Cut(m, "/")
	return publicServices[service] + "/" + method
}

// span is d in words: "10 minutes".
func span(d time.Duration) string {
	switch {
	case d == time.Minute:
		return "minute"
	case d > time.Minute && d%time.Minute == 0:
		return strconv.Itoa(int(d/time.Minute)) + " minutes"
	}
	return d.String()
}

// rateText is a rate per second, to two decimals at most.
func rateText(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v < 0.01:
		return "<0.01"
	}
	return trimZeros(strconv.FormatFloat(v, 'f', 2, 64))
}

// latencyText is a latency in seconds, in µs, ms or s.
func latencyText(s float64) string {
	switch {
	case s < 0.001:
		return strconv.FormatFloat(s*1e6, 'f', 0, 64) + " µs"
	case s < 1:
		return trimZeros(strconv.FormatFloat(s*1e3, 'f', 1, 64)) + " ms"
	}
	return trimZeros(strconv.FormatFloat(s, 'f', 2, 64)) + " s"
}

// trimZeros drops a decimal number's trailing zeros, and its point when
// nothing follows.
func trimZeros(s string) string {
	if !strings.Contains(s, ".") {
		return s
	}
	return strings.TrimSuffix(strings.TrimRight(s, "0"), ".")
}
