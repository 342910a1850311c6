package loadtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/server"
	"github.com/shardmq/shardmq/topology"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 2, Replicas: 1}, func(b *testbed.Bed) { bed = b }))
}

// env is a router over its own database on every cluster of a bed.
type env struct {
	url  string
	top  *topology.Topology
	path string
}

func setupOn(t *testing.T, b *testbed.Bed) *env {
	t.Helper()
	ctx := context.Background()
	var rnd [4]byte
	rand.Read(rnd[:])
	name := "t_loadtest_" + hex.EncodeToString(rnd[:])
	if err := testbed.CreateDatabase(ctx, b, name); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := testbed.WriteTopology(path, b, name); err != nil {
		t.Fatal(err)
	}
	top, err := topology.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	url := startRouter(t, path)
	t.Cleanup(func() {
		for _, c := range b.Clusters {
			if db, err := sql.Open("mysql", c.Primary.DSN("")); err == nil {
				db.Exec("DROP DATABASE " + name)
				db.Close()
			}
		}
	})
	return &env{url: url, top: top, path: path}
}

// small is a run small enough for -race on 2 shared cores.
func (e *env) small(scenario string) Config {
	return Config{Scenario: scenario, Router: e.url, Topology: e.top, Duration: 3 * time.Second, Warmup: time.Second,
		Drain: 40 * time.Second, Producers: 2, Consumers: 2, Batch: 20, ClaimMax: 50, ProduceRate: 1500, ConsumeRate: 3000,
		Payload: Dist{Kind: "uniform", A: 50, B: 150}, Visibility: 2 * time.Second, Wait: 200 * time.Millisecond}
}

func checkPassed(t *testing.T, rep *Report) {
	t.Helper()
	if !rep.Summary.Passed || rep.Summary.Lost != 0 || rep.Summary.Duplicated != 0 {
		t.Fatalf("run failed: %+v\n%s", rep.Summary, rep.Markdown())
	}
}

// The quarterly scenario, small: everything produced is consumed once, on
// the router and on the baseline, and the reports say so.
func TestMixedRouterAndBaseline(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed)
	cfg := e.small(ScenarioMixed)
	cfg.Baseline = true
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkPassed(t, rep)
	if len(rep.Verification) != 2 {
		t.Fatalf("verified %d workloads, want router and baseline", len(rep.Verification))
	}
	for _, v := range rep.Verification {
		if v.Mode != "consumed" || v.Acknowledged == 0 || v.Consumed != v.Acknowledged || v.Expected != v.Acknowledged {
			t.Fatalf("%s: %+v", v.Workload, v)
		}
	}
	if _, ok := rep.Ratios["produce"]; !ok {
		t.Fatalf("no produce ratio: %v", rep.Ratios)
	}
	if _, ok := rep.Ratios["consume"]; !ok {
		t.Fatalf("no consume ratio: %v", rep.Ratios)
	}
	p := rep.Phases[0]
	if p.Target != "router" || p.Produce.PerSecond <= 0 || p.Consume.PerSecond <= 0 || p.Produce.Latency.Count == 0 {
		t.Fatalf("router phase: %+v", p)
	}
	if len(p.Clusters) != 2 || p.Clusters[0].Produced == 0 || p.Clusters[1].Produced == 0 {
		t.Fatalf("per-cluster distribution: %+v", p.Clusters)
	}
	// The open-loop schedule (1500/s for 3 s) caps what is sent.
	if p.Offered > 4500 {
		t.Fatalf("%d messages sent, above the 4500 of the schedule", p.Offered)
	}

	dir := t.TempDir()
	if err := rep.Write(dir); err != nil {
		t.Fatal(err)
	}
	var back Report
	data, _ := os.ReadFile(filepath.Join(dir, "report.json"))
	if err := json.Unmarshal(data, &back); err != nil || back.RunID != rep.RunID {
		t.Fatalf("report.json: %v", err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	for _, want := range []string{"**PASSED**", "| produce |", "p99.9"} {
		if !strings.Contains(string(md), want) {
			t.Fatalf("report.md lacks %q:\n%s", want, md)
		}
	}
	last := rep.SummaryLines()[len(rep.SummaryLines())-1]
	if !regexp.MustCompile(`^lost: 0, duplicated: 0, produced/s: \d+, consumed/s: \d+$`).MatchString(last) {
		t.Fatalf("last line %q", last)
	}
}

// Repeated keys are answered duplicate and never delivered; poison keys
// end dead-lettered; nacked and dropped deliveries come back and are told
// apart from true duplicates; two subscriptions each get everything.
func TestDedupDeadLettersAndRedeliveries(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed)
	cfg := e.small(ScenarioDeadletter)
	cfg.Subscriptions, cfg.Consumers = 2, 2
	cfg.DupShare, cfg.NackShare, cfg.RetryShare, cfg.DropShare = 0.3, 0.1, 0.1, 0.05
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkPassed(t, rep)
	v := rep.Verification[0]
	if v.Dead == 0 || v.DeadUnexpected != 0 || v.RedeliveredAfterNack == 0 || v.RedeliveredAfterExpiry == 0 {
		t.Fatalf("dead letters and redeliveries not seen: %+v", v)
	}
	if v.Expected != 2*v.Acknowledged || v.Consumed+v.Dead+v.AckUnknown != v.Expected {
		t.Fatalf("books do not balance: %+v", v)
	}
	if rep.Phases[0].Statuses["duplicate"] == 0 {
		t.Fatalf("no duplicate answers with a 30 %% repeat share: %v", rep.Phases[0].Statuses)
	}
}

