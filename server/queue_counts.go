package server

import (
	"context"
	"sync"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/replica"
	"github.com/shardmq/shardmq/store"
)

// offPrimaryAfter is how long a cluster's last queue count may take
// before the next one reads a replica: a small backlog is counted on the
// primary, exactly and at once; a large one (a count of 700,000
// deliveries took 2 s of a primary's CPU on the test machine) on a
// replica within the read lag limit. A cluster counted on a replica goes
// back to its primary only once a count takes less than half of it, so
// that a count near the line does not alternate.
const offPrimaryAfter = 250 * time.Millisecond

// replicaCountTimeout bounds a count on a replica (a million live
// deliveries take about 6 s on the test machine). It leaves the primary
// the broker's own 5 s when the replica fails.
const replicaCountTimeout = 15 * time.Second

// replicaPause is how long a cluster whose replica failed a count is
// counted on its primary before a replica is tried again.
const replicaPause = 5 * time.Minute

// queueCounts is the queue-health job's source of counts: the broker's,
// each cluster read on a replica once its count grew costly
// (broker.StatsVia), on the primary when no replica is fit, and for
// replicaPause after a replica failed a count.
//
// A count on a replica does not go through the replica's breaker: the
// breaker guards the trace lookups' reads, and a count that outlasts its
// timeout on a large backlog says nothing about whether the replica
// answers them. Pick hands out only replicas the monitor saw healthy
// within its last checks.
type queueCounts struct {
	b     *broker.Broker
	pick  func(cluster string) (replica.Replica, bool)
	log   func(msg string, args ...any)
	now   func() time.Time
	after time.Duration // offPrimaryAfter; tests move it

	mu    sync.Mutex
	state map[string]countState
}

// countState is what the last count of a cluster said.
type countState struct {
	took      time.Duration // how long it took, wherever it ran
	onReplica bool          // it ran on a replica
	primaryTo time.Time     // a replica failed: the primary counts until then
}

func newQueueCounts(b *broker.Broker, eps *endpoints) *queueCounts {
	return &queueCounts{b: b, pick: eps.monitor.Pick, log: eps.log.Warn, now: time.Now, after: offPrimaryAfter, state: map[string]countState{}}
}

// Stats implements observe.StatsSource.
func (q *queueCounts) Stats(ctx context.Context) broker.Stats {
	st := q.b.StatsVia(ctx, q.onReplica)
	on := map[string]bool{}
	for _, name := range st.OnReplica {
		on[name] = true
	}
	q.mu.Lock()
	for name, d := range st.Took {
		s := q.state[name]
		s.took, s.onReplica = d, on[name]
		q.state[name] = s
	}
	for _, name := range st.Missing {
		s := q.state[name]
		s.took, s.onReplica = 0, false // the next count starts over, on the primary
		q.state[name] = s
	}
	q.mu.Unlock()
	return st
}

// costly says whether cluster's next count should read a replica.
func (q *queueCounts) costly(cluster string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.state[cluster]
	switch {
	case q.now().Before(s.primaryTo):
		return false
	case s.onReplica:
		return s.took >= q.after/2
	}
	return s.took >= q.after && s.took > 0
}

// onReplica counts cluster on a replica fit for reads when its counts
// are costly; false sends the count to the primary.
func (q *queueCounts) onReplica(ctx context.Context, cluster string, now time.Time) ([]store.QueueStats, bool) {
	if !q.costly(cluster) {
		return nil, false
	}
	rep, ok := q.pick(cluster)
	if !ok {
		return nil, false
	}
	rctx, cancel := context.WithTimeout(ctx, replicaCountTimeout)
	defer cancel()
	st, err := rep.Store.Stats(rctx, now)
	if err != nil && ctx.Err() != nil {
		return nil, false // the caller gave up: nothing said about the replica
	}
	if err != nil {
		q.log("queue count on a replica failed; counting on the primary", "cluster", cluster, "replica", rep.Endpoint, "err", err)
		q.mu.Lock()
		s := q.state[cluster]
		s.primaryTo = q.now().Add(replicaPause)
		q.state[cluster] = s
		q.mu.Unlock()
		return nil, false
	}
	return st, true
}
