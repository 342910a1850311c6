package server

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/consuldouble"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/rebalance"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/consul"
)

// Tests of the shard fence (store/shard_fence.go, docs/resharding.md
// "Fencing"): a router whose shard map is older than a cluster's fence
// writes nothing there and answers no created or duplicate for it; a
// router does not start on a map older than its clusters' records; a job
// in cleanup deletes only what the source's own record gives away.

// frozenSource is a topology source stuck at one topology: a router that
// never learns of a new map (frozen through a whole reshard, or cut off
// from its topology store). It is not a Backend, so such a router runs
// no resharding jobs, and no barrier waits for it.
type frozenSource struct{ top *topology.Topology }

func (f frozenSource) Load(context.Context) (*topology.Topology, error) { return f.top, nil }
func (f frozenSource) Watch(ctx context.Context, _ func(*topology.Topology)) {
	<-ctx.Done()
}

// startStaleRouter starts a second router over e's clusters that keeps
// e's current topology for good.
func startStaleRouter(t *testing.T, e *env, tune func(*Config)) *env {
	t.Helper()
	top, err := topology.LoadFile(e.r.cfg.TopologyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Source: frozenSource{top}, Listen: ln.Addr().String(), ReloadEvery: 50 * time.Millisecond}
	cfg.Broker.Receipts = testReceipts
	cfg.Broker.RecentKeys = -1
	if tune != nil {
		tune(&cfg)
	}
	r, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &env{name: e.name, url: "http://" + ln.Addr().String(), r: r, dbs: e.dbs}
	s.owner = func(v shard.ID) string { c, _ := r.table.Load().Lookup(v); return c }
	rctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- r.Run(rctx, ln) }()
	var once sync.Once
	s.stop = func() { once.Do(func() { cancel(); <-ran }) }
	t.Cleanup(s.stop)
	return s
}

// fenceLoad produces through some routers and consumes through others
// while a job runs, and records what a client may rely on: a key
// acknowledged (created or duplicate) always answers the same id — a
// `created` with another id means the key was stored twice —, every item
// answers created, duplicate or unavailable, and an ack within the
// lease (60 s, longer than the test) answers ok or unavailable, never
// not_found or lease_lost. Each producer also sends again some keys it
// had acknowledged.
type fenceLoad struct {
	topic string

	mu          sync.Mutex
	ids         map[string]string // acknowledged key → message id
	acked       map[string]bool   // message ids acked
	unavailable map[string]int    // produce items answered unavailable, by router
	lapsed      int               // acks answered after their lease could have run out (slow runs)
	violations  []string

	stop sync.Once
	quit chan struct{}
	wg   sync.WaitGroup
}

func startFenceLoad(topic string, producers, consumers []*env) *fenceLoad {
	l := &fenceLoad{topic: topic, ids: map[string]string{}, acked: map[string]bool{}, unavailable: map[string]int{}, quit: make(chan struct{})}
	for i, p := range producers {
		l.wg.Add(1)
		go l.produce(p, i)
	}
	for i, c := range consumers {
		l.wg.Add(1)
		go l.consume(c, i)
	}
	return l
}

func (l *fenceLoad) violate(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.violations) < 50 {
		l.violations = append(l.violations, fmt.Sprintf(format, args...))
	}
}

func (l *fenceLoad) done() bool {
	select {
	case <-l.quit:
		return true
	default:
		return false
	}
}

