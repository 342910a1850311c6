package observe

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/store"
)

// Clusters times each cluster's hot operations — the group-commit produce
// transaction, the (coalesced) claim, ack, nack and extend — at the
// broker's side of broker.Store: one observation is one call, i.e. one
// transaction with its deadlock retries and its wait for a pooled
// connection and the breaker (the pool's own wait is PoolCollector's). A
// failed call counts in shardmq_cluster_op_errors_total as well.
type Clusters struct {
	dur  *prometheus.HistogramVec
	errs *prometheus.CounterVec

	mu      sync.Mutex
	wrapped map[clusterKey]*Cluster
}

type clusterKey struct {
	cluster string
	inner   broker.Store
}

// opBuckets span a fast commit on loopback (0.5ms) to a transaction that
// waited out a lock (10s+).
var opBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// NewClusters returns the timers, registered on reg.
func NewClusters(reg prometheus.Registerer) *Clusters {
	s := &Clusters{
		dur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shardmq_cluster_op_duration_seconds",
			Help:    "Time of one store operation on a cluster's primary (one transaction, retries and pool wait included), by operation: produce (a group commit), claim, ack, nack, extend.",
			Buckets: opBuckets}, []string{"cluster", "op"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_cluster_op_errors_total",
			Help: "Store operations on a cluster's primary that failed (nothing committed, or unknown), by operation."}, []string{"cluster", "op"}),
		wrapped: map[clusterKey]*Cluster{},
	}
	reg.MustRegister(s.dur, s.errs)
	return s
}

// Wrap returns inner timed as cluster's. The same inner store gets the
// same wrapper back, so the broker keeps a cluster's group committer
// across topology reloads that leave its connection alone.
func (s *Clusters) Wrap(cluster string, inner broker.Store) broker.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := clusterKey{cluster, inner}
	if w, ok := s.wrapped[k]; ok {
		return w
	}
	w := &Cluster{Store: inner, s: s, cluster: cluster}
	s.wrapped[k] = w
	for _, op := range []string{"produce", "claim", "ack", "nack", "extend"} {
		s.errs.WithLabelValues(cluster, op) // at zero from the start, so rates and alerts see it
	}
	return w
}

// Retain forgets the wrappers of stores no longer in use (after a
// topology change).
func (s *Clusters) Retain(inUse map[string]broker.Store) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.wrapped {
		if inUse[k.cluster] != k.inner {
			delete(s.wrapped, k)
		}
	}
}

// Cluster is one cluster's broker.Cluster, timed.
type Cluster struct {
	broker.Store
	s       *Clusters
	cluster string
}

var _ broker.Store = (*Cluster)(nil)

func (sh *Cluster) observe(op string, start time.Time, err error) {
	sh.s.dur.WithLabelValues(sh.cluster, op).Observe(time.Since(start).Seconds())
	if err != nil {
		sh.s.errs.WithLabelValues(sh.cluster, op).Inc()
	}
}

// Produce implements broker.Store.
func (sh *Cluster) Produce(ctx context.Context, items []store.ProduceItem) ([]store.ProduceResult, error) {
	start := time.Now()
	out, err := sh.Store.Produce(ctx, items)
	sh.observe("produce", start, err)
	return out, err
}

// Claim implements broker.Store.
func (sh *Cluster) Claim(ctx context.Context, req store.ClaimRequest) ([]store.Claimed, error) {
	start := time.Now()
	out, err := sh.Store.Claim(ctx, req)
	sh.observe("claim", start, err)
	return out, err
}

// ClaimMany implements broker.Store.
func (sh *Cluster) ClaimMany(ctx context.Context, reqs []store.ClaimRequest) ([][]store.Claimed, error) {
	start := time.Now()
	out, err := sh.Store.ClaimMany(ctx, reqs)
	sh.observe("claim", start, err)
	return out, err
}

// Ack implements broker.Store.
func (sh *Cluster) Ack(ctx context.Context, leases []store.Lease, now time.Time) ([]store.LeaseStatus, error) {
	start := time.Now()
	out, err := sh.Store.Ack(ctx, leases, now)
	sh.observe("ack", start, err)
	return out, err
}

// Nack implements broker.Store.
func (sh *Cluster) Nack(ctx context.Context, items []store.NackItem, policy func(topic, sub string) store.RetryPolicy, rnd func() float64, now time.Time) ([]store.NackResult, error) {
	start := time.Now()
	out, err := sh.Store.Nack(ctx, items, policy, rnd, now)
	sh.observe("nack", start, err)
	return out, err
}

// Extend implements broker.Store.
func (sh *Cluster) Extend(ctx context.Context, leases []store.Lease, lease time.Duration, now time.Time) ([]store.LeaseStatus, time.Time, error) {
	start := time.Now()
	out, exp, err := sh.Store.Extend(ctx, leases, lease, now)
	sh.observe("extend", start, err)
	return out, exp, err
}
