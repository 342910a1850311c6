package server

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
)

// metricValue sums the series of name whose labels include want: a
// counter's or gauge's value, a histogram's sample count. ok is false when
// no series matches.
func metricValue(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) (v float64, ok bool) {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, w := range want {
				if have[k] != w {
					continue series
				}
			}
			ok = true
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				v += m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v += m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				v += float64(m.GetHistogram().GetSampleCount())
			default:
				v += m.GetUntyped().GetValue()
			}
		}
	}
	return v, ok
}

// postID posts body with an X-Request-Id header (none when id is "") and
// returns the status, the id the router echoed and the decoded answer.
func (e *env) postID(t *testing.T, path, id string, body any) (int, string, map[string]any) {
	t.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", e.url+path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	if id != "" {
		req.Header.Set("X-Request-Id", id)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("POST %s: %d %q", path, resp.StatusCode, raw)
	}
	return resp.StatusCode, resp.Header.Get("X-Request-Id"), out
}

// TestMetricsFollowTheMessageFlow drives produce, claim, ack, nack, a lapsed
// lease and dead-lettering through a router over the real clusters and
// checks that the counters, histograms and queue gauges move with them,
// and that request ids reach the answers and the trace.
func TestMetricsFollowTheMessageFlow(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	var offset atomic.Int64 // the router's clock runs ahead by this much
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	advance := func(d time.Duration) { offset.Add(int64(d)) }
	e := setupOn(t, bed, func(c *Config) {
		c.Now = now
		c.Observe.QueueEvery = time.Hour // the test counts with Refresh
		c.Observe.DiskPaths = []string{t.TempDir()}
	})
	reg := e.r.Metrics()
	const topic, sub = "obs.flow", "work"
	pair := map[string]string{"topic": topic, "subscription": sub}
	val := func(name string, labels map[string]string) float64 {
		t.Helper()
		v, _ := metricValue(t, reg, name, labels)
		return v
	}
	with := func(extra map[string]string) map[string]string {
		out := map[string]string{"topic": topic, "subscription": sub}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	expect := func(name string, labels map[string]string, want float64) {
		t.Helper()
		if got := val(name, labels); got != want {
			t.Fatalf("%s%v = %v, want %v", name, labels, got, want)
		}
	}
	refresh := func() { e.r.QueueHealth().Refresh(t.Context()) }

	if st, body := e.do(t, "PUT", "/v1/topics/"+topic+"/subscriptions/"+sub, map[string]any{
		"max_attempts": 2, "backoff": map[string]any{"initial_ms": 1, "max_ms": 1, "multiplier": 1, "jitter": 0}}); st != 201 {
		t.Fatalf("PUT subscription: %d %v", st, body)
	}
	produce := "/v1/topics/" + topic + "/messages"
	e.post(t, produce, map[string]any{"messages": []any{msg("k1", 1), msg("k2", 2), msg("k3", 3), msg("k4", 4)}})
	e.post(t, produce, map[string]any{"messages": []any{msg("k1", 1), msg("k2", "other")}})
	expect("shardmq_messages_produced_total", map[string]string{"topic": topic, "status": "created"}, 4)
	expect("shardmq_messages_produced_total", map[string]string{"topic": topic, "status": "duplicate"}, 1)
	expect("shardmq_messages_produced_total", map[string]string{"topic": topic, "status": "conflict"}, 1)
	expect("shardmq_http_request_duration_seconds", map[string]string{"route": "POST /v1/topics/{topic}/messages"}, 2)
	expect("shardmq_http_requests_total", map[string]string{"route": "POST /v1/topics/{topic}/messages", "status": "200"}, 2)
	if n := val("shardmq_cluster_op_duration_seconds", map[string]string{"op": "produce"}); n < 1 {
		t.Fatalf("no produce transaction timed (%v)", n)
	}

	// Queue health: four ready, the oldest aging with the clock.
	refresh()
	expect("shardmq_queue_messages", with(map[string]string{"state": "ready"}), 4)
	age1 := val("shardmq_queue_oldest_ready_age_seconds", pair)
	advance(10 * time.Minute)
	age2 := val("shardmq_queue_oldest_ready_age_seconds", pair)
	if age1 < 0 || age2-age1 < 600 || age2-age1 > 660 {
		t.Fatalf("oldest ready age went from %v to %v over 10 minutes", age1, age2)
	}

	// Claim two: in flight, counted; the request id is echoed.
	st, rid, body := e.postID(t, "/v1/topics/"+topic+"/subscriptions/"+sub+"/claim", "flow-claim-1", map[string]any{"max": 2, "consumer": "w1"})
	if st != 200 || rid != "flow-claim-1" {
		t.Fatalf("claim: %d, request id %q", st, rid)
	}
	claimed := body["messages"].([]any)
	if len(claimed) != 2 {
		t.Fatalf("claimed %d", len(claimed))
	}
	first, second := claimed[0].(map[string]any), claimed[1].(map[string]any)
	expect("shardmq_messages_claimed_total", pair, 2)
	refresh()
	expect("shardmq_queue_messages", with(map[string]string{"state": "ready"}), 2)
	expect("shardmq_queue_messages", with(map[string]string{"state": "in_flight"}), 2)

	// Ack one with a request id: counted, and the acked event carries it.
	st, rid, body = e.postID(t, "/v1/ack", "flow-ack-1", map[string]any{"receipts": []any{first["receipt"]}})
	if st != 200 || rid != "flow-ack-1" || results(t, body)[0]["status"] != "ok" {
		t.Fatalf("ack: %d %q %v", st, rid, body)
	}
	expect("shardmq_messages_acked_total", pair, 1)
	expect("shardmq_receipt_results_total", map[string]string{"op": "ack", "status": "ok"}, 1)
	var ackedBy string
	testtime.Until(t, "the ack traced", func() bool {
		_, tr := e.trace(t, topic, first["key"].(string), "")
		evs, _ := tr["events"].([]any)
		for _, ev := range evs {
			if m := ev.(map[string]any); m["type"] == "acked" {
				ackedBy, _ = m["request_id"].(string)
				return true
			}
		}
		return false
	})
	if ackedBy != "flow-ack-1" {
		t.Fatalf("acked event's request_id = %q, want flow-ack-1", ackedBy)
	}

	// Nack the other: retried, then claimed again with the rest and nacked
	// on its last attempt: dead.
	st, _, body = e.postID(t, "/v1/nack", "flow-nack-1", map[string]any{"items": []any{map[string]any{"receipt": second["receipt"], "error_code": "E1"}}})
	if st != 200 || results(t, body)[0]["status"] != "retry_scheduled" {
		t.Fatalf("nack: %d %v", st, body)
	}
	expect("shardmq_messages_nacked_total", pair, 1)
	advance(time.Second)
	again := e.claim(t, topic, sub, map[string]any{"max": 10, "consumer": "w2"})
	if len(again) != 3 {
		t.Fatalf("second claim got %d, want 3", len(again))
	}
	expect("shardmq_messages_claimed_total", pair, 5)
	var retried map[string]any
	var rest []any
	for _, m := range again {
		if m["key"] == second["key"] {
			retried = m
		} else {
			rest = append(rest, m["receipt"])
		}
	}
	if retried == nil {
		t.Fatalf("the nacked message was not claimed again: %v", again)
	}
	st, _, body = e.postID(t, "/v1/nack", "flow-nack-2", map[string]any{"items": []any{map[string]any{"receipt": retried["receipt"], "error_code": "E1"}}})
	if st != 200 || results(t, body)[0]["status"] != "dead" {
		t.Fatalf("last nack: %d %v", st, body)
	}
	expect("shardmq_messages_nacked_total", pair, 2)
	expect("shardmq_messages_dead_lettered_total", pair, 1)
	e.post(t, "/v1/ack", map[string]any{"receipts": rest})
	expect("shardmq_messages_acked_total", pair, 3)
	refresh()
	for state, want := range map[string]float64{"ready": 0, "delayed": 0, "in_flight": 0, "parked": 0, "dead": 1} {
		expect("shardmq_queue_messages", with(map[string]string{"state": state}), want)
	}
	expect("shardmq_queue_oldest_ready_age_seconds", pair, 0)

	// A lease that lapses twice dies at the next claim.
	e.post(t, produce, map[string]any{"messages": []any{msg("k5", 5)}})
	for i := 0; i < 3; i++ {
		got := e.claim(t, topic, sub, map[string]any{"max": 1, "visibility_timeout_ms": 1})
		if want := map[bool]int{true: 1, false: 0}[i < 2]; len(got) != want {
			t.Fatalf("claim %d after lapsed leases got %d, want %d", i+1, len(got), want)
		}
		advance(time.Second)
	}
	expect("shardmq_messages_lease_expired_total", pair, 2)
	expect("shardmq_messages_dead_lettered_total", pair, 2)

	// Errors are counted by route and code; an unusable id is replaced.
	st, rid, _ = e.postID(t, produce, "not a valid id!", "{")
	if st != 400 || len(rid) != 16 {
		t.Fatalf("bad JSON: %d, request id %q", st, rid)
	}
	expect("shardmq_http_errors_total", map[string]string{"route": "POST /v1/topics/{topic}/messages", "code": "invalid_json"}, 1)
	if st, _, _ := e.postID(t, "/v1/nowhere", "", map[string]any{}); st != 404 {
		t.Fatalf("unknown path: %d", st)
	}
	expect("shardmq_http_errors_total", map[string]string{"route": "unmatched", "code": "not_found"}, 1)

	// Per-cluster timings, pools, runtime and build facts are there.
	// Claims scan as their unit's owner; acks and nacks of leases held
	// in memory are written by the owners' flushes. The bodies of what
	// this router produced come from its memory, not owner_bodies reads.
	for _, op := range []string{"owner_scan", "owner_flush"} {
		if n := val("shardmq_cluster_op_duration_seconds", map[string]string{"op": op}); n < 1 {
			t.Fatalf("no %s transaction timed", op)
		}
	}
	if n := val("shardmq_body_cache_lookups_total", map[string]string{"result": "hit"}); n < 1 {
		t.Fatal("no claim took a body from the router's memory")
	}
	for _, c := range bed.Clusters {
		expect("shardmq_pool_max_open_connections", map[string]string{"cluster": c.Name}, 64)
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "shardmq_build_info", "shardmq_disk_free_bytes"} {
		if _, ok := metricValue(t, reg, name, nil); !ok {
			t.Fatalf("%s is not exported", name)
		}
	}

	// Deleting the subscription removes its series.
	if st, _ := e.do(t, "DELETE", "/v1/topics/"+topic+"/subscriptions/"+sub, nil); st != 200 && st != 204 {
		t.Fatalf("DELETE subscription: %d", st)
	}
	refresh()
	for _, name := range []string{"shardmq_messages_claimed_total", "shardmq_messages_acked_total", "shardmq_queue_messages"} {
		if _, ok := metricValue(t, reg, name, pair); ok {
			t.Fatalf("%s still has series of the deleted subscription", name)
		}
	}
}

// TestRequestLogCarriesTheID checks the request's log line: its id, route
// and status.
func TestRequestLogCarriesTheID(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	var buf syncBuffer
	e := setupOn(t, bed, func(c *Config) { c.Log = slogJSON(&buf) })
	e.postID(t, "/v1/topics/obs.log/messages", "log-req-1", "{")
	var line map[string]any
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, `"request_id":"log-req-1"`) {
			json.Unmarshal([]byte(l), &line)
		}
	}
	if line == nil || line["route"] != "POST /v1/topics/{topic}/messages" || line["status"].(float64) != 400 || line["code"] != "invalid_json" {
		keys := make([]string, 0)
		for k := range line {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		t.Fatalf("request log line = %v (keys %v); log:\n%s", line, keys, buf.String())
	}
}

func slogJSON(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
