package metrics

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// MaxQueueLabels bounds the queue label values of the task metrics: the
// first MaxQueueLabels queue names a node meets (in a call, or in its
// counters at a scrape) get series of their own for the life of the
// process; every later queue, and a task whose queue the node does not
// know, is counted under OtherQueue.
const MaxQueueLabels = 32

// OtherQueue is the queue label value of the queues beyond
// MaxQueueLabels. A queue really named "other" shares its series.
const OtherQueue = "other"

// maxOverflowNames bounds how many names beyond MaxQueueLabels are
// remembered as OtherQueue (the rest take a mutex on every event).
const maxOverflowNames = 4096

// ageBuckets are the classic buckets of the task age at claim, in
// seconds: from a task claimed as it arrives to one a day old.
var ageBuckets = []float64{0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400}

// waitBuckets are the classic buckets of a Claim's wait, in seconds.
var waitBuckets = []float64{0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60}

// Tasks counts what happens to tasks, by queue (bounded: MaxQueueLabels),
// on the node that did it: it implements server.TaskEvents, and Expired
// and Aborted are dispatch.Config's OnExpired and OnAborted. Safe for
// concurrent use.
type Tasks struct {
	enqueued, claimed, renewed, completed, aborted, cancelled, expired, failed *prometheus.CounterVec

	age  *prometheus.HistogramVec
	wait [2]prometheus.Observer // an empty answer, one with tasks

	queues sync.Map // queue name -> *queueSeries
	mu     sync.Mutex
	labels []string // queues with series of their own, in the order met
	over   int      // names remembered as OtherQueue
	other  *queueSeries
}

// queueSeries is one queue label value's series.
type queueSeries struct {
	label                                                                      string
	enqueued, claimed, renewed, completed, aborted, cancelled, expired, failed prometheus.Counter
	age                                                                        prometheus.Observer
}

// NewTasks returns the task metrics, registered with reg.
func NewTasks(reg prometheus.Registerer) *Tasks {
	counter := func(name, help string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"queue"})
		reg.MustRegister(v)
		return v
	}
	t := &Tasks{
		enqueued:  counter("norn_tasks_enqueued_total", "Tasks enqueued through this node (written with their quorum)."),
		claimed:   counter("norn_tasks_claimed_total", "Tasks handed to workers by Claims made to this node (a claim proxied to another leader counts here only)."),
		renewed:   counter("norn_claims_renewed_total", "Claims renewed by this node (the task's partition leader)."),
		completed: counter("norn_tasks_completed_total", "Tasks completed by this node (the claim's partition leader)."),
		aborted:   counter("norn_tasks_aborted_total", "Tasks aborted by this node: by their workers, and by the node itself (max_claims reached, a dependency failed)."),
		cancelled: counter("norn_tasks_cancelled_total", "Tasks cancelled by this node (the task's partition leader)."),
		expired:   counter("norn_claims_expired_total", "Claims whose lease ran out, expired by this node's monitor (the partition leader)."),
		failed:    counter("norn_tasks_failed_attempts_total", "Attempts failed by their workers (a retryable Abort) on this node (the claim's partition leader): the task waits its backoff, or is dead after its last attempt."),
		age: prometheus.NewHistogramVec(nativeHistogram(prometheus.HistogramOpts{
			Name:    "norn_task_age_at_claim_seconds",
			Help:    "How long a task waited to be claimed: from its enqueue (or its not_before, if later) to the Claim that took it, on the node's clock.",
			Buckets: ageBuckets,
		}), []string{"queue"}),
	}
	wait := prometheus.NewHistogramVec(nativeHistogram(prometheus.HistogramOpts{
		Name:    "norn_claim_wait_seconds",
		Help:    "How long Claims made to this node took to answer their worker (a long poll's wait included), by result: tasks, or empty.",
		Buckets: waitBuckets,
	}), []string{"result"})
	reg.MustRegister(t.age, wait)
	t.wait[0] = wait.WithLabelValues("empty")
	t.wait[1] = wait.WithLabelValues("tasks")
	t.other = t.newSeries(OtherQueue)
	return t
}

