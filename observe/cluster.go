package observe

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/cluster"
)

// Clusters times every store operation on a cluster's primary at the
// router's side of the cluster's call point (cluster.Primary): one
// observation is one call, i.e. one transaction with its deadlock retries
// and its wait for a pooled connection and the breaker (the pool's own
// wait is PoolCollector's). A failed call counts in
// shardmq_cluster_op_errors_total as well.
type Clusters struct {
	dur  *prometheus.HistogramVec
	errs *prometheus.CounterVec
}

// opBuckets span a fast commit on loopback (0.5ms) to a transaction that
// waited out a lock (10s+).
var opBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// hotOps are the operations whose error counters exist from a cluster's
// first call on, at zero, so that rates and alerts see them.
var hotOps = []string{cluster.OpProduce, cluster.OpClaim, cluster.OpAck, cluster.OpNack, cluster.OpExtend}

// NewClusters returns the timers, registered on reg.
func NewClusters(reg prometheus.Registerer) *Clusters {
	s := &Clusters{
		dur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shardmq_cluster_op_duration_seconds",
			Help:    "Time of one store operation on a cluster's primary (one transaction, retries, breaker and pool wait included), by operation: produce (a group commit), claim (a coalesced claim), ack, nack, extend, and the rarer release, list_dead, redrive, purge_dead, count_dead, dead_by_code, archive_dead, drop_subscription, unpark, stats, append_events.",
			Buckets: opBuckets}, []string{"cluster", "op"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_cluster_op_errors_total",
			Help: "Store operations on a cluster's primary that failed (nothing committed, or unknown), by operation."}, []string{"cluster", "op"}),
	}
	reg.MustRegister(s.dur, s.errs)
	return s
}

// For returns the observer of cluster's calls (cluster.Observer's shape).
func (s *Clusters) For(cluster string) func(op string, took time.Duration, err error) {
	for _, op := range hotOps {
		s.errs.WithLabelValues(cluster, op)
	}
	return func(op string, took time.Duration, err error) {
		s.dur.WithLabelValues(cluster, op).Observe(took.Seconds())
		if err != nil {
			s.errs.WithLabelValues(cluster, op).Inc()
		}
	}
}
