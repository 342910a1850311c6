package observe

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/store"
)

// Shards times each cluster's hot operations — the group-commit produce
// transaction, the (coalesced) claim, ack, nack and extend — at the
// broker's side of broker.Shard: one observation is one call, i.e. one
// transaction with its deadlock retries and its wait for a pooled
// connection and the breaker (the pool's own wait is PoolCollector's). A
// failed call counts in shardmq_cluster_op_errors_total as well.
type Shards struct {
	dur  *prometheus.HistogramVec
	errs *prometheus.CounterVec

	mu      sync.Mutex
	wrapped map[shardKey]*Shard
}

type shardKey struct {
	cluster string
	inner   broker.Shard
}

// opBuckets span a fast commit on loopback (0.5ms) to a transaction that
// waited out a lock (10s+).
var opBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// NewShards returns the timers, registered on reg.
func NewShards(reg prometheus.Registerer) *Shards {
	s := &Shards{
		dur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shardmq_cluster_op_duration_seconds",
			Help:    "Time of one store operation on a cluster's primary (one transaction, retries and pool wait included), by operation: produce (a group commit), claim, ack, nack, extend.",
			Buckets: opBuckets}, []string{"cluster", "op"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_cluster_op_errors_total",
			Help: "Store operations on a cluster's primary that failed (nothing committed, or unknown), by operation."}, []string{"cluster", "op"}),
		wrapped: map[shardKey]*Shard{},
	}
	reg.MustRegister(s.dur, s.errs)
	return s
}

// Wrap returns inner timed as cluster's. The same inner shard gets the
// same wrapper back, so the broker keeps a cluster's group committer
// across topology reloads that leave its connection alone.
func (s *Shards) Wrap(cluster string, inner broker.Shard) broker.Shard {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := shardKey{cluster, inner}
	if w, ok := s.wrapped[k]; ok {
		return w
	}
	w := &Shard{Shard: inner, s: s, cluster: cluster}
	s.wrapped[k] = w
	for _, op := range []string{"produce", "claim", "ack", "nack", "extend"} {
		s.errs.WithLabelValues(cluster, op) // at zero from the start, so rates and alerts see it
	}
	return w
}

// Retain forgets the wrappers of shards no longer in use (after a
// topology change).
func (s *Shards) Retain(inUse map[string]broker.Shard) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.wrapped {
		if inUse[k.cluster] != k.inner {
			delete(s.wrapped, k)
		}
	}
}

// Shard is one cluster's broker.Shard, timed.
type Shard struct {
	broker.Shard
	s       *Shards
	cluster string
}

var _ broker.Shard = (*Shard)(nil)

func (sh *Shard) observe(op string, start time.Time, err error) {
	sh.s.dur.WithLabelValues(sh.cluster, op).Observe(time.Since(start).Seconds())
	if err != nil {
		sh.s.errs.WithLabelValues(sh.cluster, op).Inc()
	}
}

// Produce implements broker.Shard.
func (sh *Shard) Produce(ctx context.Context, items []store.ProduceItem) ([]store.ProduceResult, error) {
	start := time.Now()
	out, err := sh.Shard.Produce(ctx, items)
	sh.observe("produce", start, err)
	return out, err
}

// Claim implements broker.Shard.
func (sh *Shard) Claim(ctx context.Context, req store.ClaimRequest) ([]store.Claimed, error) {
	start := time.Now()
	out, err := sh.Shard.Claim(ctx, req)
	sh.observe("claim", start, err)
	return out, err
}

// ClaimMany implements broker.Shard.
func (sh *Shard) ClaimMany(ctx context.Context, reqs []store.ClaimRequest) ([][]store.Claimed, error) {
	start := time.Now()
	out, err := sh.Shard.ClaimMany(ctx, reqs)
	sh.observe("claim", start, err)
	return out, err
}

// Ack implements broker.Shard.
func (sh *Shard) Ack(ctx context.Context, leases []store.Lease, now time.Time) ([]store.LeaseStatus, error) {
	start := time.Now()
	out, err := sh.Shard.Ack(ctx, leases, now)
	sh.observe("ack", start, err)
	return out, err
}

// AckMany implements broker.Shard.
func (sh *Shard) AckMany(ctx context.Context, groups []store.AckGroup, now time.Time) []store.AckResult {
	start := time.Now()
	out := sh.Shard.AckMany(ctx, groups, now)
	var err error
	for _, r := range out {
		if r.Err != nil {
			err = r.Err
			break
		}
	}
	sh.observe("ack", start, err)
	return out
}

// Nack implements broker.Shard.
func (sh *Shard) Nack(ctx context.Context, items []store.NackItem, policy func(topic, sub string) store.RetryPolicy, rnd func() float64, now time.Time) ([]store.NackResult, error) {
	start := time.Now()
	out, err := sh.Shard.Nack(ctx, items, policy, rnd, now)
	sh.observe("nack", start, err)
	return out, err
}

// Extend implements broker.Shard.
func (sh *Shard) Extend(ctx context.Context, leases []store.Lease, lease time.Duration, now time.Time) ([]store.LeaseStatus, time.Time, error) {
	start := time.Now()
	out, exp, err := sh.Shard.Extend(ctx, leases, lease, now)
	sh.observe("extend", start, err)
	return out, exp, err
}
