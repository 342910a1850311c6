package server

import (
	"github.com/shardmq/shardmq/internal/testbed"
	"slices"
	"strings"
	"testing"
	"time"
)

// Deleting a subscription with pending deliveries: the trace of each
// message says why it is settled — a dropped event per delivery, naming
// the subscription and the error code subscription_deleted — and the
// deleted subscription's delivery is no longer listed. A message another
// subscription acked shows both.
func TestTraceOfDeletedSubscriptionSaysDropped(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	const topic = "trace-dropped"
	for _, sub := range []string{"billing", "audit"} {
		if st, body := e.do(t, "PUT", "/v1/topics/"+topic+"/subscriptions/"+sub, map[string]any{"max_attempts": 3}); st != 200 && st != 201 {
			t.Fatalf("PUT %s: %d %v", sub, st, body)
		}
	}
	st, _, out := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": []any{msg("d-ready", 1), msg("d-acked", 2)}})
	if st != 200 {
		t.Fatalf("produce: %d %v", st, out)
	}
	// audit consumes d-acked only; d-ready stays pending for audit.
	var receipt string
	waitFor(t, 10*time.Second, func() bool {
		_, _, out := e.post(t, "/v1/topics/"+topic+"/subscriptions/audit/claim", map[string]any{"max": 10, "visibility_timeout_ms": 60000})
		for _, m := range out["messages"].([]any) {
			m := m.(map[string]any)
			if m["key"] == "d-acked" {
				receipt = m["receipt"].(string)
			}
		}
		return receipt != ""
	})
	if _, _, out := e.post(t, "/v1/ack", map[string]any{"receipts": []string{receipt}}); results(t, out)[0]["status"] != "ok" {
		t.Fatalf("ack: %v", out)
	}
	for _, sub := range []string{"billing", "audit"} {
		if st, body := e.do(t, "DELETE", "/v1/topics/"+topic+"/subscriptions/"+sub, nil); st != 200 {
			t.Fatalf("DELETE %s: %d %v", sub, st, body)
		}
	}
	for _, tc := range []struct {
		key         string
		wantDropped []string
		wantLive    []string
	}{
		// d-ready may be leased by audit (the claim above can take it
		// too) but was never acked.
		{"d-ready", []string{"audit", "billing"}, nil},
		{"d-acked", []string{"billing"}, []string{"audit"}},
	} {
		var body map[string]any
		waitFor(t, 10*time.Second, func() bool {
			var st int
			st, body = e.trace(t, topic, tc.key, "")
			return st == 200 && body["message"].(map[string]any)["status"] == "consumed" && slices.Contains(eventTypes(body), "dropped")
		})
		var dropped []string
		for _, ev := range body["events"].([]any) {
			ev := ev.(map[string]any)
			if ev["type"] != "dropped" {
				continue
			}
			dropped = append(dropped, ev["subscription"].(string))
			if ev["error_code"] != "subscription_deleted" || !strings.Contains(ev["error"].(string), "subscription deleted") {
				t.Errorf("%s: dropped event %v does not say why", tc.key, ev)
			}
		}
		slices.Sort(dropped)
		if !slices.Equal(dropped, tc.wantDropped) {
			t.Errorf("%s: dropped for %v, want %v (events %v)", tc.key, dropped, tc.wantDropped, body["events"])
		}
		var listed []string
		for _, d := range body["deliveries"].([]any) {
			d := d.(map[string]any)
			listed = append(listed, d["subscription"].(string))
			if d["state"] != "done" {
				t.Errorf("%s: delivery %v, want only done ones", tc.key, d)
			}
		}
		if !slices.Equal(listed, tc.wantLive) {
			t.Errorf("%s: deliveries of %v, want %v", tc.key, listed, tc.wantLive)
		}
	}
}