func (l *fenceLoad) produce(e *env, p int) {
	defer l.wg.Done()
	ctx := context.Background()
	var mine []string // acknowledged keys of this producer
	for seq := 0; !l.done(); {
		var keys []string
		for len(keys) < 10 {
			keys = append(keys, fmt.Sprintf("f-%d-%d", p, seq))
			seq++
		}
		for i := 0; i < 5 && len(mine) > 0; i++ {
			keys = append(keys, mine[(seq*7+i*13)%len(mine)])
		}
		var msgs []any
		for _, k := range keys {
			msgs = append(msgs, msg(k, map[string]any{"k": k}))
		}
		st, body, err := e.call(ctx, "POST", "/v1/topics/"+l.topic+"/messages", map[string]any{"messages": msgs})
		if err != nil || st != 200 {
			continue
		}
		refused := false
		for i, r := range body["results"].([]any) {
			res := r.(map[string]any)
			k := keys[i]
			switch res["status"] {
			case "created", "duplicate":
				id := res["id"].(string)
				l.mu.Lock()
				prev, ok := l.ids[k]
				if !ok {
					l.ids[k] = id
					mine = append(mine, k)
				}
				l.mu.Unlock()
				if ok && prev != id {
					l.violate("key %s (vshard %d) answered %s with id %s through %s; acknowledged before with id %s", k, shard.Of(k), res["status"], id, e.url, prev)
				}
			case "unavailable":
				l.mu.Lock()
				l.unavailable[e.url]++
				l.mu.Unlock()
				refused = true
			default:
				l.violate("produce %s through %s: %v", k, e.url, res)
			}
		}
		// A steady, modest rate: the test is about where writes land,
		// and it runs beside the whole suite under -race.
		time.Sleep(10 * time.Millisecond)
		if refused {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (l *fenceLoad) consume(e *env, c int) {
	defer l.wg.Done()
	ctx := context.Background()
	for !l.done() {
		st, body, err := e.call(ctx, "POST", "/v1/topics/"+l.topic+"/subscriptions/default/claim",
			map[string]any{"max": 50, "visibility_timeout_ms": 60000, "wait_ms": 100, "consumer": fmt.Sprint("w", c)})
		if err != nil || st != 200 {
			continue
		}
		claimed := time.Now()
		var receipts []any
		ids := map[string]string{}
		for _, m := range body["messages"].([]any) {
			msg := m.(map[string]any)
			receipts = append(receipts, msg["receipt"])
			ids[msg["receipt"].(string)] = msg["id"].(string)
		}
		// Ack until every receipt has an answer other than unavailable,
		// for 30 s at most (a router cut off for good: its leases lapse
		// and are delivered again, at least once).
		for tries := 0; len(receipts) > 0 && tries < 1500; tries++ {
			st, body, err := e.call(ctx, "POST", "/v1/ack", map[string]any{"receipts": receipts})
			if err != nil || st != 200 {
				continue
			}
			var again []any
			for i, r := range body["results"].([]any) {
				res := r.(map[string]any)
				id := ids[receipts[i].(string)]
				switch res["status"] {
				case "ok":
					l.mu.Lock()
					l.acked[id] = true
					l.mu.Unlock()
				case "unavailable":
					again = append(again, receipts[i])
				default:
					if time.Since(claimed) < 50*time.Second { // the lease is 60 s
						l.violate("ack of message %s through %s within its lease (claimed %v before): %v", id, e.url, time.Since(claimed).Round(time.Millisecond), res)
					} else {
						l.mu.Lock()
						l.lapsed++
						l.mu.Unlock()
					}
				}
			}
			receipts = again
			if len(again) > 0 {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}

// end stops the load and waits for it.
func (l *fenceLoad) end() {
	l.stop.Do(func() { close(l.quit) })
	l.wg.Wait()
}

// checkExactlyOnce checks the clusters' tables: every acknowledged key
// has exactly one message_key row and one message_store row over all
// clusters, with its acknowledged id, on the cluster the final map gives
// its vshard.
func checkExactlyOnce(t *testing.T, e *env, l *fenceLoad) {
	t.Helper()
	type row struct{ cluster, id string }
	keys := map[string][]row{}
	stored := map[string][]string{} // message id → clusters
	for name, db := range e.dbs {
		rows, err := db.Query("SELECT msg_key, message_id FROM message_key WHERE topic = ?", l.topic)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k, id string
			if err := rows.Scan(&k, &id); err != nil {
				t.Fatal(err)
			}
			keys[k] = append(keys[k], row{name, id})
		}
		rows.Close()
		ids, err := queryStrings(db, "SELECT CAST(id AS CHAR) FROM message_store WHERE topic = ?", l.topic)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			stored[id] = append(stored[id], name)
		}
	}
	bad := 0
	for k, id := range l.ids {
		owner := e.owner(shard.Of(k))
		got := keys[k]
		switch {
		case len(got) != 1 || got[0].id != id || got[0].cluster != owner:
			bad++
			if bad <= 10 {
				t.Errorf("key %s (vshard %d, owned by %s) acknowledged with id %s: message_key rows %v", k, shard.Of(k), owner, id, got)
			}
		case len(stored[id]) != 1 || stored[id][0] != owner:
			bad++
			if bad <= 10 {
				t.Errorf("message %s (key %s, vshard %d, owned by %s) stored on %v", id, k, shard.Of(k), owner, stored[id])
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d acknowledged keys not stored exactly once where the map puts them", bad, len(l.ids))
	}
}

func queryStrings(db *sql.DB, q string, args ...any) ([]string, error) {
	rows, err := db.Query(q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// drainAndResend checks, through e (a router with the current map), that
// every acknowledged key is a duplicate of its id, and that every
// acknowledged message is delivered, once, and acked.
func drainAndResend(t *testing.T, e *env, l *fenceLoad) {
	t.Helper()
	var keys []string
	for k := range l.ids {
		keys = append(keys, k)
	}
	// unavailable means "retry" (a breaker, a slow run): the helpers
	// below retry it, and judge every other answer. The time allowed is
	// the test's own (a -race run beside the whole suite is slow).
	deadline := time.Now().Add(5 * time.Minute)
	if d, ok := t.Deadline(); ok {
		deadline = d.Add(-30 * time.Second)
	}
	for len(keys) > 0 && time.Now().Before(deadline) {
		batch := keys[:min(500, len(keys))]
		keys = keys[len(batch):]
		var msgs []any
		for _, k := range batch {
			msgs = append(msgs, msg(k, map[string]any{"k": k}))
		}
		_, _, body := e.post(t, "/v1/topics/"+l.topic+"/messages", map[string]any{"messages": msgs})
		for j, r := range results(t, body) {
			switch {
			case r["status"] == "unavailable":
				keys = append(keys, batch[j])
			case r["status"] != "duplicate" || r["id"] != l.ids[batch[j]]:
				t.Fatalf("acknowledged key %s sent again: %v, want duplicate of %s", batch[j], r, l.ids[batch[j]])
			}
		}
	}
	if len(keys) > 0 {
		t.Fatalf("%d acknowledged keys still unavailable at the test's deadline", len(keys))
	}
	want := map[string]bool{}
	for _, id := range l.ids {
		want[id] = true
	}
	seen := map[string]bool{}
	for time.Now().Before(deadline) {
		left := 0
		for id := range want {
			if !l.acked[id] && !seen[id] {
				left++
			}
		}
		if left == 0 {
			return
		}
		got := e.claim(t, l.topic, "default", map[string]any{"max": 500, "visibility_timeout_ms": 120000, "wait_ms": 200})
		for _, m := range got {
			id := m["id"].(string)
			if seen[id] {
				t.Fatalf("message %s delivered twice while draining", id)
			}
			seen[id] = true
		}
		receipts := make([]any, len(got))
		for i, m := range got {
			receipts[i] = m["receipt"]
		}
		for len(receipts) > 0 && time.Now().Before(deadline) {
			_, _, body := e.post(t, "/v1/ack", map[string]any{"receipts": receipts})
			var again []any
			for i, r := range results(t, body) {
				switch r["status"] {
				case "ok":
				case "unavailable":
					again = append(again, receipts[i])
				default:
					t.Fatalf("ack while draining: %v", r)
				}
			}
			receipts = again
		}
	}
	n := 0
	for id := range want {
		if l.acked[id] || seen[id] {
			continue
		}
		if n++; n > 5 {
			break
		}
		for name, db := range e.dbs {
			var state string
			err := db.QueryRow(`SELECT CONCAT_WS(' ', 'vshard', vshard, 'available_at', available_at, 'attempts', attempts, 'locked_by', IFNULL(locked_by, '-'),
				'token', claim_token, 'dead', is_dead, 'parked', parked) FROM message_queue WHERE message_id = ?`, id).Scan(&state)
			if err == nil {
				t.Logf("message %s on %s: %s (now %s)", id, name, state, time.Now().UTC().Format(time.RFC3339Nano))
			}
			var status string
			if err := db.QueryRow("SELECT CAST(msg_status AS CHAR) FROM message_store WHERE id = ?", id).Scan(&status); err == nil {
				t.Logf("message %s stored on %s, status %s", id, name, status)
			}
		}
	}
	t.Fatal("acknowledged messages not delivered by the test's deadline")
}

// (b) A router that never learns of the move (frozen through the copy
// and the cut-over, still writing in cleanup and after) keeps producing,
// new keys and keys it had acknowledged, through the whole job: once the
// source is fenced its writes there are refused (unavailable), not lost
// and not stored twice; it reports the mismatch on /readyz; and every
// acknowledged key is stored exactly once where the final map puts it.
func TestFenceRefusesRouterWithFrozenMap(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	// The current router owns every unit of delivery state (it was
	// there first and hands none over): this test is about a stale
	// router's writes; TestFenceRouterCutOffFromConsul has the stale
	// router serve consumers too.
	// The routers' warnings are printed when the test fails: a lease
	// lost across the move names its cause there (a write-out that
	// failed, a unit taken over).
	logs := warningsOnFailure(t)
	e := setupReshard(t, func(c *Config) {
		c.Reshard.BatchRows, c.Reshard.RowsPerSecond = 100, 3000
		c.Broker.Owners.HandOverAfter = time.Hour
		c.Log = logs.logger("current")
	})
	s := startStaleRouter(t, e, func(c *Config) {
		c.Broker.Owners.HandOverAfter = time.Hour
		c.Log = logs.logger("stale")
	})
	const topic = "fence-frozen"
	var pre []any
	for i := 0; i < 500; i++ {
		pre = append(pre, msg(fmt.Sprint("pre-", i), i))
	}
	_, _, body := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": pre})
	if len(results(t, body)) != 500 {
		t.Fatal("prefill")
	}
	l := startFenceLoad(topic, []*env{s, e}, []*env{e})
	defer l.end()

	job := e.reshard(t, []map[string]any{{"from": 0, "to": 255, "target": "c2"}})
	if job["state"] != "done" {
		t.Fatalf("job %v", job)
	}
	// The stale router goes on writing after cleanup deleted the source's
	// rows: its writes for c1 must stay refused.
	time.Sleep(500 * time.Millisecond)
	st, ready := s.do(t, "GET", "/readyz", nil)
	l.end()

	detail, _ := ready["detail"].(map[string]any)
	if st != 503 || detail["topology_stale"] != true {
		t.Errorf("stale router's /readyz: %d %v, want 503 with topology_stale", st, ready)
	}
	if f, ok := detail["fence"].(map[string]any); !ok || f["cluster"] != "c1" || f["stale"] != true {
		t.Errorf("stale router's /readyz names no fence of c1: %v", detail["fence"])
	}
	if s.owner(100) != "c1" || e.owner(100) != "c2" {
		t.Fatalf("vshard 100: stale router routes to %s, current router to %s", s.owner(100), e.owner(100))
	}
	l.mu.Lock()
	refused := l.unavailable[s.url]
	l.mu.Unlock()
	if refused == 0 {
		t.Error("the stale router was never refused: the test did not exercise the fence")
	}
	for _, v := range l.violations {
		t.Error(v)
	}
	checkExactlyOnce(t, e, l)
	// The stale router goes (an operator restarts it on the current map);
	// units of delivery state it may hold (taken while the current
	// router's lease lapsed on a loaded machine) come back to the current
	// one, which delivers everything acknowledged.
	s.stop()
	drainAndResend(t, e, l)
	t.Logf("%d keys acknowledged, %d produce items refused through the stale router, %d acks answered after 50 s; job rows_copied %v, max_pause_ms %v",
		len(l.ids), refused, l.lapsed, job["rows_copied"], job["max_pause_ms"])
}

// (c) The router is killed while its job cleans up, and started again on
// the topology file of before the move (version 1: a restored file, a
// regenerated sandbox). It refuses the map, naming both versions, and the
// source keeps every row the job had not deleted yet; on the file the
// job wrote it starts and finishes the cleanup. A job in cleanup whose
// source's record no longer gives it the vshards deletes nothing.
func TestFenceRefusesOlderStaticMapAfterCrashInCleanup(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	inCleanup, kill := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e := setupReshard(t, func(c *Config) {
		c.Reshard.OnState = func(j *rebalance.Job) {
			if j.State == rebalance.StateCleanup {
				once.Do(func() { close(inCleanup) })
				<-kill
				runtime.Goexit() // the job's runner dies here, before any delete
			}
		}
	})
	path := e.r.cfg.TopologyFile
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const topic = "fence-restart"
	var msgs []any
	for i := 0; i < 600; i++ {
		msgs = append(msgs, msg(fmt.Sprint("rs-", i), i))
	}
	_, _, body := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs})
	if len(results(t, body)) != 600 {
		t.Fatal("prefill")
	}
	st, sub := e.do(t, "POST", "/v1/admin/reshard", map[string]any{"ranges": []any{map[string]any{"from": 0, "to": 511, "target": "c3"}}})
	if st != 202 {
		t.Fatalf("submit: %d %v", st, sub)
	}
	select {
	case <-inCleanup:
	case <-time.After(3 * time.Minute):
		t.Fatal("the job never reached cleanup")
	}
	before := vshardRows(t, e.dbs["c1"], 0, 511)
	if before["message_store"] == 0 {
		t.Fatal("no source rows left to protect")
	}
	resharded, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	close(kill)
	e.stop()

	// Restart on the file of before the move.
	if err := os.WriteFile(path, old, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{TopologyFile: path, ReloadEvery: 50 * time.Millisecond}
	cfg.Reshard.RowsPerSecond = -1
	r, err := New(context.Background(), cfg)
	if err == nil {
		r.Close()
		t.Fatal("a router started on shard map version 1 after its clusters recorded a newer one")
	}
	for _, want := range []string{"version 1 ", "version", path, "put back the file"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	t.Logf("refused: %v", err)
	if after := vshardRows(t, e.dbs["c1"], 0, 511); after["message_store"] != before["message_store"] || after["message_key"] != before["message_key"] {
		t.Fatalf("source rows of the moved vshards: %v after the refused restart, %v before", after, before)
	}

	// The job resumed in cleanup by a runner whose source's record does
	// not give the vshards to the job's target (here: a record that
	// names c1 itself at a newer version, as after a later map) deletes
	// nothing and says why.
	movers := map[string]rebalance.Mover{}
	for _, c := range []string{"c1", "c2", "c3"} {
		st, err := store.Open(context.Background(), dsnOf(t, path, c), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		movers[c] = st
	}
	movers["c1"] = ownRecord{movers["c1"]}
	id := sub["job"].(string)
	state := &topology.FileDoc{Path: path + ".reshard.json"}
	blocked := rebalance.New(rebalance.Config{RowsPerSecond: -1}, state, topology.NewFileBackend(path, 0, nil),
		func() map[string]rebalance.Mover { return movers })
	blocked.Start(context.Background())
	testtime.Until(t, "the blocked job to end", func() bool {
		j, err := blocked.Get(context.Background(), id)
		return err == nil && strings.Contains(j.Error, "nothing deleted")
	})
	blocked.Stop()
	if j, _ := blocked.Get(context.Background(), id); j.State != rebalance.StateCleanup {
		t.Fatalf("job %s with the source's record against it: %s (%s)", id, j.State, j.Error)
	}
	if after := vshardRows(t, e.dbs["c1"], 0, 511); after["message_store"] != before["message_store"] || after["message_key"] != before["message_key"] {
		t.Fatalf("source rows: %v after a cleanup its record forbids, %v before", after, before)
	}

	// On the file the job wrote, the router starts and the job finishes.
	if err := os.WriteFile(path, resharded, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err = New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("restart on the resharded file: %v", err)
	}
	defer r.Close()
	testtime.Until(t, "the job to end after the restart", func() bool {
		j, err := r.reshard.manager.Get(context.Background(), id)
		return err == nil && j.State == rebalance.StateDone
	})
	if after := vshardRows(t, e.dbs["c1"], 0, 511); after["message_store"] != 0 {
		t.Fatalf("after the resumed cleanup c1 keeps %v", after)
	}
	if got := vshardRows(t, e.dbs["c3"], 0, 511); got["message_store"] != before["message_store"] {
		t.Fatalf("c3 holds %v of the moved vshards, c1 held %v", got, before)
	}
}

// dsnOf is cluster's primary DSN in the topology file at path.
func dsnOf(t *testing.T, path, cluster string) string {
	t.Helper()
	top, err := topology.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := top.Clusters[cluster]
	if !ok {
		t.Fatalf("no cluster %s in %s", cluster, path)
	}
	return c.Primary
}

// ownRecord is a source whose owner record gives every vshard to itself
// at a version above any map of the test.
type ownRecord struct{ rebalance.Mover }

func (o ownRecord) VShardOwners(context.Context) ([]store.VShardOwner, error) {
	out := make([]store.VShardOwner, shard.Count)
	for v := range out {
		out[v] = store.VShardOwner{VShard: v, Cluster: "c1", MapVersion: 1000}
	}
	return out, nil
}

// cutProxy forwards TCP connections to target until cut: then it closes
// those open and every new one at once, as a router cut off from its
// Consul agent sees (it still reaches MySQL).
type cutProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			cut := p.cut
			p.mu.Unlock()
			if cut {
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = true, true
			p.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		p.conns = map[net.Conn]bool{}
	}
}

// (a) Two routers on Consul (the double); one is cut off from Consul
// (still reaching MySQL) while the other moves vshards 0-255 from c1 to
// c2, with producers and consumers on both. The cut-off router self-fences
// once its registration is not renewed within two thirds of its TTL — writes and
// claims answered unavailable, the leases it held in memory written to
// the tables, /readyz not ready — and the job's barrier passes without
// it; the clusters' fences refuse it besides. Once it reaches Consul again
// it routes with the current map and writes again. Every acknowledged key
// is stored exactly once where the map puts it, no key acknowledged
// before answers created again, and no ack within its lease answers
// not_found or lease_lost.
func TestFenceRouterCutOffFromConsul(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	database := testbed.TestDatabase(t, bed, "t_fcc_")
	d := consuldouble.New(consuldouble.Options{})
	t.Cleanup(d.Close)
	capi, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range bed.Clusters {
		consulRegister(t, capi, c.Primary, consul.RolePrimary)
	}
	seed, err := consul.New(consul.Config{Address: d.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	m, err := routing.NewMap(1, []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: 1023, Cluster: "c2"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := seed.UpdateShardMap(ctx, 0, m); err != nil {
		t.Fatal(err)
	}
	b := startReshardConsulRouter(t, d.Addr(), database, "router-b")
	testtime.Until(t, "router b leading", b.leading) // b runs the job
	proxy := newCutProxy(t, d.Addr())
	a := startReshardConsulRouter(t, proxy.addr(), database, "router-a")
	t.Logf("router a %s (cut off), router b %s (runs the job)", a.url, b.url)
	for name := range b.r.Stores() {
		db, err := sql.Open("mysql", dsnOfStore(t, b, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		b.dbs[name] = db
	}

	const topic = "fence-consul"
	var pre []any
	for i := 0; i < 500; i++ {
		pre = append(pre, msg(fmt.Sprint("pre-", i), i))
	}
	_, _, body := b.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": pre})
	if len(results(t, body)) != 500 {
		t.Fatal("prefill")
	}
	l := startFenceLoad(topic, []*env{a, b}, []*env{a, b})
	defer l.end()
	// Units of delivery state spread over a and b by their names: claims
	// on a few more topics make a own some (each unit goes to the router
	// the members choose for it, half of them a).
	var extra []string
	for i := 0; i < 8; i++ {
		tp := fmt.Sprint(topic, "-x", i)
		extra = append(extra, tp)
		b.post(t, "/v1/topics/"+tp+"/messages", map[string]any{"messages": []any{msg("x", i)}})
		a.do(t, "POST", "/v1/topics/"+tp+"/subscriptions/default/claim", map[string]any{"max": 1, "visibility_timeout_ms": 10000})
	}
	unitsOf := func(e *env) (n int) {
		for _, st := range e.r.broker.Owners().Stats() {
			n += st.Units
		}
		return n
	}
	testtime.Within(t, 30*time.Second, "router a owning units of delivery state", func() bool { return unitsOf(a) > 0 })
	time.Sleep(300 * time.Millisecond) // leases in a's memory before the cut

	st, sub := b.do(t, "POST", "/v1/admin/reshard", map[string]any{"ranges": []any{map[string]any{"from": 0, "to": 255, "target": "c2"}}})
	if st != 202 {
		t.Fatalf("submit: %d %v", st, sub)
	}
	proxy.setCut(true)
	job := b.waitJob(t, sub["job"].(string))
	if job["state"] != "done" {
		t.Fatalf("job %v", job)
	}
	time.Sleep(300 * time.Millisecond) // a goes on being asked to write
	code, ready := a.do(t, "GET", "/readyz", nil)
	detail, _ := ready["detail"].(map[string]any)
	if code != 503 || detail["topology_stale"] != true || detail["self_fenced"] != true {
		t.Errorf("cut-off router's /readyz: %d %v, want 503, topology_stale and self_fenced", code, ready)
	}
	if a.owner(100) != "c1" {
		t.Fatalf("the cut-off router learnt the new map (vshard 100 on %s): the test did not cut it off", a.owner(100))
	}
	// Fenced, a stepped aside from delivery state: it owns no unit, and b
	// serves the consumers of those a had through the cut (the leases a
	// held were written to the table: their deliveries come back when
	// those leases end).
	testtime.Within(t, 30*time.Second, "the cut-off router owning no unit of delivery state", func() bool { return unitsOf(a) == 0 })
	for _, tp := range extra {
		if st, body := b.do(t, "POST", "/v1/topics/"+tp+"/messages", map[string]any{"messages": []any{msg("y", 0)}}); st != 200 {
			t.Fatalf("produce to %s through b: %d %v", tp, st, body)
		}
		// b may still count a among the live routers for a moment after
		// a left them (its view is refreshed every second), and route the
		// unit to a, which refuses: unavailable, retry later. Then b takes
		// the unit. When a wrote its leases out before the job raised the
		// clusters' fence, b serves at once; when the fence came first,
		// a's writes were refused (its map is older) and b waits for a's
		// horizon on the cluster before it hands out anything of the unit:
		// the horizon covers every lease a held there, the load's 60 s
		// leases on the main topic included. The two orders race here.
		testtime.WithinState(t, 90*time.Second, "b serving claims of "+tp+" while a is cut off", func() (bool, string) {
			st, body := b.do(t, "POST", "/v1/topics/"+tp+"/subscriptions/default/claim", map[string]any{"max": 10, "wait_ms": 500})
			ms, _ := body["messages"].([]any)
			return st == 200 && len(ms) > 0, fmt.Sprintf("claim answered %d %v", st, body)
		})
	}

	proxy.setCut(false)
	testtime.Until(t, "router a on the new map and writing again", func() bool { return a.owner(100) == "c2" && !a.r.broker.SelfFenced() })
	time.Sleep(500 * time.Millisecond) // a writes again
	l.end()

	l.mu.Lock()
	refused := l.unavailable[a.url]
	l.mu.Unlock()
	if refused == 0 {
		t.Error("the cut-off router was never refused: the test did not exercise self-fencing")
	}
	for _, v := range l.violations {
		t.Error(v)
	}
	b.owner = func(v shard.ID) string { c, _ := b.r.table.Load().Lookup(v); return c }
	checkExactlyOnce(t, b, l)
	drainAndResend(t, b, l)
	t.Logf("%d keys acknowledged, %d produce items refused through the cut-off router, %d acks answered after 50 s; job rows_copied %v, max_pause_ms %v",
		len(l.ids), refused, l.lapsed, job["rows_copied"], job["max_pause_ms"])
}

// dsnOfStore is the DSN of cluster name's primary as router e uses it.
func dsnOfStore(t *testing.T, e *env, name string) string {
	t.Helper()
	for _, c := range bed.Clusters {
		if c.Name == name {
			return c.Primary.DSN(e.name)
		}
	}
	t.Fatalf("no cluster %s in the bed", name)
	return ""
}

// routerWarnings keeps the warnings of a test's routers.
type routerWarnings struct{ buf syncBuffer }

// warningsOnFailure returns a keeper of routers' warnings that prints
// them when t fails.
func warningsOnFailure(t *testing.T) *routerWarnings {
	w := &routerWarnings{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("routers' warnings:\n%s", w.buf.String())
		}
	})
	return w
}

// logger is a router's logger of warnings and errors, each line naming
// the router.
func (w *routerWarnings) logger(router string) *slog.Logger {
	return slog.New(slog.NewTextHandler(&w.buf, &slog.HandlerOptions{Level: slog.LevelWarn})).With("test_router", router)
}
