package store

import (
	"context"
	"github.com/shardmq/shardmq/internal/testbed"
	"testing"
	"time"
)

// TestQueueStatsCountsAndOldestReady checks the queue-health count: every
// state per subscription, the oldest ready message, the hook that reports
// dead letters, and a plan that reads the live deliveries once.
func TestQueueStatsCountsAndOldestReady(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	var deadCounted int
	f.st.onDeliv = func(topic, sub, event string, n int) {
		if topic == "q" && sub == "a" && event == EventDeadLettered {
			deadCounted += n
		}
	}
	ctx := context.Background()
	var items []ProduceItem
	for _, k := range []string{"m1", "m2", "m3", "m4", "m5"} {
		items = append(items, f.item("q", k, `1`, "a", "b"))
	}
	items[4].AvailableAt = f.now.Add(time.Hour) // delayed
	if _, err := f.st.Produce(ctx, items); err != nil {
		t.Fatal(err)
	}
	got, err := f.st.Claim(ctx, ClaimRequest{Topic: "q", Subscription: "a", Consumer: "w", Max: 2, Lease: time.Minute, Token: 7,
		MaxAttempts: 1, Now: f.now})
	if err != nil || len(got) != 2 {
		t.Fatalf("claim: %v, %v", got, err)
	}
	policy := func(string, string) RetryPolicy { return RetryPolicy{MaxAttempts: 1} }
	res, err := f.st.Nack(ctx, []NackItem{{Lease: Lease{MessageID: got[1].Message.ID, Subscription: "a", Token: 7}, ErrorCode: "E"}},
		policy, func() float64 { return 0 }, f.now)
	if err != nil || res[0].Status != Dead {
		t.Fatalf("nack: %v, %v", res, err)
	}
	if deadCounted != 1 {
		t.Fatalf("OnDeliveries reported %d dead letters, want 1", deadCounted)
	}
	stats, err := f.st.Stats(ctx, f.now)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]QueueStats{
		"a": {Topic: "q", Subscription: "a", Ready: 2, Delayed: 1, InFlight: 1, Dead: 1, OldestReady: items[2].Msg.ID},
		"b": {Topic: "q", Subscription: "b", Ready: 4, Delayed: 1, OldestReady: items[0].Msg.ID},
	}
	if len(stats) != len(want) {
		t.Fatalf("stats = %+v", stats)
	}
	for _, s := range stats {
		if s != want[s.Subscription] {
			t.Errorf("stats of %s = %+v, want %+v", s.Subscription, s, want[s.Subscription])
		}
	}
	// One pass over the live deliveries (10 rows), in the table's order:
	// EXPLAIN is in the log for docs/operations.md.
	args := []any{f.now, f.now, f.now, f.now}
	for _, p := range explain(t, f.db, queueStatsQuery, args...) {
		t.Logf("plan: type=%s key=%s rows=%s extra=%s", p["type"], p["key"], p["rows"], p["Extra"])
		if k := p["key"]; k == "idx_order" || k == "idx_claim" {
			t.Errorf("the count walks %s (a lookup of each delivery from there), not the table", k)
		}
	}
	// The pass reads each delivery once and probes its subscription's row
	// of the temporary table once (a Handler_read_key each).
	if n := rowsRead(t, f.db, queueStatsQuery, args...); n > 3*10+4 {
		t.Errorf("the count read %d rows for 10 deliveries", n)
	}
}
