package server

import (
	"encoding/json"
	"net/url"
	"testing"

	"github.com/shardmq/shardmq/internal/testbed"
)

// A message handed out from the router's memory (it produced it, so its
// owner kept the body) reads exactly as the table has it: every field of
// the claim's message equals the trace's, which is read from the table.
// Then the same messages through a router that keeps no bodies.
func TestClaimedFromMemoryAsFromTable(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	for _, tc := range []struct {
		name   string
		bytes  int
		memory bool
	}{{"bodies kept", 0, true}, {"no body cache", -1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := setupOn(t, bed, func(c *Config) { c.Broker.BodyCacheBytes = tc.bytes })
			msgs := []any{
				map[string]any{"key": "json", "payload": map[string]any{"a": []any{1, "x", nil}, "b": "é\u2028<"}},
				map[string]any{"key": "bin", "payload_base64": "AAEC/w==", "priority": 7},
				map[string]any{"key": "headers", "payload": "s", "headers": map[string]any{"h1": "v1", "x-y": ""}, "transaction_id": "tx-1"},
				map[string]any{"key": "ordered", "payload": 12.5, "order_key": "acct-9"},
				map[string]any{"key": "empty", "payload_base64": ""},
				map[string]any{"key": "k\u00e9y/with%odd chars", "payload": true},
			}
			st, _, body := e.post(t, "/v1/topics/mem/messages", map[string]any{"messages": msgs})
			if st != 200 {
				t.Fatalf("produce: %d %v", st, body)
			}
			for _, r := range results(t, body) {
				if r["status"] != "created" {
					t.Fatalf("produce: %v", r)
				}
			}
			got := e.claim(t, "mem", "default", map[string]any{"max": 100, "consumer": "c"})
			if len(got) != len(msgs) {
				t.Fatalf("claimed %d of %d", len(got), len(msgs))
			}
			for _, m := range got {
				key := m["key"].(string)
				st, tr := e.do(t, "GET", "/v1/messages/"+url.PathEscape(key)+"/trace?topic=mem", nil)
				if st != 200 {
					t.Fatalf("trace of %q: %d %v", key, st, tr)
				}
				want := tr["message"].(map[string]any)
				for _, f := range []string{"id", "key", "topic", "vshard", "payload", "payload_base64", "headers", "priority", "order_key", "transaction_id", "produced_at"} {
					if a, b := jsonText(t, m[f]), jsonText(t, want[f]); a != b {
						t.Errorf("%q: claim's %s is %s, the table's %s", key, f, a, b)
					}
				}
			}
			if s := e.r.broker.Owners().BodiesStats(); (s.Hits > 0) != tc.memory || (tc.memory && s.Misses > 0) {
				t.Fatalf("body cache %+v", s)
			}
			e.ack(t, got...)
			if s := e.r.broker.Owners().BodiesStats(); tc.memory && s.Messages != 0 {
				t.Fatalf("acked bodies still kept: %+v", s)
			}
		})
	}
}

// jsonText is v as canonical JSON text, for comparing decoded values.
func jsonText(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
