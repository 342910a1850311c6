package server

import (
	"github.com/shardmq/shardmq/internal/testbed"
	"slices"
	"testing"
	"time"
)

// A duplicate and a conflicting produce show in the message's trace,
// whether the database decided them (recent-keys cache off) or the
// router's recent-keys cache answered them (written in batches after the
// answer, counted in RejectedTraceStats).
func TestTraceShowsDuplicateAndConflict(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	for _, tc := range []struct {
		name       string
		recentKeys int
		fromCache  bool
	}{
		{"database decides", -1, false},
		{"recent-keys cache answers", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setupOn(t, bed, func(c *Config) { c.Broker.RecentKeys = tc.recentKeys })
			const topic = "trace-rejected"
			produce := func(payload any, want string) {
				t.Helper()
				st, _, out := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": []any{msg("pay-1", payload)}})
				if r := results(t, out)[0]; st != 200 || r["status"] != want {
					t.Fatalf("produce: %d %v, want %s", st, r, want)
				}
			}
			produce(map[string]any{"amount": 1}, "created")
			produce(map[string]any{"amount": 1}, "duplicate")
			produce(map[string]any{"amount": 2}, "conflict")
			var events []any
			waitFor(t, 10*time.Second, func() bool {
				st, body := e.trace(t, topic, "pay-1", "")
				if st != 200 {
					return false
				}
				events = body["events"].([]any)
				return slices.Equal(eventTypes(body), []string{"produced", "duplicate", "conflict"})
			})
			conflict := events[2].(map[string]any)
			if conflict["error_code"] != "payload_differs" || conflict["error"] == nil {
				t.Errorf("conflict event %v does not say what differed", conflict)
			}
			st := e.r.broker.RejectedTraceStats()
			if tc.fromCache && st.Written != 2 || !tc.fromCache && st.Written != 0 || st.Dropped != 0 {
				t.Errorf("cache-answered events: %+v", st)
			}
		})
	}
}
