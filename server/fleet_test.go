package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/internal/consuldouble"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/topology/consul"
)

// Several routers over the same clusters (issue 20): whatever a client
// does through one router holds through the others — dedup, leases,
// ordering, subscriptions — with the topology in a static file and in
// Consul. Each test runs the same checks (fleetChecks) over two routers.

// fleetCall is one request to a router of the fleet.
func fleetCall(t *testing.T, base, method, path string, body any) (int, map[string]any) {
	t.Helper()
	code, out, err := fleetTry(t, base, method, path, body)
	if err != nil {
		t.Fatal(err)
	}
	return code, out
}

// fleetTry is fleetCall that returns a transport error instead of
// failing: a request sent as its router shuts down (on a connection the
// router is closing) fails so, and a client then retries elsewhere.
func fleetTry(t *testing.T, base, method, path string, body any) (int, map[string]any, error) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, base+path, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := testClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s %s: status %d, body %q is not JSON", method, path, resp.StatusCode, data)
		}
	}
	return resp.StatusCode, out, nil
}

func fleetMessages(t *testing.T, body map[string]any) []map[string]any {
	t.Helper()
	raw, _ := body["messages"].([]any)
	out := make([]map[string]any, len(raw))
	for i, m := range raw {
		out[i] = m.(map[string]any)
	}
	return out
}

func fleetClaim(t *testing.T, base, topic, sub string, max int, visibility time.Duration) []map[string]any {
	t.Helper()
	code, body := fleetCall(t, base, http.MethodPost, "/v1/topics/"+topic+"/subscriptions/"+sub+"/claim",
		map[string]any{"max": max, "wait_ms": 0, "visibility_timeout_ms": visibility.Milliseconds(), "consumer": "fleet"})
	if code != http.StatusOK {
		t.Fatalf("claim %s/%s via %s: %d %v", topic, sub, base, code, body)
	}
	return fleetMessages(t, body)
}

func fleetStatuses(t *testing.T, body map[string]any) []string {
	t.Helper()
	var out []string
	for _, r := range results(t, body) {
		out = append(out, fmt.Sprint(r["status"]))
	}
	return out
}