// bench-produce ends with the line its make target promises.
func TestBenchProduceRatioLine(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed)
	cfg := e.small(ScenarioBenchProduce)
	cfg.Rounds, cfg.Duration, cfg.Warmup, cfg.SingleClients, cfg.AsyncCount = 1, 1500*time.Millisecond, 500*time.Millisecond, 4, 3000
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkPassed(t, rep)
	lines := rep.SummaryLines()
	if last := lines[len(lines)-1]; !regexp.MustCompile(`^produce ratio router/baseline: \d+\.\d\d$`).MatchString(last) {
		t.Fatalf("last line %q", last)
	}
	if _, ok := rep.Ratios["single_vs_batched_baseline"]; !ok {
		t.Fatalf("no single-message ratio: %v", rep.Ratios)
	}
	// The Go client's phases: their messages were produced and verified
	// (the books are checked by checkPassed), and their ratios are the
	// lines before the last.
	if v, ok := rep.Ratios["client_single_vs_router_batched"]; !ok || v <= 0 {
		t.Fatalf("no client single-message ratio: %v", rep.Ratios)
	}
	if line := lines[len(lines)-3]; !regexp.MustCompile(`^client single-message ratio: \d+\.\d\d$`).MatchString(line) {
		t.Fatalf("third line from the end %q", line)
	}
	if v, ok := rep.Ratios["client_async_vs_router_batched"]; !ok || v <= 0 {
		t.Fatalf("no client async ratio: %v", rep.Ratios)
	}
	if line := lines[len(lines)-2]; !regexp.MustCompile(`^client async ratio: \d+\.\d\d$`).MatchString(line) {
		t.Fatalf("line before the last %q", line)
	}
	// The async phase: one goroutine published exactly AsyncCount new
	// keys, every one stored, verified under its own name.
	found := false
	for _, ph := range rep.Phases {
		if ph.Name != "client async #1" {
			continue
		}
		found = true
		if ph.Target != "client" || ph.Producers != 1 || ph.Offered != 3000 || ph.Produce.Messages != 3000 || ph.Produce.Requests == 0 {
			t.Fatalf("async phase: target %s, %d producers, %d offered, %d stored in %d requests", ph.Target, ph.Producers, ph.Offered, ph.Produce.Messages, ph.Produce.Requests)
		}
	}
	for _, v := range rep.Verification {
		if v.Workload == "client async" && v.Acknowledged != 3000 {
			t.Fatalf("client async verification: %+v", v)
		}
	}
	if !found {
		t.Fatal("no client async phase")
	}
}

