package metrics

import (
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Pebble exports the metrics of the node's Pebble database and the free
// space of its disk, read at each scrape. It is a prometheus.Collector.
type Pebble struct {
	read        func() (*pebble.Metrics, error) // storage.Store.Metrics
	disk        func() (vfs.DiskUsage, error)   // the data dir's filesystem
	fsyncBounds []float64                       // Pebble's fsync bucket bounds (ns) kept, ascending
}

// NewPebble returns the collector of the metrics read returns (the
// store's) and of the disk usage disk returns (the data dir's).
func NewPebble(read func() (*pebble.Metrics, error), disk func() (vfs.DiskUsage, error)) *Pebble {
	return &Pebble{read: read, disk: disk, fsyncBounds: fsyncBounds()}
}

// pebbleSeries is one of Pebble's metrics, one series: a counter when
// its name ends in _total, else a gauge.
type pebbleSeries struct {
	name, help string
	value      func(m *pebble.Metrics) float64
}

// pebbleSeriesList are Pebble's metrics this node exports as one series
// each (a table: one line per series).
var pebbleSeriesList = []pebbleSeries{
	{"norn_pebble_compactions_total", "Compactions Pebble ran.", func(m *pebble.Metrics) float64 { return float64(m.Compact.Count) }},
	{"norn_pebble_compactions_in_progress", "Compactions running now.", func(m *pebble.Metrics) float64 { return float64(m.Compact.NumInProgress) }},
	{"norn_pebble_compaction_debt_bytes", "Estimated bytes to compact for the LSM to reach a stable state.", func(m *pebble.Metrics) float64 { return float64(m.Compact.EstimatedDebt) }},
	{"norn_pebble_flushes_total", "Memtable flushes.", func(m *pebble.Metrics) float64 { return float64(m.Flush.Count) }},
	{"norn_pebble_read_amplification", "Read amplification: sublevels of L0 plus the other non-empty levels.", func(m *pebble.Metrics) float64 { return float64(m.ReadAmp()) }},
	{"norn_pebble_memtable_bytes", "Bytes allocated by memtables and large batches.", func(m *pebble.Metrics) float64 { return float64(m.MemTable.Size) }},
	{"norn_pebble_memtables", "Memtables.", func(m *pebble.Metrics) float64 { return float64(m.MemTable.Count) }},
	{"norn_pebble_block_cache_bytes", "Bytes in Pebble's block cache.", func(m *pebble.Metrics) float64 { return float64(m.BlockCache.Size) }},
	{"norn_pebble_block_cache_hits_total", "Block cache hits.", func(m *pebble.Metrics) float64 { return float64(m.BlockCache.Hits) }},
	{"norn_pebble_block_cache_misses_total", "Block cache misses.", func(m *pebble.Metrics) float64 { return float64(m.BlockCache.Misses) }},
	{"norn_pebble_wal_bytes", "Bytes of live data in the WAL files (the memtables' not yet flushed).", func(m *pebble.Metrics) float64 { return float64(m.WAL.Size) }},
	{"norn_pebble_wal_written_bytes_total", "Bytes written to the WAL.", func(m *pebble.Metrics) float64 { return float64(m.WAL.BytesWritten) }},
	{"norn_pebble_disk_usage_bytes", "Disk space Pebble uses: live and obsolete tables, WAL, manifests.", func(m *pebble.Metrics) float64 { return float64(m.DiskSpaceUsage()) }},
}

// pebbleDescs are the Descs of pebbleSeriesList, in its order.
var pebbleDescs = func() []*prometheus.Desc {
	out := make([]*prometheus.Desc, len(pebbleSeriesList))
	for i, s := range pebbleSeriesList {
		out[i] = prometheus.NewDesc(s.name, s.help, nil, nil)
	}
	return out
}()

var (
	pebbleLevelTables = prometheus.NewDesc("norn_pebble_level_tables", "Sstables in each LSM level.", []string{"level"}, nil)
	pebbleLevelBytes  = prometheus.NewDesc("norn_pebble_level_bytes", "Bytes of the sstables in each LSM level.", []string{"level"}, nil)
	pebbleFsync       = prometheus.NewDesc("norn_pebble_wal_fsync_duration_seconds", "Latency of Pebble's WAL fsyncs.", nil, nil)
	diskAvailable     = prometheus.NewDesc("norn_disk_available_bytes", "Free bytes of the data dir's filesystem available to nornd.", nil, nil)
	diskTotal         = prometheus.NewDesc("norn_disk_total_bytes", "Size of the data dir's filesystem.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *Pebble) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range pebbleDescs {
		ch <- d
	}
	ch <- pebbleLevelTables
	ch <- pebbleLevelBytes
	ch <- pebbleFsync
	ch <- diskAvailable
	ch <- diskTotal
}

// Collect implements prometheus.Collector: what cannot be read (a closed
// store, a filesystem without statfs) is left out.
func (c *Pebble) Collect(ch chan<- prometheus.Metric) {
	if du, err := c.disk(); err == nil {
		ch <- prometheus.MustNewConstMetric(diskAvailable, prometheus.GaugeValue, float64(du.AvailBytes))
		ch <- prometheus.MustNewConstMetric(diskTotal, prometheus.GaugeValue, float64(du.TotalBytes))
	}
	m, err := c.read()
	if err != nil {
		return
	}
	for i, s := range pebbleSeriesList {
		t := prometheus.GaugeValue
		if strings.HasSuffix(s.name, "_total") {
			t = prometheus.CounterValue
		}
		ch <- prometheus.MustNewConstMetric(pebbleDescs[i], t, s.value(m))
	}
	for i, l := range m.Levels {
		level := strconv.Itoa(i)
		ch <- prometheus.MustNewConstMetric(pebbleLevelTables, prometheus.GaugeValue, float64(l.TablesCount), level)
		ch <- prometheus.MustNewConstMetric(pebbleLevelBytes, prometheus.GaugeValue, float64(l.TablesSize), level)
	}
	if h := m.LogWriter.FsyncLatency; h != nil {
		var d dto.Metric
		if h.Write(&d) == nil && d.Histogram != nil {
			ch <- c.fsyncHistogram(d.Histogram)
		}
	}
}

// fsyncTargets are the bucket bounds, in seconds, the fsync histogram
// aims at: Pebble's own has 100 buckets (FsyncLatencyBuckets), the
// largest bound of its at or below each target is kept.
var fsyncTargets = []float64{0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10}

// fsyncBounds returns the bounds of pebble.FsyncLatencyBuckets (in ns)
// kept: for each target, the largest at or below it.
func fsyncBounds() []float64 {
	var out []float64
	for _, target := range fsyncTargets {
		ns := target * float64(time.Second) * (1 + 1e-9)
		best := 0.0
		for _, b := range pebble.FsyncLatencyBuckets {
			if b <= ns && b > best {
				best = b
			}
		}
		if best > 0 && (len(out) == 0 || best > out[len(out)-1]) {
			out = append(out, best)
		}
	}
	return out
}

// fsyncHistogram converts Pebble's fsync histogram (observations in ns)
// to seconds with the bounds kept.
func (c *Pebble) fsyncHistogram(h *dto.Histogram) prometheus.Metric {
	cum := map[float64]uint64{} // by bound (ns)
	for _, b := range h.GetBucket() {
		cum[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	buckets := make(map[float64]uint64, len(c.fsyncBounds))
	for _, b := range c.fsyncBounds {
		// 4 significant digits: Pebble's exponential bounds are not
		// round (0.0092991... s), and 1e10 ns comes out 9.99...958e9.
		s, _ := strconv.ParseFloat(strconv.FormatFloat(b/float64(time.Second), 'g', 4, 64), 64)
		buckets[s] = cum[b]
	}
	return prometheus.MustNewConstHistogram(pebbleFsync, h.GetSampleCount(), h.GetSampleSum()/float64(time.Second), buckets)
}
