package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
)

// With c1's primary killed, health tells the truth: /readyz stays 200
// (c2's vshards still serve) but says degraded and names c1; the admin
// topology names it and shows its primary unreachable; and every answer
// gathered from several clusters — the stats, the page's queue table,
// dead letters and their codes, a transaction's lookup, reconciliation —
// names c1 in missing_clusters instead of answering smaller numbers as
// if they were whole. Before the kill each carries missing_clusters: [].
func TestKilledPrimaryIsNamedMissing(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 2, NoReplicas: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	e := setupOn(t, own, func(c *Config) {
		fastHA(c)
		// The page's queue table serves the leading router's samples:
		// take them often, so that one misses c1 soon after the kill.
		c.Observe.QueueEvery = 100 * time.Millisecond
		c.UI.SampleEvery = time.Second
	})

	if st, body := e.do(t, "PUT", "/v1/topics/mc/subscriptions/default", map[string]any{"max_attempts": 1}); st/100 != 2 {
		t.Fatalf("put subscription: %d %v", st, body)
	}
	var msgs []any
	for _, k := range e.keysAlternating(t, "mc-", 6) {
		msgs = append(msgs, map[string]any{"key": k, "payload": 1, "transaction_id": "tx-mc"})
	}
	if st, _, out := e.post(t, "/v1/topics/mc/messages", map[string]any{"messages": msgs}); st != 200 {
		t.Fatalf("produce: %d %v", st, out)
	}
	var items []any
	for _, m := range e.claim(t, "mc", "default", map[string]any{"max": 10}) {
		items = append(items, map[string]any{"receipt": m["receipt"], "error_code": "E_MC"})
	}
	if st, _, out := e.post(t, "/v1/nack", map[string]any{"items": items}); st != 200 || len(items) != 6 {
		t.Fatalf("nack %d items: %d %v", len(items), st, out)
	}

	// Every answer that gathers from several clusters, and what it
	// answers as missing_clusters.
	gathered := []struct{ method, path string }{
		{"GET", "/v1/admin/stats"},
		{"GET", "/v1/admin/queues"},
		{"GET", "/v1/topics/mc/subscriptions/default/dead-letters"},
		{"GET", "/v1/topics/mc/subscriptions/default/dead-letters/codes"},
		{"GET", "/v1/topics/mc/subscriptions/default/consumers"},
		{"GET", "/v1/transactions/tx-mc"},
		{"POST", "/v1/admin/reconcile"},
		{"POST", "/v1/admin/reconcile/transactions"},
		{"GET", "/v1/admin/topology"},
		{"GET", "/readyz"},
	}
	// answers says which of them do not carry missing_clusters == want.
	answers := func(want string) string {
		var wrong []string
		for _, g := range gathered {
			var body any
			if g.method == "POST" {
				body = map[string]any{}
				if g.path == "/v1/admin/reconcile/transactions" {
					body = map[string]any{"transaction_ids": []string{"tx-mc"}}
				}
			}
			st, out := e.do(t, g.method, g.path, body)
			missing, ok := out["missing_clusters"]
			if st != 200 || !ok || fmt.Sprint(missing) != want {
				wrong = append(wrong, fmt.Sprintf("%s %s: %d, missing_clusters %v (present: %v): %v", g.method, g.path, st, missing, ok, out))
			}
		}
		return strings.Join(wrong, "\n")
	}
	if wrong := answers("[]"); wrong != "" {
		t.Fatalf("before the kill, want missing_clusters []:\n%s", wrong)
	}
	if _, ready := e.do(t, "GET", "/readyz", nil); ready["status"] != "ready" {
		t.Fatalf("readyz before the kill: %v", ready)
	}
	_, codes := e.do(t, "GET", "/v1/topics/mc/subscriptions/default/dead-letters/codes", nil)
	if codes["total"] != float64(6) {
		t.Fatalf("dead letters before the kill: %v", codes)
	}

	if err := own.Kill(own.Cluster("c1").Primary); err != nil {
		t.Fatal(err)
	}
	// The live checks (readiness, topology) know at once; the queue
	// table once a sample missed c1.
	testtime.UntilState(t, "every answer names c1 missing", func() (bool, string) {
		wrong := answers("[c1]")
		return wrong == "", wrong
	})
	if _, ready := e.do(t, "GET", "/readyz", nil); ready["status"] != "degraded" {
		t.Fatalf("readyz with c1 dead: %v", ready)
	}
	_, top := e.do(t, "GET", "/v1/admin/topology", nil)
	for _, c := range list(top["clusters"]) {
		p := list(c["endpoints"])[0]
		if want := map[string]string{"c1": "unreachable", "c2": "ok"}[c["name"].(string)]; p["health"] != want {
			t.Errorf("topology: %s's primary is %v, want %s", c["name"], p["health"], want)
		}
	}
	// c2's dead letters are still counted, and the answer says it lacks c1's.
	_, codes = e.do(t, "GET", "/v1/topics/mc/subscriptions/default/dead-letters/codes", nil)
	if codes["total"] != float64(3) {
		t.Errorf("dead letters with c1 dead: %v, want c2's 3", codes)
	}
	if _, tx := e.do(t, "GET", "/v1/transactions/tx-mc", nil); tx["complete"] != false || len(tx["messages"].([]any)) != 3 {
		t.Errorf("transaction with c1 dead: %v", tx)
	}
}