// bench-consume drains the same backlog through the router and the
// baseline.
func TestBenchConsumeRatioLine(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed)
	cfg := e.small(ScenarioBenchConsume)
	cfg.Rounds, cfg.Preload, cfg.SQSPreload = 1, 2000, 300
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkPassed(t, rep)
	for _, v := range rep.Verification {
		if v.Acknowledged != 2000 || v.Consumed != 2000 {
			t.Fatalf("%s: %+v", v.Workload, v)
		}
	}
	lines := rep.SummaryLines()
	if last := lines[len(lines)-1]; !regexp.MustCompile(`^consume ratio router/baseline: \d+\.\d\d$`).MatchString(last) {
		t.Fatalf("last line %q", last)
	}
	// The SQS leg drained its backlog through the SQS API and the
	// router's own API alike.
	if line := lines[len(lines)-2]; !regexp.MustCompile(`^sqs consume ratio sqs/native: \d+\.\d\d$`).MatchString(line) {
		t.Fatalf("line before the last %q", line)
	}
	for _, side := range []string{"sqs", "native"} {
		if res, ok := (&runner{report: rep}).find(sqsFigure, side); !ok || res.Messages != 300 {
			t.Fatalf("%s leg: %+v", side, res)
		}
	}
	// The report says how the servers were sized, read from them.
	servers := regexp.MustCompile(`^servers: MariaDB .*innodb_buffer_pool_size \d+ [MG]iB, innodb_log_file_size \d+ [MG]iB, max_connections \d+`)
	found := false
	for _, l := range lines {
		found = found || servers.MatchString(l)
	}
	if !found || !strings.Contains(rep.Markdown(), "- servers: MariaDB") {
		t.Fatalf("no servers line in %q", lines)
	}
}

// Killing a primary mid-run loses no acknowledged message: its items are
// unavailable, resent with the same keys, and consumed once after the
// restart; the report shows the kill, the restart and the recovery.
func TestKillPrimaryLosesNothing(t *testing.T) {
	testbed.Need(t)
	if testing.Short() {
		t.Skip("starts a bed of its own")
	}
	t.Parallel()
	ctx := context.Background()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 2, NoReplicas: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	e := setupOn(t, own)
	cfg := e.small(ScenarioMixed)
	cfg.Duration, cfg.Warmup = 7*time.Second, time.Second
	cfg.Fault = BedFault{Bed: own, Inst: own.Clusters[0].Primary}
	cfg.FaultAt, cfg.FaultDown = 2*time.Second, 1500*time.Millisecond
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkPassed(t, rep)
	p := rep.Phases[0]
	if len(p.Faults) != 2 || p.Faults[0].Action != "kill -9" || p.Faults[1].Action != "restart" {
		t.Fatalf("faults: %+v", p.Faults)
	}
	if p.Errors["item_unavailable"] == 0 && p.Errors["unavailable"] == 0 {
		t.Fatalf("no unavailable items while c1 was down: %v", p.Errors)
	}
	if len(p.Recovery) == 0 {
		t.Fatalf("no recovery figures: %s", fmt.Sprint(p.Timeline))
	}
	if v := rep.Verification[0]; v.Acknowledged == 0 || v.Consumed+v.AckUnknown != v.Acknowledged {
		t.Fatalf("books: %+v", v)
	}
}

// startRouter serves a router over the topology at path on an address of
// its own, which it also gives other routers as its owners' address
// (docs/consume.md, "Owners"): with two routers, each forwards a unit's
// acks to the router that holds its leases in memory.
func startRouter(t *testing.T, path string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := server.New(context.Background(), server.Config{TopologyFile: path, Listen: ln.Addr().String()})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(r.Handler())
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(func() { srv.Close(); r.Close() })
	return srv.URL
}
