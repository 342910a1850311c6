package server

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/shard"
)

var bed *testbed.Bed

// testClient bounds every request a test makes, so that a hung router
// fails the test with a message instead of stalling the suite.
var testClient = &http.Client{Timeout: 60 * time.Second}

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 2, Replicas: 1}, func(b *testbed.Bed) { bed = b }))
}

// env is one test's router over its own database on every cluster.
type env struct {
	name  string // the test's database
	url   string
	dbs   map[string]*sql.DB // cluster name → its primary
	owner func(shard.ID) string
	r     *Router
	// topology is the router's topology file (a second router can serve
	// the same clusters from it).
	topology string
	// stop stops the router and waits for it (set where the test runs
	// it; safe to call twice).
	stop func()
	// leading reports whether the router runs the background jobs (set
	// on Consul).
	leading func() bool
}

func setup(t *testing.T) *env {
	t.Helper()
	return setupOn(t, bed, nil)
}

// setupOn starts a router over bed with its own database; tune may adjust
// the router's config.
func setupOn(t *testing.T, bed *testbed.Bed, tune func(*Config)) *env {
	t.Helper()
	return setupYAML(t, bed, "", tune)
}

// setupYAML is setupOn with more topology YAML (an archive cluster).
func setupYAML(t *testing.T, bed *testbed.Bed, extra string, tune func(*Config)) *env {
	t.Helper()
	ctx := context.Background()
	name := testbed.TestDatabase(t, bed, "t_e2e_")
	var y strings.Builder
	y.WriteString(extra)
	y.WriteString("clusters:\n")
	e := &env{name: name, dbs: map[string]*sql.DB{}}
	for _, c := range bed.Clusters {
		fmt.Fprintf(&y, "  - name: %s\n    primary: %q\n", c.Name, c.Primary.DSN(name))
		if len(c.Replicas) > 0 {
			fmt.Fprintf(&y, "    replicas:\n")
			for _, r := range c.Replicas {
				fmt.Fprintf(&y, "      - %q\n", r.DSN(name))
			}
		}
		db, err := sql.Open("mysql", c.Primary.DSN(name))
		if err != nil {
			t.Fatal(err)
		}
		e.dbs[c.Name] = db
	}
	per := shard.Count / len(bed.Clusters)
	fmt.Fprintf(&y, "shard_map:\n  version: 1\n  ranges:\n")
	for i, c := range bed.Clusters {
		to := (i+1)*per - 1
		if i == len(bed.Clusters)-1 {
			to = shard.Count - 1
		}
		fmt.Fprintf(&y, "    - {from: %d, to: %d, cluster: %s}\n", i*per, to, c.Name)
	}
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	e.topology = path
	ln := listen(t)
	cfg := Config{TopologyFile: path}
	cfg.Broker.Owners.Addr = ln.Addr().String()
	if tune != nil {
		tune(&cfg)
	}
	r, err := New(ctx, cfg)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	e.r = r
	srv := serveOn(ln, r.Handler())
	e.url = srv.URL
	e.owner = func(v shard.ID) string { c, _ := r.table.Load().Lookup(v); return c }
	t.Cleanup(func() {
		srv.Close()
		r.Close()
		for _, db := range e.dbs {
			db.Close()
		}
	})
	return e
}

func (e *env) post(t *testing.T, path string, body any) (int, http.Header, map[string]any) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	resp, err := testClient.Post(e.url+path, "application/json", rd)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("POST %s: status %d, body %q is not JSON", path, resp.StatusCode, data)
	}
	return resp.StatusCode, resp.Header, out
}