func (t *Tasks) newSeries(label string) *queueSeries {
	return &queueSeries{label: label,
		enqueued: t.enqueued.WithLabelValues(label), claimed: t.claimed.WithLabelValues(label),
		renewed: t.renewed.WithLabelValues(label), completed: t.completed.WithLabelValues(label),
		aborted: t.aborted.WithLabelValues(label), cancelled: t.cancelled.WithLabelValues(label),
		expired: t.expired.WithLabelValues(label), failed: t.failed.WithLabelValues(label), age: t.age.WithLabelValues(label)}
}

// series returns queue's series: its own, or OtherQueue's.
func (t *Tasks) series(queue string) *queueSeries {
	if s, ok := t.queues.Load(queue); ok {
		return s.(*queueSeries)
	}
	if queue == "" {
		return t.other
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.queues.Load(queue); ok {
		return s.(*queueSeries)
	}
	s := t.other
	switch {
	case len(t.labels) < MaxQueueLabels && queue != OtherQueue:
		s = t.newSeries(queue)
		t.labels = append(t.labels, queue)
	case t.over >= maxOverflowNames:
		return s
	default:
		t.over++
	}
	t.queues.Store(queue, s)
	return s
}

// QueueLabel returns queue's label value (taking one of the
// MaxQueueLabels for it if some are left): queue, or OtherQueue.
func (t *Tasks) QueueLabel(queue string) string { return t.series(queue).label }

// QueueLabels returns the queue label values in use: the queues met with
// series of their own, sorted, then OtherQueue.
func (t *Tasks) QueueLabels() []string {
	t.mu.Lock()
	out := slices.Clone(t.labels)
	t.mu.Unlock()
	slices.Sort(out)
	return append(out, OtherQueue)
}

// Enqueued counts n tasks of queue enqueued.
func (t *Tasks) Enqueued(queue string, n int) { t.series(queue).enqueued.Add(float64(n)) }

// Claimed counts the tasks a Claim of queue handed out, their ages at
// now, and the Claim's wait.
func (t *Tasks) Claimed(queue string, tasks []*nornv1.ClaimedTask, now time.Time, waited time.Duration) {
	if len(tasks) == 0 {
		t.wait[0].Observe(waited.Seconds())
		return
	}
	t.wait[1].Observe(waited.Seconds())
	s := t.series(queue)
	s.claimed.Add(float64(len(tasks)))
	nowMs := now.UnixMilli()
	for _, ct := range tasks {
		s.age.Observe(float64(nowMs-claimableSince(ct.GetTask())) / 1e3)
	}
}

// claimableSince is when task became claimable (Unix ms): its creation,
// or its not_before when later.
func claimableSince(task *nornv1.Task) int64 {
	ms := task.GetCreatedAt().AsTime().UnixMilli()
	if nb := task.GetSpec().GetNotBefore(); nb != nil {
		ms = max(ms, nb.AsTime().UnixMilli())
	}
	return ms
}

// Renewed counts a claim of a task of queue renewed.
func (t *Tasks) Renewed(queue string) { t.series(queue).renewed.Inc() }

// Completed counts a task of queue completed.
func (t *Tasks) Completed(queue string) { t.series(queue).completed.Inc() }

// Aborted counts a task of queue aborted, by its worker or by the node
// (dispatch.Config.OnAborted).
func (t *Tasks) Aborted(queue string) { t.series(queue).aborted.Inc() }

// Cancelled counts a task of queue cancelled.
func (t *Tasks) Cancelled(queue string) { t.series(queue).cancelled.Inc() }

// Failed counts an attempt of a task of queue failed by its worker.
func (t *Tasks) Failed(queue string) { t.series(queue).failed.Inc() }

// Expired counts a claim of a task of queue expired
// (dispatch.Config.OnExpired).
func (t *Tasks) Expired(queue string) { t.series(queue).expired.Inc() }