// fleetChecks runs the cross-router checks over routers a and b.
func fleetChecks(t *testing.T, a, b string) {
	t.Run("dedup", func(t *testing.T) {
		// The same key through both: one created, one duplicate of it.
		m := map[string]any{"messages": []any{msg("k1", map[string]any{"n": 1})}}
		_, first := fleetCall(t, a, http.MethodPost, "/v1/topics/fdedup/messages", m)
		_, second := fleetCall(t, b, http.MethodPost, "/v1/topics/fdedup/messages", m)
		r1, r2 := results(t, first)[0], results(t, second)[0]
		if r1["status"] != "created" || r2["status"] != "duplicate" || r1["id"] != r2["id"] {
			t.Fatalf("same key via a then b: %v then %v, want created then duplicate of the same id", r1, r2)
		}
		// Drain: exactly one delivery, whichever router claims.
		got := fleetClaim(t, b, "fdedup", "default", 10, 30*time.Second)
		got = append(got, fleetClaim(t, a, "fdedup", "default", 10, 30*time.Second)...)
		if len(got) != 1 {
			t.Fatalf("%d deliveries of one key produced through two routers, want 1", len(got))
		}
	})

	t.Run("leases", func(t *testing.T) {
		_, body := fleetCall(t, a, http.MethodPost, "/v1/topics/flease/messages",
			map[string]any{"messages": []any{msg("l1", 1), msg("l2", 2)}})
		for _, r := range results(t, body) {
			if r["status"] != "created" {
				t.Fatalf("produce: %v", r)
			}
		}
		held := fleetClaim(t, a, "flease", "default", 2, time.Minute)
		if len(held) != 2 {
			t.Fatalf("claimed %d via a, want 2", len(held))
		}
		// Leased through a: nothing for b to claim.
		if again := fleetClaim(t, b, "flease", "default", 10, time.Minute); len(again) != 0 {
			t.Fatalf("b claimed %d messages leased through a", len(again))
		}
		// A receipt from a acks through b; acking it again through a is
		// refused (it is gone), and a nack through a of the other
		// receipt schedules a retry.
		_, ack := fleetCall(t, b, http.MethodPost, "/v1/ack", map[string]any{"receipts": []any{held[0]["receipt"]}})
		if st := fleetStatuses(t, ack); st[0] != "ok" {
			t.Fatalf("ack via b of a's receipt: %v", st)
		}
		_, ack = fleetCall(t, a, http.MethodPost, "/v1/ack", map[string]any{"receipts": []any{held[0]["receipt"]}})
		if st := fleetStatuses(t, ack); st[0] == "ok" {
			t.Fatalf("second ack via a of a receipt acked via b: %v", st)
		}
		_, nack := fleetCall(t, b, http.MethodPost, "/v1/nack", map[string]any{"items": []any{
			map[string]any{"receipt": held[1]["receipt"], "error_code": "E_FLEET", "error": "fleet", "retry_after_ms": 0}}})
		if st := fleetStatuses(t, nack); st[0] != "retry_scheduled" {
			t.Fatalf("nack via b of a's receipt: %v", st)
		}
		// The nacked one comes back, to either router, as attempt 2.
		var back []map[string]any
		testtime.Until(t, "the nacked message back", func() bool {
			back = append(back, fleetClaim(t, a, "flease", "default", 10, time.Minute)...)
			return len(back) > 0
		})
		if len(back) != 1 || back[0]["key"] != held[1]["key"] || back[0]["attempt"] != float64(2) {
			t.Fatalf("after the nack via b: %v, want %v at attempt 2", back, held[1]["key"])
		}
		_, ack = fleetCall(t, b, http.MethodPost, "/v1/ack", map[string]any{"receipts": []any{back[0]["receipt"]}})
		if st := fleetStatuses(t, ack); st[0] != "ok" {
			t.Fatalf("ack via b: %v", st)
		}
	})

	t.Run("subscription made via a is served by b", func(t *testing.T) {
		code, body := fleetCall(t, a, http.MethodPut, "/v1/topics/fsub/subscriptions/audit", map[string]any{"max_attempts": 3})
		if code != http.StatusCreated && code != http.StatusOK {
			t.Fatalf("PUT via a: %d %v", code, body)
		}
		// b has never seen the topic: its first produce picks up a's
		// subscription (and makes no default one).
		_, body = fleetCall(t, b, http.MethodPost, "/v1/topics/fsub/messages", map[string]any{"messages": []any{msg("s1", 1)}})
		if results(t, body)[0]["status"] != "created" {
			t.Fatalf("produce via b: %v", body)
		}
		got := fleetClaim(t, b, "fsub", "audit", 10, time.Minute)
		if len(got) != 1 || got[0]["key"] != "s1" {
			t.Fatalf("claim of a's subscription via b: %v", got)
		}
		code, body = fleetCall(t, b, http.MethodGet, "/v1/topics/fsub/subscriptions/audit", nil)
		if code != http.StatusOK || body["max_attempts"] != float64(3) {
			t.Fatalf("GET via b: %d %v", code, body)
		}
		if code, _ := fleetCall(t, b, http.MethodGet, "/v1/topics/fsub/subscriptions/default", nil); code != http.StatusNotFound {
			t.Fatalf("GET default via b: %d, want 404 (the topic has a's subscription only)", code)
		}
	})

	t.Run("ordered across routers", func(t *testing.T) {
		if code, body := fleetCall(t, a, http.MethodPut, "/v1/topics/ford/subscriptions/o", map[string]any{"ordered": true}); code/100 != 2 {
			t.Fatalf("PUT ordered via a: %d %v", code, body)
		}
		// Produced alternately through b and a, one message per request:
		// the order of each order key is the order of the requests.
		const per = 8
		keys := []string{"A", "B", "C"}
		for i := range per {
			for j, k := range keys {
				via := []string{b, a}[(i+j)%2]
				_, body := fleetCall(t, via, http.MethodPost, "/v1/topics/ford/messages", map[string]any{"messages": []any{
					map[string]any{"key": fmt.Sprintf("%s-%02d", k, i), "order_key": k, "payload": i}}})
				if results(t, body)[0]["status"] != "created" {
					t.Fatalf("produce: %v", body)
				}
			}
		}
		// Two consumers, one per router, each acking through the other.
		var mu sync.Mutex
		inFlight := map[string]int{}
		seen := map[string][]int{}
		var violations []string
		var wg sync.WaitGroup
		deadline := time.Now().Add(30 * time.Second)
		for w, pair := range [][2]string{{a, b}, {b, a}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					mu.Lock()
					done := len(seen["A"])+len(seen["B"])+len(seen["C"]) == len(keys)*per
					mu.Unlock()
					if done {
						return
					}
					_, out := fleetCall(t, pair[0], http.MethodPost, "/v1/topics/ford/subscriptions/o/claim",
						map[string]any{"max": 3, "wait_ms": 100, "consumer": fmt.Sprint("w", w)})
					msgs := fleetMessages(t, out)
					mu.Lock()
					for _, m := range msgs {
						k := m["order_key"].(string)
						if inFlight[k]++; inFlight[k] > 1 {
							violations = append(violations, "two of "+k+" in flight")
						}
					}
					mu.Unlock()
					for _, m := range msgs {
						k := m["order_key"].(string)
						mu.Lock()
						seen[k] = append(seen[k], int(m["payload"].(float64)))
						inFlight[k]--
						mu.Unlock()
						_, ack := fleetCall(t, pair[1], http.MethodPost, "/v1/ack", map[string]any{"receipts": []any{m["receipt"]}})
						if st := fleetStatuses(t, ack); st[0] != "ok" {
							mu.Lock()
							violations = append(violations, "ack "+st[0])
							mu.Unlock()
						}
					}
				}
			}()
		}
		wg.Wait()
		if len(violations) > 0 {
			t.Fatalf("across routers: %v", violations)
		}
		for _, k := range keys {
			if len(seen[k]) != per {
				t.Fatalf("key %s: %d of %d delivered", k, len(seen[k]), per)
			}
			for i, v := range seen[k] {
				if v != i {
					t.Fatalf("key %s delivered out of order across routers: %v", k, seen[k])
				}
			}
		}
	})
}