func (e *env) count(t *testing.T, query string, args ...any) map[string]int {
	t.Helper()
	out := map[string]int{}
	for name, db := range e.dbs {
		var n int
		if err := db.QueryRow(query, args...).Scan(&n); err != nil {
			t.Fatalf("%s on %s: %v", query, name, err)
		}
		out[name] = n
	}
	return out
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func results(t *testing.T, body map[string]any) []map[string]any {
	t.Helper()
	raw, ok := body["results"].([]any)
	if !ok {
		t.Fatalf("no results in %v", body)
	}
	out := make([]map[string]any, len(raw))
	for i, r := range raw {
		out[i] = r.(map[string]any)
	}
	return out
}

func msg(key string, payload any) map[string]any {
	return map[string]any{"key": key, "payload": payload}
}

func TestProduceDedupAcrossClusters(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	const n, unique = 10000, 8000
	ids := map[string]string{}
	var dupes int
	for start := 0; start < n; start += 500 {
		var batch []map[string]any
		for i := start; i < start+500; i++ {
			k := i
			if i >= unique {
				k = (i * 7) % unique // 20 % repeat earlier keys
			}
			batch = append(batch, msg(fmt.Sprintf("key-%d", k), map[string]any{"n": k}))
		}
		st, _, body := e.post(t, "/v1/topics/orders/messages", map[string]any{"messages": batch})
		if st != 200 {
			t.Fatalf("produce: %d %v", st, body)
		}
		for _, r := range results(t, body) {
			key := r["key"].(string)
			switch r["status"] {
			case "created":
				if _, seen := ids[key]; seen {
					t.Fatalf("%s created twice", key)
				}
				ids[key] = r["id"].(string)
			case "duplicate":
				dupes++
				if ids[key] != r["id"] {
					t.Fatalf("duplicate %s answered id %v, original %s", key, r["id"], ids[key])
				}
			default:
				t.Fatalf("unexpected result %v", r)
			}
			if v := int(r["vshard"].(float64)); v != int(shard.Of(key)) {
				t.Fatalf("%s: vshard %d, want %d", key, v, shard.Of(key))
			}
		}
	}
	if len(ids) != unique || dupes != n-unique {
		t.Fatalf("created %d, duplicate %d; want %d and %d", len(ids), dupes, unique, n-unique)
	}
	stored := e.count(t, "SELECT COUNT(*) FROM message_store")
	if total(stored) != unique || total(e.count(t, "SELECT COUNT(*) FROM message_queue")) != unique {
		t.Fatalf("stored %v, want %d in all", stored, unique)
	}
	for name, db := range e.dbs {
		if stored[name] == 0 {
			t.Fatalf("cluster %s holds nothing", name)
		}
		rows, err := db.Query("SELECT msg_key, vshard, CRC32(msg_key) % 1024 FROM message_store")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var key string
			var v, crc int
			rows.Scan(&key, &v, &crc)
			if v != crc || e.owner(shard.ID(v)) != name {
				t.Fatalf("%s (vshard %d, crc %d) stored on %s", key, v, crc, name)
			}
		}
		rows.Close()
	}
}

func TestConflictWritesNothing(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	_, _, body := e.post(t, "/v1/topics/t/messages", map[string]any{"messages": []any{msg("k", map[string]any{"v": 1})}})
	first := results(t, body)[0]
	st, _, body := e.post(t, "/v1/topics/t/messages", map[string]any{"messages": []any{msg("k", map[string]any{"v": 2}), msg("k", map[string]any{"v": 1})}})
	res := results(t, body)
	if st != 200 || res[0]["status"] != "conflict" || res[1]["status"] != "duplicate" || res[1]["id"] != first["id"] {
		t.Fatalf("got %d %v", st, res)
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_store")); n != 1 {
		t.Fatalf("%d messages stored, want 1", n)
	}
	// The same payload in other JSON spacing is the same payload.
	_, _, body = e.post(t, "/v1/topics/t/messages", `{"messages":[{"key":"k","payload":{ "v" : 1 }}]}`)
	if r := results(t, body)[0]; r["status"] != "duplicate" {
		t.Fatalf("respaced payload: %v", r)
	}
}

func (e *env) claim(t *testing.T, topic, sub string, body map[string]any) []map[string]any {
	t.Helper()
	st, _, out := e.post(t, "/v1/topics/"+topic+"/subscriptions/"+sub+"/claim", body)
	if st != 200 {
		t.Fatalf("claim: %d %v", st, out)
	}
	raw := out["messages"].([]any)
	msgs := make([]map[string]any, len(raw))
	for i, m := range raw {
		msgs[i] = m.(map[string]any)
	}
	return msgs
}

