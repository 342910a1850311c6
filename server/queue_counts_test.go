package server

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/replica"
	"github.com/shardmq/shardmq/store"
)

// Where the next count of a cluster runs, from what its last one said.
func TestQueueCountsCostly(t *testing.T) {
	const after = 250 * time.Millisecond
	for _, tc := range []struct {
		name string
		last *countState
		want bool
	}{
		{"never counted", nil, false},
		{"cheap on the primary", &countState{took: 100 * time.Millisecond}, false},
		{"costly on the primary", &countState{took: 300 * time.Millisecond}, true},
		{"at the line", &countState{took: after}, true},
		{"still costly on a replica", &countState{took: 200 * time.Millisecond, onReplica: true}, true},
		{"cheap on a replica: back to the primary", &countState{took: 100 * time.Millisecond, onReplica: true}, false},
		{"a replica failed a moment ago", &countState{took: time.Second, primaryTo: time.Unix(1000+60, 0)}, false},
		{"a replica failed long ago", &countState{took: time.Second, primaryTo: time.Unix(1000-1, 0)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &queueCounts{after: after, state: map[string]countState{}, now: func() time.Time { return time.Unix(1000, 0) }}
			if tc.last != nil {
				q.state["c1"] = *tc.last
			}
			if got := q.costly("c1"); got != tc.want {
				t.Fatalf("costly = %v, want %v", got, tc.want)
			}
			if q.costly("c2") {
				t.Fatal("a cluster never counted is costly")
			}
		})
	}
}

// On the test bed: a costly cluster is counted on its replica, a cheap one
// on its primary, and one whose replica count was cheap goes back to its
// primary; the replicas' counts are the primaries' once they caught up,
// and the router's gauge says how many clusters its last count read on a
// replica.
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
	q := e.r.counts
	q.after = time.Hour
	costly := func(names ...string) {
		q.mu.Lock()
		defer q.mu.Unlock()
		for _, n := range names {
			q.state[n] = countState{took: 2 * time.Hour}
		}
	}
	if st := q.Stats(t.Context()); ready(st) != 4 || len(st.OnReplica) != 0 || len(st.Missing) != 0 {
		t.Fatalf("cheap counts: ready %d, on replicas %v, missing %v; want 4 read on the primaries", ready(st), st.OnReplica, st.Missing)
	}

	// The second cluster's counts grew costly; the first's did not.
	second := bed.Clusters[1].Name
	var st broker.Stats
	testtime.WithinState(t, 30*time.Second, "a count on the second cluster's replica", func() (bool, string) {
		costly(second)
		st = q.Stats(t.Context())
		return slices.Equal(st.OnReplica, []string{second}) && ready(st) == 4, fmt.Sprintf("ready %d, on replicas %v", ready(st), st.OnReplica)
	})
	if len(st.Missing) != 0 {
		t.Fatalf("missing %v", st.Missing)
	}
	// That count was cheap: the next one is back on the primary.
	if st := q.Stats(t.Context()); ready(st) != 4 || len(st.OnReplica) != 0 {
		t.Fatalf("after a cheap count on the replica: ready %d, on replicas %v; want the primaries", ready(st), st.OnReplica)
	}

	// A replica that fails the count: counted on the primary, now and for
	// the pause after it.
	dead, err := store.Open(t.Context(), bed.Clusters[1].Replicas[0].DSN(e.name), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dead.Close()
	pick := q.pick
	q.pick = func(string) (replica.Replica, bool) { return replica.Replica{Endpoint: "closed", Store: dead}, true }
	costly(second)
	if st := q.Stats(t.Context()); ready(st) != 4 || len(st.OnReplica) != 0 || len(st.Missing) != 0 {
		t.Fatalf("replica failing: ready %d, on replicas %v, missing %v; want the primaries", ready(st), st.OnReplica, st.Missing)
	}
	q.mu.Lock()
	q.state[second] = countState{took: 2 * time.Hour, primaryTo: q.state[second].primaryTo}
	q.mu.Unlock()
	if q.costly(second) {
		t.Fatal("a cluster whose replica just failed a count goes back to a replica")
	}
	q.pick = pick
	q.mu.Lock()
	delete(q.state, second)
	q.mu.Unlock()

	// The router's own job, both clusters costly.
	all := make([]string, len(bed.Clusters))
	for i, c := range bed.Clusters {
		all[i] = c.Name
	}
	testtime.WithinState(t, 30*time.Second, "the router's count on every replica", func() (bool, string) {
		costly(all...)
		e.r.QueueHealth().Refresh(t.Context())
		v, ok := metricValue(t, e.r.Metrics(), "shardmq_queue_stats_replica_clusters", nil)
		return ok && v == float64(len(all)), fmt.Sprintf("gauge %v (exported %v)", v, ok)
	})
}