// Two routers over one static topology file.
func TestFleetOfRoutersStaticTopology(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, nil)
	ln := listen(t)
	cfg := Config{TopologyFile: e.topology}
	cfg.Broker.Owners.Addr = ln.Addr().String()
	cfg.Broker.Receipts = testReceipts
	b, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := serveOn(ln, b.Handler())
	t.Cleanup(func() { srv.Close(); b.Close() })
	fleetChecks(t, e.url, srv.URL)
}

// Two routers on the same Consul (the double) over the same clusters.
func TestFleetOfRoutersConsul(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	database := testbed.TestDatabase(t, bed, "t_fleet_")
	d := consuldouble.New(consuldouble.Options{})
	t.Cleanup(d.Close)
	capi, err := api.NewClient(&api.Config{Address: d.Addr(), HttpClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range bed.Clusters {
		consulRegister(t, capi, c.Primary, consul.RolePrimary)
		for _, r := range c.Replicas {
			consulRegister(t, capi, r, consul.RoleReplica)
		}
	}
	admin, err := consul.New(consul.Config{Address: d.Addr(), DSN: consul.DSN{User: "root", Database: database}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := routing.NewMap(1, []routing.Range{{From: 0, To: 511, Cluster: bed.Clusters[0].Name}, {From: 512, To: 1023, Cluster: bed.Clusters[1].Name}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.UpdateShardMap(ctx, 0, m); err != nil {
		t.Fatal(err)
	}
	a, err := startConsulRouter(t, d.Addr(), database, "fleet-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := startConsulRouter(t, d.Addr(), database, "fleet-b")
	if err != nil {
		t.Fatal(err)
	}
	fleetChecks(t, a.base, b.base)
}