func TestClaimAckAndExpiredLease(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	e.post(t, "/v1/topics/jobs/messages", map[string]any{"messages": []any{map[string]any{
		"key": "job-1", "payload_base64": "AAEC", "headers": map[string]string{"h": "v"}, "priority": 3, "transaction_id": "tx-1"}}})
	got := e.claim(t, "jobs", "default", map[string]any{"max": 10, "visibility_timeout_ms": 300, "consumer": "w1"})
	if len(got) != 1 {
		t.Fatalf("claimed %d", len(got))
	}
	m := got[0]
	if m["attempt"].(float64) != 1 || m["payload_base64"] != "AAEC" || m["key"] != "job-1" || m["topic"] != "jobs" ||
		m["transaction_id"] != "tx-1" || m["priority"].(float64) != 3 || m["headers"].(map[string]any)["h"] != "v" || m["produced_at"] == "" {
		t.Fatalf("claimed message %v", m)
	}
	// Wait out the lease: the next claim long-polls until it expires.
	again := e.claim(t, "jobs", "default", map[string]any{"max": 10, "visibility_timeout_ms": 30000, "wait_ms": 5000, "consumer": "w2"})
	if len(again) != 1 || again[0]["attempt"].(float64) != 2 {
		t.Fatalf("reclaim = %v, want attempt 2", again)
	}
	_, _, body := e.post(t, "/v1/ack", map[string]any{"receipts": []any{m["receipt"], again[0]["receipt"]}})
	res := results(t, body)
	if res[0]["status"] != "lease_lost" || res[1]["status"] != "ok" || res[0]["receipt"] != m["receipt"] {
		t.Fatalf("ack = %v", res)
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_store WHERE msg_status = 1")); n != 1 {
		t.Fatal("message not consumed after ack")
	}
	_, _, body = e.post(t, "/v1/ack", map[string]any{"receipts": []any{again[0]["receipt"]}})
	if r := results(t, body)[0]; r["status"] != "not_found" {
		t.Fatalf("second ack = %v", r)
	}
	if got := e.claim(t, "jobs", "default", map[string]any{"max": 10}); len(got) != 0 {
		t.Fatalf("claim after ack = %v, want empty", got)
	}
}

