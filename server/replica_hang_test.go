package server

import (
	"context"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
)

// A hung replica (SIGSTOP: its connections stay open, nothing answers):
// a trace read on it gives up after HA.ReplicaReadTimeout instead of the
// breakers' much longer CallTimeout, counts as a failure of the replica's
// breaker, and is answered from the primary; with the breaker open the
// next read goes to the primary without touching the replica. Without the
// bound the first read would wait the CallTimeout (10 minutes here) and
// the test's HTTP client gives up first.
func TestHungReplicaReadFallsBackAndOpensItsBreaker(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	e := setupOn(t, own, func(c *Config) {
		// One lag check at start and no more, so that the monitor keeps
		// offering the replica after it hangs: the read itself must find out.
		c.HA.Replicas.Every = time.Hour
		c.HA.Breakers.Failures = 1
		c.HA.Breakers.OpenFor = time.Hour
		c.HA.Breakers.CallTimeout = 10 * time.Minute
		c.HA.ReplicaReadTimeout = 500 * time.Millisecond
		c.HA.NoSchedule = true
	})
	replica := own.Clusters[0].Replicas[0]
	const topic = "hung-replica"
	if st, _, out := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": []any{msg("h-1", 1)}}); st != 200 {
		t.Fatalf("produce: %d %v", st, out)
	}
	e.traceFrom(t, "replica", topic, "h-1", "")
	if err := own.Suspend(replica); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Continue(replica) }) // before own.Stop (cleanups run last first)

	breaker := func() string {
		for _, s := range e.r.eps.breakers.States() {
			if s.Endpoint == replica.Addr() {
				return s.State
			}
		}
		return "none"
	}
	for i, wantBreaker := range []string{"open", "open"} {
		st, body := e.trace(t, topic, "h-1", "")
		if st != 200 || body["read_from"] != "primary" || body["fallback_reason"] != "replica_error" {
			t.Fatalf("read %d with the replica hung: %d read_from %v fallback %v (%v)", i+1, st, body["read_from"], body["fallback_reason"], body)
		}
		if got := breaker(); got != wantBreaker {
			t.Fatalf("after read %d the replica's breaker is %s, want %s", i+1, got, wantBreaker)
		}
	}
}
