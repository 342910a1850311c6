package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
)

// The queue-health count reads a replica once a cluster's count grew
// costly, and the primary while it is cheap; the replicas' counts are the
// primaries' once they caught up.
func TestQueueCountsReadAReplicaOnceCostly(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, func(c *Config) {
		fastHA(c)
		c.Observe.QueueEvery = time.Hour // counted here, not by the job
	})
	const topic = "qc.replica"
	var msgs []any
	for i := range 4 {
		msgs = append(msgs, msg(fmt.Sprintf("k%d", i), i))
	}
	if st, _, body := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs}); st != 200 {
		t.Fatalf("produce: %d %v", st, body)
	}
	ready := func(st broker.Stats) int64 {
		for _, s := range st.Subscriptions {
			if s.Topic == topic && s.Subscription == "default" {
				return s.Ready
			}
		}
		return -1
	}

	qc := newQueueCounts(e.r.broker, e.r.eps)
	if st := qc.Stats(t.Context()); ready(st) != 4 || len(st.OnReplica) != 0 || len(st.Missing) != 0 {
		t.Fatalf("cheap count: ready %d, on replicas %v, missing %v; want 4 read on the primaries", ready(st), st.OnReplica, st.Missing)
	}
	qc.after = 0 // every count is costly
	var st broker.Stats
	testtime.WithinState(t, 30*time.Second, "a count on both replicas", func() (bool, string) {
		st = qc.Stats(t.Context())
		return len(st.OnReplica) == len(bed.Clusters) && ready(st) == 4, fmt.Sprintf("ready %d, on replicas %v", ready(st), st.OnReplica)
	})
	if len(st.Missing) != 0 {
		t.Fatalf("missing %v", st.Missing)
	}
	e.r.QueueHealth().Refresh(t.Context())
	expectGauge(t, e, "shardmq_queue_stats_replica_clusters", nil, 0) // the router's own job: cheap counts, on the primaries
	qc.after = time.Hour
	if st := qc.Stats(t.Context()); ready(st) != 4 || len(st.OnReplica) != 0 {
		t.Fatalf("cheap again: ready %d, on replicas %v", ready(st), st.OnReplica)
	}
}

func expectGauge(t *testing.T, e *env, name string, labels map[string]string, want float64) {
	t.Helper()
	if got, ok := metricValue(t, e.r.Metrics(), name, labels); !ok || got != want {
		t.Fatalf("%s%v = %v (exported: %v), want %v", name, labels, got, ok, want)
	}
}