func TestFiveNacksMakeItDead(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	e.post(t, "/v1/topics/pay/messages", map[string]any{"messages": []any{msg("p-1", map[string]any{"amount": 5})}})
	for attempt := 1; attempt <= 5; attempt++ {
		got := e.claim(t, "pay", "default", map[string]any{"wait_ms": 3000})
		if len(got) != 1 || int(got[0]["attempt"].(float64)) != attempt {
			t.Fatalf("attempt %d: %v", attempt, got)
		}
		_, _, body := e.post(t, "/v1/nack", map[string]any{"items": []any{map[string]any{
			"receipt": got[0]["receipt"], "error_code": "E_STOCK", "error": "no stock", "retry_after_ms": 1}}})
		r := results(t, body)[0]
		want := "retry_scheduled"
		if attempt == 5 {
			want = "dead"
		}
		if r["status"] != want {
			t.Fatalf("nack %d = %v, want %s", attempt, r, want)
		}
		if want == "retry_scheduled" && r["next_attempt_at"] == nil {
			t.Fatalf("nack %d has no next_attempt_at", attempt)
		}
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_store WHERE msg_status = 2")); n != 1 {
		t.Fatal("message_store status is not dead")
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_queue WHERE is_dead = 1 AND error_code = 'E_STOCK'")); n != 1 {
		t.Fatal("delivery is not a dead letter with its error code")
	}
	if got := e.claim(t, "pay", "default", map[string]any{"wait_ms": 100}); len(got) != 0 {
		t.Fatal("a dead letter was delivered")
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	ok := msg("fine", 1)
	big := strings.Repeat("x", 1<<20)
	many := make([]any, 1001)
	for i := range many {
		many[i] = msg(fmt.Sprint("m", i), 1)
	}
	cases := []struct {
		name   string
		path   string
		body   any
		status int
		code   string
	}{
		{"not json", "/v1/topics/t/messages", `{"messages":[`, 400, "invalid_json"},
		{"empty batch", "/v1/topics/t/messages", map[string]any{"messages": []any{}}, 400, "invalid_request"},
		{"bad topic", "/v1/topics/bad%20topic/messages", map[string]any{"messages": []any{ok}}, 400, "invalid_topic"},
		{"long topic", "/v1/topics/" + strings.Repeat("t", 129) + "/messages", map[string]any{"messages": []any{ok}}, 400, "invalid_topic"},
		{"priority", "/v1/topics/t/messages", map[string]any{"messages": []any{ok, map[string]any{"key": "p", "payload": 1, "priority": 10}}}, 400, "invalid_request"},
		{"long key", "/v1/topics/t/messages", map[string]any{"messages": []any{ok, msg(strings.Repeat("k", 257), 1)}}, 400, "invalid_request"},
		{"no payload", "/v1/topics/t/messages", map[string]any{"messages": []any{ok, map[string]any{"key": "n"}}}, 400, "invalid_request"},
		{"both payloads", "/v1/topics/t/messages", map[string]any{"messages": []any{ok, map[string]any{"key": "n", "payload": 1, "payload_base64": "AA=="}}}, 400, "invalid_request"},
		{"bad base64", "/v1/topics/t/messages", map[string]any{"messages": []any{ok, map[string]any{"key": "n", "payload_base64": "***"}}}, 400, "invalid_request"},
		{"delay and deliver_at", "/v1/topics/t/messages", map[string]any{"messages": []any{ok, map[string]any{"key": "n", "payload": 1, "delay_ms": 5, "deliver_at": "2030-01-01T00:00:00Z"}}}, 400, "invalid_request"},
		{"bad deliver_at", "/v1/topics/t/messages", map[string]any{"messages": []any{ok, map[string]any{"key": "n", "payload": 1, "deliver_at": "tomorrow"}}}, 400, "invalid_request"},
		{"negative delay", "/v1/topics/t/messages", map[string]any{"messages": []any{ok, map[string]any{"key": "n", "payload": 1, "delay_ms": -1}}}, 400, "invalid_request"},
		{"durability", "/v1/topics/t/messages", map[string]any{"messages": []any{ok}, "durability": "eventually"}, 400, "invalid_request"},
		{"payload too large", "/v1/topics/t/messages", map[string]any{"messages": []any{ok, msg("big", big)}}, 413, "payload_too_large"},
		{"batch too large", "/v1/topics/t/messages", map[string]any{"messages": many}, 413, "batch_too_large"},
		{"body too large", "/v1/topics/t/messages", map[string]any{"messages": []any{ok, msg("a", big[:900000]), msg("b", big[:900000]), msg("c", strings.Repeat("y", 16<<20))}}, 413, "request_too_large"},
		{"claim max", "/v1/topics/t/subscriptions/default/claim", map[string]any{"max": 0}, 400, "invalid_request"},
		{"claim sub", "/v1/topics/t/subscriptions/no-such/claim", map[string]any{"max": 1}, 404, "unknown_subscription"},
		{"ack garbage", "/v1/ack", map[string]any{"receipts": []any{"nope"}}, 400, "invalid_receipt"},
		{"ack none", "/v1/ack", map[string]any{"receipts": []any{}}, 400, "invalid_request"},
		{"nack garbage", "/v1/nack", map[string]any{"items": []any{map[string]any{"receipt": "x"}}}, 400, "invalid_receipt"},
		{"unknown path", "/v1/nothing", map[string]any{}, 404, "not_found"},
	}
	for _, c := range cases {
		st, _, body := e.post(t, c.path, c.body)
		errObj, _ := body["error"].(map[string]any)
		if st != c.status || errObj == nil || errObj["code"] != c.code || errObj["message"] == "" {
			t.Errorf("%s: got %d %v, want %d %s", c.name, st, body, c.status, c.code)
		}
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_key")); n != 0 {
		t.Fatalf("bad requests wrote %d keys", n)
	}
}

func TestFingerprintKeyDeduplicates(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	body := map[string]any{"messages": []any{map[string]any{"payload": map[string]any{"a": 1}, "transaction_id": "tx-7"}}}
	_, _, first := e.post(t, "/v1/topics/t/messages", body)
	_, _, second := e.post(t, "/v1/topics/t/messages", body)
	a, b := results(t, first)[0], results(t, second)[0]
	if a["status"] != "created" || b["status"] != "duplicate" || a["key"] != b["key"] || !strings.HasPrefix(a["key"].(string), "fp-") {
		t.Fatalf("first %v second %v", a, b)
	}
}

func TestHealthAndReady(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(e.url + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s = %d", p, resp.StatusCode)
		}
	}
	_ = time.Second
}

// listen opens a loopback port for a router before it exists, so that
// the router can name it to the others as the address where it owns its
// units (docs/consume.md, "Owners").
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// serveOn serves h on ln as httptest.NewServer does on a port of its own.
func serveOn(ln net.Listener, h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	return srv
}
