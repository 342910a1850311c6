package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
)

// A replicated produce whose replica is stopped answers unavailable; its
// replicated retry answers unavailable again — a duplicate answer would
// claim a replica has the message — and says so, without storing it
// twice; once the replica applies it, the retry answers duplicate with the
// original id.
func TestReplicatedRetryWaitsForTheReplicaAgain(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	e := setupOn(t, own, func(c *Config) { c.Broker.ReplicatedTimeout = 300 * time.Millisecond })
	replica := own.Clusters[0].Replicas[0]
	if err := own.StopReplication(ctx, replica); err != nil {
		t.Fatal(err)
	}
	body := map[string]any{"messages": []any{msg("pay-9", map[string]any{"amount": "9.00"})}, "durability": "replicated"}
	const promise = "answers duplicate once a replica has applied it"
	var id any
	for attempt := 1; attempt <= 2; attempt++ {
		st, hdr, out := e.post(t, "/v1/topics/payments/messages", body)
		r := results(t, out)[0]
		if st != 200 || r["status"] != "unavailable" || hdr.Get("Retry-After") == "" {
			t.Fatalf("attempt %d with the replica stopped: %d %v, want unavailable with Retry-After", attempt, st, r)
		}
		msgErr, _ := r["error"].(map[string]any)
		if text, _ := msgErr["message"].(string); !strings.Contains(text, promise) || !strings.Contains(text, "committed on the primary") {
			t.Fatalf("attempt %d: error %v does not say what a retry answers", attempt, r["error"])
		}
		if n := total(e.count(t, "SELECT COUNT(*) FROM message_store")); n != 1 {
			t.Fatalf("attempt %d: %d messages stored, want 1", attempt, n)
		}
		if attempt == 1 {
			id = r["id"]
		}
	}
	if err := own.StartReplication(ctx, replica); err != nil {
		t.Fatal(err)
	}
	st, _, out := e.post(t, "/v1/topics/payments/messages", body)
	if r := results(t, out)[0]; st != 200 || r["status"] != "duplicate" || r["id"] != id {
		t.Fatalf("retry once the replica runs: %d %v, want duplicate of %v", st, r, id)
	}
}
