package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxPartitionLabels bounds the per-partition series of the Raft metrics
// that Norn adds (apply latency and lag): with at most this many
// partitions (-partitions) each partition group has its own series
// (partition="0", "1", ...); with more, the partition groups share one,
// partition="all" (the latency's observations together, the lag's sum).
// The meta group always has its own (group="meta", no partition label
// value: "").
const MaxPartitionLabels = 16

// AllPartitions is the partition label value of the aggregated series.
const AllPartitions = "all"

// applyBuckets are the classic buckets of the Raft apply latency, in
// seconds: a commit is a WAL fsync here and on a majority.
var applyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Raft holds the latency of the partition groups' proposals. Safe for
// concurrent use.
type Raft struct {
	partitions int
	apply      []prometheus.Observer // by partition, or one for all
}

// NewRaft returns the Raft metrics of a node of P partitions, registered
// with reg.
func NewRaft(reg prometheus.Registerer, partitions int) *Raft {
	v := prometheus.NewHistogramVec(nativeHistogram(prometheus.HistogramOpts{
		Name: "norn_raft_apply_duration_seconds",
		Help: "Time a proposal this node led (claim, renew, expiry, claim ends) took to commit and apply here, by partition group " +
			"(partition=\"all\" with more than " + strconv.Itoa(MaxPartitionLabels) + " partitions).",
		Buckets: applyBuckets,
	}), []string{"partition"})
	reg.MustRegister(v)
	r := &Raft{partitions: partitions}
	if partitions <= MaxPartitionLabels {
		for p := range partitions {
			r.apply = append(r.apply, v.WithLabelValues(strconv.Itoa(p)))
		}
	} else {
		r.apply = []prometheus.Observer{v.WithLabelValues(AllPartitions)}
	}
	return r
}

// PartitionLabel is partition p's label value: p, or AllPartitions.
func (r *Raft) PartitionLabel(p int) string {
	if r.partitions <= MaxPartitionLabels {
		return strconv.Itoa(p)
	}
	return AllPartitions
}

// Proposed observes a proposal of partition p that took d
// (replicas.Config.OnProposed).
func (r *Raft) Proposed(p uint16, d time.Duration) {
	i := int(p)
	if len(r.apply) == 1 || i >= len(r.apply) {
		i = 0
	}
	r.apply[i].Observe(d.Seconds())
}
