package server

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/shardmq/shardmq/internal/testbed"
	"gopkg.in/yaml.v3"
)

// metricName finds the metric names an expression reads (the router's own,
// the Go runtime's and the process's).
var metricName = regexp.MustCompile(`\b(?:shardmq|go|process)_[a-zA-Z0-9_]+`)

// TestDashboardAndAlertsNameExportedMetrics reads every expression of the
// Grafana dashboard and the alert rules and checks each metric it names is
// one a router really exports, gathered from a router that served a little
// traffic.
func TestDashboardAndAlertsNameExportedMetrics(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, func(c *Config) {
		c.Observe.QueueEvery = time.Hour
		c.Observe.DiskPaths = []string{t.TempDir()}
	})
	if st, body := e.do(t, "PUT", "/v1/topics/obs.dash/subscriptions/s", map[string]any{"max_attempts": 1}); st != 201 {
		t.Fatalf("PUT: %d %v", st, body)
	}
	e.post(t, "/v1/topics/obs.dash/messages", map[string]any{"messages": []any{msg("a", 1), msg("b", 2)}})
	got := e.claim(t, "obs.dash", "s", map[string]any{"max": 2})
	if len(got) != 2 {
		t.Fatalf("claimed %d", len(got))
	}
	e.ack(t, got[0])
	e.post(t, "/v1/nack", map[string]any{"items": []any{map[string]any{"receipt": got[1]["receipt"]}}})
	// A lease that lapses: the next claim finds it.
	e.post(t, "/v1/topics/obs.dash/messages", map[string]any{"messages": []any{msg("c", 3)}})
	if got := e.claim(t, "obs.dash", "s", map[string]any{"max": 1, "visibility_timeout_ms": 1}); len(got) != 1 {
		t.Fatalf("claimed %d", len(got))
	}
	waitFor(t, 10*time.Second, func() bool {
		e.claim(t, "obs.dash", "s", map[string]any{"max": 1})
		v, _ := metricValue(t, e.r.Metrics(), "shardmq_messages_lease_expired_total", nil)
		return v == 1
	})
	e.post(t, "/v1/topics/obs.dash/messages", "{")
	e.r.QueueHealth().Refresh(t.Context())
	e.r.DeadLetters().Check(t.Context())
	// Retries need a deadlock; count one through the store's hook so that
	// the family shows.
	e.r.pools.opts(bed.Clusters[0].Name).OnRetry("produce")

	exported := map[string]bool{}
	fams, err := e.r.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		exported[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[f.GetName()+s] = true
			}
		}
	}

	var exprs []string
	raw, err := os.ReadFile("../deploy/grafana/shardmq.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	dashExprs := len(exprs)

	raw, err = os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	if dashExprs < 20 || len(exprs)-dashExprs < 10 {
		t.Fatalf("found %d dashboard and %d alert expressions", dashExprs, len(exprs)-dashExprs)
	}
	missing := map[string]bool{}
	for _, x := range exprs {
		names := metricName.FindAllString(x, -1)
		if len(names) == 0 {
			t.Errorf("expression names no metric: %s", x)
		}
		for _, n := range names {
			if !exported[n] {
				missing[n] = true
			}
		}
	}
	if len(missing) > 0 {
		var list []string
		for n := range missing {
			list = append(list, n)
		}
		sort.Strings(list)
		t.Fatalf("named but not exported: %v", list)
	}
}
