package server

import (
	"context"
	"sync"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/store"
)

// offPrimaryAfter is how long a cluster's last queue count may take
// before the next one reads a replica: a small backlog is counted on the
// primary, exactly and at once; a large one (a count of 700,000
// deliveries took 2 s of a primary's CPU on the test machine, every 20 s)
// on a replica within the read lag limit.
const offPrimaryAfter = 250 * time.Millisecond

// queueCounts is the queue-health job's source of counts: the broker's,
// each cluster read on a replica once its count grew costly
// (broker.StatsVia), on the primary when no replica is fit or the
// replica's count fails.
type queueCounts struct {
	b     *broker.Broker
	eps   *endpoints
	after time.Duration // offPrimaryAfter; tests move it

	mu   sync.Mutex
	took map[string]time.Duration // each cluster's last count, wherever it ran
}

func newQueueCounts(b *broker.Broker, eps *endpoints) *queueCounts {
	return &queueCounts{b: b, eps: eps, after: offPrimaryAfter, took: map[string]time.Duration{}}
}

// Stats implements observe.StatsSource.
func (q *queueCounts) Stats(ctx context.Context) broker.Stats {
	st := q.b.StatsVia(ctx, q.onReplica)
	q.mu.Lock()
	for name, d := range st.Took {
		q.took[name] = d
	}
	q.mu.Unlock()
	return st
}

// onReplica counts cluster on a replica fit for reads, once its last
// count took offPrimaryAfter or more.
func (q *queueCounts) onReplica(ctx context.Context, cluster string, now time.Time) ([]store.QueueStats, bool) {
	q.mu.Lock()
	costly := q.took[cluster] >= q.after
	q.mu.Unlock()
	if !costly {
		return nil, false
	}
	rep, ok := q.eps.monitor.Pick(cluster)
	if !ok {
		return nil, false
	}
	var st []store.QueueStats
	err := circuit.Endpoint[*store.Store]{S: rep.Store, Breaker: q.eps.breakers.For(rep.Endpoint)}.Do(ctx, func(ctx context.Context, s *store.Store) (err error) {
		st, err = s.Stats(ctx, now)
		return err
	})
	if err != nil {
		q.eps.log.Warn("queue count on a replica failed; counting on the primary", "cluster", cluster, "replica", rep.Endpoint, "err", err)
		return nil, false
	}
	return st, true
}
