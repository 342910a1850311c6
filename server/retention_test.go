package server

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/ctl"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/retention"
	"github.com/shardmq/shardmq/topology"
)

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

// TestRetentionTraceThroughTiers: a router on a test clock with an
// archive cluster in its topology; messages produced and consumed in
// March 2024 are found by the trace and transaction endpoints while hot,
// warm (archive cluster) and cold (a file, status archived), again after
// `shardmqctl archive restore`, and after their vshards changed cluster.
func TestRetentionTraceThroughTiers(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	clock := &testClock{t: time.Date(2024, 3, 10, 12, 0, 0, 0, time.UTC)}
	archDB := testbed.TestDatabase(t, bed, "t_e2e_arch_")
	dir := t.TempDir()
	extra := fmt.Sprintf("archive:\n  primary: %q\n", bed.Clusters[len(bed.Clusters)-1].Primary.DSN(archDB))
	e := setupYAML(t, bed, extra, func(c *Config) {
		c.Now = clock.Now
		c.Retention = retention.Config{ColdDir: dir, Pause: -1, Every: time.Hour}
	})
	var keys []string
	for i := 0; i < 12; i++ {
		k := fmt.Sprintf("inv-%d", i)
		keys = append(keys, k)
		_, _, out := e.post(t, "/v1/topics/invoices/messages", map[string]any{"messages": []any{
			map[string]any{"key": k, "payload": map[string]any{"n": i}, "transaction_id": "tx-inv"}}})
		if r := results(t, out)[0]; r["status"] != "created" {
			t.Fatalf("produce %s: %v", k, r)
		}
	}
	clock.Set(time.Date(2024, 3, 20, 12, 0, 0, 0, time.UTC))
	got := e.claim(t, "invoices", "default", map[string]any{"max": 100, "consumer": "w1"})
	if len(got) != len(keys) {
		t.Fatalf("claimed %d of %d", len(got), len(keys))
	}
	e.ack(t, got...)

	trace := func(key string) map[string]any {
		t.Helper()
		st, body := e.do(t, "GET", "/v1/messages/"+key+"/trace?"+url.Values{"topic": {"invoices"}}.Encode(), nil)
		if st != 200 {
			t.Fatalf("trace %s: %d %v", key, st, body)
		}
		return body
	}
	checkOnce := func(stage, tier, status string, wantAcked bool) string {
		for _, k := range keys {
			body := trace(k)
			m := body["message"].(map[string]any)
			if body["tier"] != tier || m["status"] != status || m["key"] != k {
				return fmt.Sprintf("%s: trace of %s: tier %v status %v, want %s %s: %v", stage, k, body["tier"], m["status"], tier, status, body)
			}
			types := map[string]bool{}
			for _, ev := range body["events"].([]any) {
				types[ev.(map[string]any)["type"].(string)] = true
			}
			if !types["produced"] || types["acked"] != wantAcked {
				return fmt.Sprintf("%s: trace of %s: events %v", stage, k, body["events"])
			}
			if tier == "cold" {
				a, _ := body["archive"].(map[string]any)
				if a == nil || a["month"] != "2024-03" || !strings.HasSuffix(a["file"].(string), ".jsonl.gz") || m["archive_file"] != a["file"] {
					return fmt.Sprintf("%s: cold trace of %s names no file: %v", stage, k, body)
				}
				if _, err := os.Stat(filepath.Join(dir, a["file"].(string))); err != nil {
					return fmt.Sprintf("%s: %v", stage, err)
				}
			}
		}
		st, body := e.do(t, "GET", "/v1/transactions/tx-inv", nil)
		msgs, _ := body["messages"].([]any)
		if st != 200 || len(msgs) != len(keys) || body["complete"] != true {
			return fmt.Sprintf("%s: transaction: %d %v", stage, st, body)
		}
		for _, m := range msgs {
			if mm := m.(map[string]any); mm["tier"] != tier || mm["status"] != status {
				return fmt.Sprintf("%s: transaction message %v, want tier %s status %s", stage, mm, tier, status)
			}
		}
		return ""
	}
	// A hot trace may be read from a replica within the lag limit: the
	// checks are repeated until they hold or 20 s pass.
	check := func(stage, tier, status string, wantAcked bool) {
		t.Helper()
		testtime.WithinState(t, 20*time.Second, stage, func() (bool, string) {
			msg := checkOnce(stage, tier, status, wantAcked)
			return msg == "", msg
		})
	}
	run := func() {
		t.Helper()
		st, body := e.do(t, "POST", "/v1/admin/retention/run", map[string]any{})
		if st != 200 || body["error"] != nil {
			t.Fatalf("retention run: %d %v", st, body)
		}
	}
	check("hot", "hot", "consumed", true)

	clock.Set(time.Date(2024, 7, 15, 12, 0, 0, 0, time.UTC))
	run()
	check("warm", "warm", "consumed", true)

	clock.Set(time.Date(2025, 4, 15, 12, 0, 0, 0, time.UTC))
	run()
	check("cold", "cold", "archived", false)

	cli := func(args ...string) string {
		t.Helper()
		var out, errw strings.Builder
		if code := ctl.Run(args, e.url, &out, &errw, testClient); code != 0 {
			t.Fatalf("shardmqctl %v: exit %d: %s", args, code, errw.String())
		}
		return out.String()
	}
	if out := cli("archive", "restore", "-month", "2024-03"); !strings.Contains(out, `"messages": 12`) {
		t.Fatalf("archive restore: %s", out)
	}
	check("restored", "warm", "consumed", true)
	if out := cli("archive", "status"); !strings.Contains(out, `"archive_cluster": true`) {
		t.Fatalf("archive status: %s", out)
	}
	st, body := e.do(t, "GET", "/v1/admin/stats", nil)
	if r, _ := body["retention"].(map[string]any); st != 200 || r == nil || r["jobs"] == nil {
		t.Fatalf("stats lack retention: %v", body)
	}

	// The vshards move to the other cluster (a map of version 2): archived
	// traces do not depend on where their vshards live.
	data, _ := os.ReadFile(e.topology)
	moved := strings.Replace(string(data), "version: 1", "version: 2", 1)
	moved = strings.ReplaceAll(moved, "cluster: "+bed.Clusters[0].Name+"}", "cluster: "+bed.Clusters[1].Name+"}")
	if err := os.WriteFile(e.topology, []byte(moved), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testtime.Context(t))
	defer cancel()
	top, err := topology.LoadFile(e.topology)
	if err != nil {
		t.Fatal(err)
	}
	e.r.apply(ctx, top)
	if v := e.r.table.Load().Version(); v != 2 {
		t.Fatalf("map version %d after the move, want 2", v)
	}
	check("after the vshards moved", "warm", "consumed", true)
	// A month that is not restored has nothing to release: 404, not
	// "released" (a month that does not exist, a restored one twice).
	if st, body := e.do(t, "POST", "/v1/admin/retention/release", map[string]any{"month": "2999-01"}); st != 404 || body["error"].(map[string]any)["code"] != "not_found" {
		t.Fatalf("release of month 2999-01: %d %v, want 404", st, body)
	}
	cli("archive", "release", "-month", "2024-03")
	if st, body := e.do(t, "POST", "/v1/admin/retention/release", map[string]any{"month": "2024-03"}); st != 404 {
		t.Fatalf("second release of 2024-03: %d %v, want 404", st, body)
	}
	run()
	check("cold after the vshards moved", "cold", "archived", false)
}
