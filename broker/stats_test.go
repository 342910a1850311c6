package broker

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/store"
)

// StatsVia counts a cluster through the reader when the reader takes it,
// on the primary otherwise, and says which and how long each took.
func TestStatsViaCountsThroughTheReaderWhereItCan(t *testing.T) {
	f := setup(t, Config{})
	// The reader answers for c2 only, with a count the primaries do not
	// hold: what it answers is what is summed.
	read := func(_ context.Context, name string, _ time.Time) ([]store.QueueStats, bool) {
		if name != "c2" {
			return nil, false
		}
		return []store.QueueStats{{Topic: "t", Subscription: "s", Ready: 7, Dead: 2}}, true
	}
	st := f.b.StatsVia(context.Background(), read)
	if !slices.Equal(st.OnReplica, []string{"c2"}) || len(st.Missing) != 0 {
		t.Fatalf("on replicas %v, missing %v; want [c2], none", st.OnReplica, st.Missing)
	}
	if _, ok := st.Took["c1"]; !ok || len(st.Took) != 2 {
		t.Fatalf("took %v, want both clusters", st.Took)
	}
	var got store.QueueStats
	for _, s := range st.Subscriptions {
		if s.Topic == "t" && s.Subscription == "s" {
			got = s
		}
	}
	if got.Ready != 7 || got.Dead != 2 {
		t.Fatalf("t/s counted %+v, want the reader's 7 ready and 2 dead (c1's primary holds none)", got)
	}
	if n := f.c1.calls(cluster.OpStats); n != 1 {
		t.Fatalf("c1's primary counted %d times, want 1", n)
	}
	if n := f.c2.calls(cluster.OpStats); n != 0 {
		t.Fatalf("c2's primary counted %d times, want 0 (its replica did)", n)
	}

	// Stats alone never asks a reader: both primaries.
	if st := f.b.Stats(context.Background()); len(st.OnReplica) != 0 || f.c2.calls(cluster.OpStats) != 1 {
		t.Fatalf("Stats: on replicas %v, c2's primary counted %d times", st.OnReplica, f.c2.calls(cluster.OpStats))
	}
}
