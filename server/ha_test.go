package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/shard"
)

// fastHA makes replica lag and breakers react within a test's patience.
func fastHA(c *Config) {
	c.HA.Replicas.Every = 50 * time.Millisecond
	c.HA.Replicas.MaxLag = 2 * time.Second
	c.HA.Breakers.OpenFor = 300 * time.Millisecond
	c.HA.Breakers.Failures = 3
	c.HA.NoSchedule = true
}

func (e *env) trace(t *testing.T, topic, key, orderKey string) (int, map[string]any) {
	t.Helper()
	q := url.Values{"topic": {topic}}
	if orderKey != "" {
		q.Set("order_key", orderKey)
	}
	return e.do(t, "GET", "/v1/messages/"+url.PathEscape(key)+"/trace?"+q.Encode(), nil)
}

// traceFrom polls the trace of key until it is read from want (and, when
// status is set, shows the message with that status: a replica may lag).
func (e *env) traceFrom(t *testing.T, want, topic, key, orderKey string, status ...string) map[string]any {
	t.Helper()
	var body map[string]any
	waitFor(t, 10*time.Second, func() bool {
		var st int
		st, body = e.trace(t, topic, key, orderKey)
		if st != 200 || body["read_from"] != want {
			return false
		}
		return len(status) == 0 || body["message"].(map[string]any)["status"] == status[0]
	})
	return body
}

func eventTypes(body map[string]any) []string {
	var out []string
	for _, ev := range body["events"].([]any) {
		out = append(out, ev.(map[string]any)["type"].(string))
	}
	return out
}

func TestTraceFromReplicaAndLookups(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, fastHA)
	_, _, body := e.post(t, "/v1/topics/tr/messages", map[string]any{"messages": []any{
		map[string]any{"key": "pay-1", "order_key": "order-1", "payload": map[string]any{"a": 1}, "headers": map[string]string{"h": "v"}, "transaction_id": "tx-9"},
		map[string]any{"key": "pay-2", "payload": 2, "transaction_id": "tx-9"},
	}})
	for _, r := range results(t, body) {
		if r["status"] != "created" {
			t.Fatalf("produce: %v", r)
		}
	}
	got := e.claim(t, "tr", "default", map[string]any{"max": 10, "consumer": "w7"})
	for _, m := range got {
		if m["key"] == "pay-1" {
			e.ack(t, m)
		}
	}
	tr := e.traceFrom(t, "replica", "tr", "pay-1", "order-1", "consumed")
	m := tr["message"].(map[string]any)
	if m["status"] != "consumed" || m["transaction_id"] != "tx-9" || m["order_key"] != "order-1" ||
		int(m["vshard"].(float64)) != int(shard.Of("order-1")) || m["headers"].(map[string]any)["h"] != "v" {
		t.Fatalf("message = %v", m)
	}
	if _, ok := tr["replica_lag_ms"].(float64); !ok {
		t.Fatalf("no replica_lag_ms in %v", tr)
	}
	d := tr["deliveries"].([]any)
	if len(d) != 1 || d[0].(map[string]any)["state"] != "done" || d[0].(map[string]any)["consumer"] != "w7" {
		t.Fatalf("deliveries = %v", d)
	}
	if ev := fmt.Sprint(eventTypes(tr)); ev != "[produced claimed acked]" {
		t.Fatalf("events = %s", ev)
	}
	tr2 := e.traceFrom(t, "replica", "tr", "pay-2", "")
	if d := tr2["deliveries"].([]any); d[0].(map[string]any)["state"] != "in_flight" {
		t.Fatalf("pay-2 deliveries = %v", d)
	}
	if st, body := e.trace(t, "tr", "nope", ""); st != 404 || body["error"].(map[string]any)["code"] != "not_found" {
		t.Fatalf("unknown key: %d %v", st, body)
	}
	if st, _ := e.trace(t, "bad topic", "pay-1", ""); st != 400 {
		t.Fatalf("bad topic: %d", st)
	}

	st, txs := e.do(t, "GET", "/v1/transactions/tx-9", nil)
	if st != 200 || len(txs["messages"].([]any)) != 2 || txs["complete"] != true || len(txs["unanswered_clusters"].([]any)) != 0 {
		t.Fatalf("transaction lookup: %d %v", st, txs)
	}
	if st, none := e.do(t, "GET", "/v1/transactions/tx-none", nil); st != 200 || len(none["messages"].([]any)) != 0 {
		t.Fatalf("unknown transaction: %d %v", st, none)
	}

	// Both replicas serve reads (under load they may lag for a moment).
	waitFor(t, 10*time.Second, func() bool {
		st, top := e.do(t, "GET", "/v1/admin/topology", nil)
		clusters, _ := top["clusters"].([]any)
		if st != 200 || len(clusters) != 2 {
			t.Fatalf("topology: %d %v", st, top)
		}
		for _, c := range clusters {
			eps := c.(map[string]any)["endpoints"].([]any)
			p, r := eps[0].(map[string]any), eps[1].(map[string]any)
			if p["role"] != "primary" || p["breaker"] != "closed" || p["health"] != "ok" || r["role"] != "replica" {
				t.Fatalf("cluster %v", c)
			}
			if r["serves_reads"] != true || r["lag_ms"].(float64) < 0 {
				return false
			}
		}
		return true
	})
	resp, err := http.Get(e.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"shardmq_replica_lag_seconds{", "shardmq_replica_serves_reads{", "shardmq_breaker_state{", "shardmq_primary_heartbeat_ok{"} {
		if !strings.Contains(string(metrics), want) {
			t.Fatalf("/metrics lacks %s:\n%s", want, metrics)
		}
	}
}

