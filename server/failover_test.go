package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/shard"
)

// outcome is one request of the fault test's load.
type outcome struct {
	cluster string
	op      string // produce, claim, ack
	status  string
	start   time.Time
	took    time.Duration
	key     string
}

// Kill -9 one cluster's primary under mixed produce/claim/ack load: the
// other cluster keeps full service, the dead cluster's requests fail fast,
// and once its replica is promoted in the topology file the router switches
// to it and it serves again, with no acknowledged message lost.
func TestKillPrimaryFailsFastThenFailsOver(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 2, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	var topoPath string
	refused := &countingHandler{match: "topology change not applied"}
	e := setupOn(t, own, func(c *Config) {
		fastHA(c)
		c.ReloadEvery = 100 * time.Millisecond
		c.Broker.ReplicatedTimeout = 500 * time.Millisecond
		c.Log = slog.New(refused)
		topoPath = c.TopologyFile
	})
	rctx, cancel := context.WithCancel(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- e.r.Run(rctx, ln) }() // follows the topology file
	t.Cleanup(func() { cancel(); <-ran })

	other, victim := own.Clusters[0], own.Clusters[1]
	var (
		mu    sync.Mutex
		log   []outcome
		phase atomic.Int32 // 0 healthy, 1 victim dead, 2 switched
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	record := func(o outcome) {
		mu.Lock()
		log = append(log, o)
		mu.Unlock()
	}
	count := func(f func(outcome) bool) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, o := range log {
			if f(o) {
				n++
			}
		}
		return n
	}
	keyFor := func(cluster string, w int, i *int) string {
		for {
			*i++
			k := fmt.Sprintf("fo-%d-%d", w, *i)
			if e.owner(shard.Of(k)) == cluster {
				return k
			}
		}
	}
	for w, c := range []string{other.Name, other.Name, victim.Name, victim.Name} {
		wg.Go(func() {
			i := 0
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := keyFor(c, w, &i)
				// Replicated durability: an answered message is on the
				// replica that will be promoted. After the failover the
				// victim has no replica left.
				dur := "replicated"
				if c == victim.Name && phase.Load() == 2 {
					dur = "primary"
				}
				start := time.Now()
				_, _, out := e.post(t, "/v1/topics/fo/messages", map[string]any{"messages": []any{msg(key, w)}, "durability": dur})
				r := results(t, out)[0]
				record(outcome{cluster: c, op: "produce", status: r["status"].(string), start: start, took: time.Since(start), key: key})
			}
		})
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			st, body := e.do(t, "POST", "/v1/topics/fo/subscriptions/default/claim", map[string]any{"max": 20, "wait_ms": 100})
			record(outcome{op: "claim", status: fmt.Sprint(st), start: start, took: time.Since(start)})
			msgs, _ := body["messages"].([]any)
			if len(msgs) == 0 {
				continue
			}
			var receipts []any
			var owners []string
			for _, m := range msgs {
				m := m.(map[string]any)
				receipts = append(receipts, m["receipt"])
				owners = append(owners, e.owner(shard.ID(m["vshard"].(float64))))
			}
			start = time.Now()
			_, _, out := e.post(t, "/v1/ack", map[string]any{"receipts": receipts})
			for j, r := range results(t, out) {
				record(outcome{cluster: owners[j], op: "ack", status: r["status"].(string), start: start, took: time.Since(start)})
			}
		}
	})
	created := func(cluster string, after time.Time) int {
		return count(func(o outcome) bool {
			return o.cluster == cluster && o.op == "produce" && o.status == "created" && !o.start.Before(after)
		})
	}
	waitFor(t, 30*time.Second, func() bool { return created(other.Name, time.Time{}) > 100 && created(victim.Name, time.Time{}) > 100 })

	// A victim message to trace while its primary is dead.
	var traced string
	mu.Lock()
	for _, o := range log {
		if o.cluster == victim.Name && o.status == "created" {
			traced = o.key
			break
		}
	}
	mu.Unlock()

	if err := own.Kill(victim.Primary); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	phase.Store(1)
	failed := func(after time.Time) int {
		return count(func(o outcome) bool {
			return o.cluster == victim.Name && o.op == "produce" && o.status == "unavailable" && !o.start.Before(after)
		})
	}
	waitFor(t, 20*time.Second, func() bool { return failed(killed) > 50 && time.Since(killed) > 1500*time.Millisecond })

	// The dead primary's breaker is open in the admin view, and reads of
	// its cluster are served by its replica.
	waitFor(t, 5*time.Second, func() bool {
		_, top := e.do(t, "GET", "/v1/admin/topology", nil)
		for _, c := range top["clusters"].([]any) {
			c := c.(map[string]any)
			p := c["endpoints"].([]any)[0].(map[string]any)
			if c["name"] == victim.Name {
				return p["breaker"] != "closed" && p["health"] == "unreachable"
			}
		}
		return false
	})
	if st, tr := e.trace(t, "fo", traced, ""); st != 200 || tr["read_from"] != "replica" {
		t.Fatalf("trace on the dead cluster: %d %v", st, tr)
	}

	// Fail over: name the replica primary in the file. While it is still
	// read-only the router refuses it (and keeps retrying); once promoted
	// it switches.
	data, err := os.ReadFile(topoPath)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(data), fmt.Sprintf("primary: %q\n    replicas:\n      - %q\n", victim.Primary.DSN(e.name), victim.Replicas[0].DSN(e.name)),
		fmt.Sprintf("primary: %q\n", victim.Replicas[0].DSN(e.name)), 1)
	if text == string(data) {
		t.Fatalf("topology file not as expected:\n%s", data)
	}
	if err := os.WriteFile(topoPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return refused.count.Load() >= 2 })
	if created(victim.Name, killed) > 0 {
		t.Fatal("the router wrote to a read-only replica named primary")
	}
	phase.Store(2)
	// Taken before the promotion: a request that starts while it
	// completes may rightly be created on the new primary.
	edited := time.Now()
	if err := own.Promote(ctx, victim.Replicas[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return created(victim.Name, edited) > 0 })
	var back time.Time
	mu.Lock()
	for _, o := range log {
		if o.cluster == victim.Name && o.op == "produce" && o.status == "created" && !o.start.Before(edited) {
			back = o.start.Add(o.took)
			break
		}
	}
	mu.Unlock()
	waitFor(t, 10*time.Second, func() bool { return created(victim.Name, back) > 50 })
	close(stop)
	wg.Wait()

	// The other cluster never failed.
	bad := count(func(o outcome) bool {
		switch o.op {
		case "produce":
			return o.cluster == other.Name && o.status != "created"
		case "ack":
			return o.cluster == other.Name && o.status != "ok"
		}
		return o.status != "200"
	})
	if bad > 0 {
		mu.Lock()
		for _, o := range log {
			if (o.cluster == other.Name || o.op == "claim") && o.status != "created" && o.status != "ok" && o.status != "200" {
				t.Errorf("healthy side failed: %+v", o)
			}
		}
		mu.Unlock()
		t.Fatalf("%d requests of the healthy cluster failed", bad)
	}
	// The dead cluster failed fast while it was dead.
	var lat []time.Duration
	mu.Lock()
	for _, o := range log {
		if o.cluster == victim.Name && o.op == "produce" && !o.start.Before(killed) && o.start.Before(edited) {
			if o.status == "created" {
				t.Errorf("created on a dead primary: %+v", o)
			}
			lat = append(lat, o.took)
		}
	}
	mu.Unlock()
	slices.Sort(lat)
	p99 := lat[len(lat)*99/100]
	if p99 > time.Second {
		t.Fatalf("dead cluster's requests: p99 %v over %d requests (max %v); want under 1s", p99, len(lat), lat[len(lat)-1])
	}
	// No acknowledged message lost: every created key is on its cluster's
	// primary in use (the promoted replica for the victim).
	stored := storedKeys(t, e.name, other.Primary, victim.Replicas[0])
	lost := 0
	for _, o := range log {
		if o.op == "produce" && o.status == "created" && !stored[o.key] {
			lost++
			t.Errorf("%s (%s) answered created at %v but not stored", o.key, o.cluster, o.start)
		}
	}
	if lost > 0 {
		t.FailNow()
	}
	t.Logf("healthy cluster: %d produced, %d acked, %d claims; dead cluster: %d requests failed, p99 %v, max %v; "+
		"read-only replica refused %d times; serving again %v after its promotion; %d produced on the new primary",
		created(other.Name, time.Time{}), count(func(o outcome) bool { return o.cluster == other.Name && o.op == "ack" }),
		count(func(o outcome) bool { return o.op == "claim" }), len(lat), p99, lat[len(lat)-1], refused.count.Load(),
		back.Sub(edited).Round(time.Millisecond), created(victim.Name, edited))
}

// countingHandler counts log records whose message contains match.
type countingHandler struct {
	match string
	count atomic.Int64
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		h.count.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
