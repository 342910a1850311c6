package api

import (
	"fmt"
	"strings"
	"testing"
)

// Deleting chosen dead letters: the ids reach the broker parsed; no ids,
// a malformed id or more ids than a batch are refused before it.
func TestDeleteDeadChecksItsIDs(t *testing.T) {
	t.Parallel()
	s, b := newTestServer(t)
	const path = "/v1/topics/orders/subscriptions/billing/dead-letters/delete"
	rec := do(s, "POST", path, []byte(`{"ids":["12","7"]}`))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"deleted":0`) {
		t.Fatalf("delete: %d %s", rec.Code, rec.Body)
	}
	calls := b.taken()
	if len(calls) != 1 || calls[0].op != "delete_dead" || fmt.Sprint(calls[0].args) != "[orders billing [12 7]]" {
		t.Fatalf("broker calls %+v", calls)
	}
	many := `{"ids":[` + strings.TrimSuffix(strings.Repeat(`"1",`, 1001), ",") + `]}`
	for body, status := range map[string]int{`{"ids":[]}`: 400, `{}`: 400, `{"ids":["x"]}`: 400, `{"ids":["0"]}`: 400,
		`{"ids":["1"],"all":true}`: 400, many: 413} {
		if rec := do(s, "POST", path, []byte(body)); rec.Code != status {
			t.Errorf("%.40s: %d %s, want %d", body, rec.Code, rec.Body, status)
		}
	}
	if calls := b.taken(); len(calls) != 0 {
		t.Fatalf("a refused delete reached the broker: %+v", calls)
	}
}

// The trace by query carries keys that a path cannot ("." and ".."), and
// the same checks as the path form.
func TestTraceByQueryTakesDotKeys(t *testing.T) {
	t.Parallel()
	s, b := newTestServer(t)
	for _, key := range []string{".", "..", "a/b"} {
		rec := do(s, "GET", "/v1/messages/trace?topic=orders&key="+strings.ReplaceAll(key, "/", "%2F"), nil)
		if rec.Code != 404 {
			t.Fatalf("%q: %d %s", key, rec.Code, rec.Body)
		}
		if calls := b.taken(); len(calls) != 1 || calls[0].op != "trace" || calls[0].args[1] != key {
			t.Fatalf("%q: broker calls %+v", key, calls)
		}
	}
	for _, q := range []string{"topic=orders", "key=.", "key=.&topic=orders&cursor=1"} {
		if rec := do(s, "GET", "/v1/messages/trace?"+q, nil); rec.Code != 400 {
			t.Errorf("%s: %d %s", q, rec.Code, rec.Body)
		}
	}
}