// Lag simulated by stopping the replica's SQL thread: reads fall back to
// the primary (new rows and, once the replica is disqualified, old ones),
// and come back to the replica when it catches up.
func TestTraceFallsBackWhenReplicaStops(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	e := setupOn(t, own, fastHA)
	rep := own.Clusters[0].Replicas[0]
	produce := func(key string) {
		_, _, body := e.post(t, "/v1/topics/lag/messages", map[string]any{"messages": []any{msg(key, 1)}})
		if r := results(t, body)[0]; r["status"] != "created" {
			t.Fatalf("produce %s: %v", key, r)
		}
	}
	produce("old")
	e.traceFrom(t, "replica", "lag", "old", "")

	if err := own.StopReplication(ctx, rep); err != nil {
		t.Fatal(err)
	}
	produce("new")
	_, body := e.trace(t, "lag", "new", "")
	if body["read_from"] != "primary" {
		t.Fatalf("trace of a row the stopped replica lacks: %v", body)
	}
	old := e.traceFrom(t, "primary", "lag", "old", "")
	if old["fallback_reason"] != "no_replica_within_lag" {
		t.Fatalf("fallback = %v", old["fallback_reason"])
	}
	_, top := e.do(t, "GET", "/v1/admin/topology", nil)
	r := top["clusters"].([]any)[0].(map[string]any)["endpoints"].([]any)[1].(map[string]any)
	if r["serves_reads"] != false || r["sql_running"] != false || r["health"] != "replication_stopped" {
		t.Fatalf("stopped replica in topology: %v", r)
	}

	if err := own.StartReplication(ctx, rep); err != nil {
		t.Fatal(err)
	}
	e.traceFrom(t, "replica", "lag", "new", "")
}

func TestReconcileRepairsAndReportsMissingTransactions(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, fastHA)
	var batch []any
	for i := 0; i < 6; i++ {
		batch = append(batch, map[string]any{"key": fmt.Sprint("rc-", i), "payload": i, "transaction_id": fmt.Sprint("tx-", i)})
	}
	_, _, body := e.post(t, "/v1/topics/rec/messages", map[string]any{"messages": batch})
	for _, r := range results(t, body) {
		if r["status"] != "created" {
			t.Fatalf("produce: %v", r)
		}
	}
	for _, m := range e.claim(t, "rec", "default", map[string]any{"max": 10}) {
		if m["key"] == "rc-0" {
			e.ack(t, m)
		}
	}
	// Corrupt: rc-0 (acked) flipped back to pending; rc-1's delivery lost.
	for _, db := range e.dbs {
		for _, q := range []string{
			"UPDATE message_store SET msg_status = 0 WHERE msg_key = 'rc-0'",
			"DELETE FROM message_queue WHERE message_id IN (SELECT id FROM message_store WHERE msg_key = 'rc-1')",
		} {
			if _, err := db.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	// The walk reads replicas: let them see the damage.
	if err := testbed.WaitReplicated(context.Background(), bed); err != nil {
		t.Fatal(err)
	}
	st, rep := e.do(t, "POST", "/v1/admin/reconcile", map[string]any{"transaction_ids": []string{"tx-0", "tx-5", "tx-lost"}})
	if st != 200 {
		t.Fatalf("reconcile: %d %v", st, rep)
	}
	found, repaired := rep["found"].(map[string]any), rep["repaired"].(map[string]any)
	if rep["scanned"].(float64) != 6 || found["status_mismatch"] != 1.0 || found["missing_delivery"] != 1.0 ||
		repaired["status_mismatch"] != 1.0 || repaired["missing_delivery"] != 1.0 || len(rep["failed_clusters"].([]any)) != 0 {
		t.Fatalf("report: %v", rep)
	}
	txs := rep["transactions"].(map[string]any)
	if fmt.Sprint(txs["missing"]) != "[tx-lost]" || txs["complete"] != true {
		t.Fatalf("transactions: %v", txs)
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_store WHERE msg_key = 'rc-0' AND msg_status = 1")); n != 1 {
		t.Fatal("rc-0 not consumed again")
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_queue q JOIN message_store s ON s.id = q.message_id WHERE s.msg_key = 'rc-1'")); n != 1 {
		t.Fatal("rc-1's delivery not re-created")
	}
	if err := testbed.WaitReplicated(context.Background(), bed); err != nil {
		t.Fatal(err)
	}
	if _, again := e.do(t, "POST", "/v1/admin/reconcile", map[string]any{"dry_run": true}); len(again["found"].(map[string]any)) != 0 {
		t.Fatalf("second run still finds %v", again["found"])
	}
	if st, last := e.do(t, "GET", "/v1/admin/reconcile", nil); st != 200 || last["dry_run"] != true {
		t.Fatalf("last report: %d %v", st, last)
	}
	st, miss := e.do(t, "POST", "/v1/admin/reconcile/transactions", map[string]any{"transaction_ids": []string{"tx-3", "nope"}})
	if st != 200 || fmt.Sprint(miss["missing"]) != "[nope]" {
		t.Fatalf("missing transactions: %d %v", st, miss)
	}
}
