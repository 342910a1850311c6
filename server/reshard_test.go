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
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/ctl"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/rebalance"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

// setupReshard starts a router (following its topology file) over three
// clusters: c1 owns vshards 0-511, c2 512-1023, and c3 — a database of
// its own on c1's server, a cluster as far as shardmq can tell — owns
// none yet.
func setupReshard(t *testing.T, tune func(*Config)) *env {
	t.Helper()
	return setupReshardOn(t, tune, false)
}

// setupReshardOn is setupReshard; with replicas each cluster lists its
// server's replicas (c3 those of c1's server, which replicate its
// database too).
func setupReshardOn(t *testing.T, tune func(*Config), replicas bool) *env {
	t.Helper()
	ctx := context.Background()
	name := testbed.TestDatabase(t, bed, "t_rs_")
	name3 := name + "_c3"
	if err := testbed.CreateDatabase(ctx, bed, name3); err != nil {
		t.Fatal(err)
	}
	e := &env{name: name, dbs: map[string]*sql.DB{}}
	dsn := map[string]string{}
	for _, c := range bed.Clusters {
		dsn[c.Name] = c.Primary.DSN(name)
	}
	dsn["c3"] = bed.Clusters[0].Primary.DSN(name3)
	reps := map[string][]string{}
	if replicas {
		for _, c := range bed.Clusters {
			for _, r := range c.Replicas {
				reps[c.Name] = append(reps[c.Name], r.DSN(name))
				if c.Name == bed.Clusters[0].Name {
					reps["c3"] = append(reps["c3"], r.DSN(name3))
				}
			}
		}
	}
	var y strings.Builder
	y.WriteString("clusters:\n")
	for _, c := range []string{"c1", "c2", "c3"} {
		fmt.Fprintf(&y, "  - name: %s\n    primary: %q\n", c, dsn[c])
		if len(reps[c]) > 0 {
			y.WriteString("    replicas:\n")
			for _, r := range reps[c] {
				fmt.Fprintf(&y, "      - %q\n", r)
			}
		}
		db, err := sql.Open("mysql", dsn[c])
		if err != nil {
			t.Fatal(err)
		}
		e.dbs[c] = db
	}
	y.WriteString("shard_map:\n  version: 1\n  ranges:\n    - {from: 0, to: 511, cluster: c1}\n    - {from: 512, to: 1023, cluster: c2}\n")
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{TopologyFile: path, Listen: ln.Addr().String(), ReloadEvery: 50 * time.Millisecond}
	cfg.Broker.RecentKeys = -1 // every duplicate answered by the database, after the move too
	cfg.Reshard.RowsPerSecond = -1
	if tune != nil {
		tune(&cfg)
	}
	r, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.r = r
	e.url = "http://" + ln.Addr().String()
	e.owner = func(v shard.ID) string { c, _ := r.table.Load().Lookup(v); return c }
	rctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- r.Run(rctx, ln) }()
	var once sync.Once
	e.stop = func() { once.Do(func() { cancel(); <-ran }) }
	t.Cleanup(func() {
		e.stop()
		e.dbs["c1"].Exec("DROP DATABASE IF EXISTS `" + name3 + "`")
		e.dbs["c2"].Exec("DROP DATABASE IF EXISTS `" + name3 + "`")
		for _, db := range e.dbs {
			db.Close()
		}
	})
	return e
}

// call is an HTTP round trip that reports errors instead of failing the
// test (load goroutines use it).
func (e *env) call(ctx context.Context, method, path string, body any) (int, map[string]any, error) {
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := testClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("status %d, body %q is not JSON", resp.StatusCode, data)
	}
	return resp.StatusCode, out, nil
}

// reshardLoad produces, claims and acks on one topic while jobs run, and
// checks what a consumer may rely on: every produced message is delivered
// and acked, none is delivered twice (leases are 60 s, longer than the
// test, so a second delivery can only be a broken lease), and a key
// produced again answers its first id.
type reshardLoad struct {
	e     *env
	topic string

	mu         sync.Mutex
	ids        map[string]string // key → message id
	delivered  map[string]int    // message id → deliveries
	acked      map[string]bool
	violations []string
	unavail    int

	stopProduce chan struct{}
	stopConsume chan struct{}
	producers   sync.WaitGroup
	consumers   sync.WaitGroup
}

func startReshardLoad(t *testing.T, e *env, topic string, producers, consumers int) *reshardLoad {
	l := &reshardLoad{e: e, topic: topic, ids: map[string]string{}, delivered: map[string]int{}, acked: map[string]bool{},
		stopProduce: make(chan struct{}), stopConsume: make(chan struct{})}
	for p := 0; p < producers; p++ {
		l.producers.Add(1)
		go l.produce(p)
	}
	for c := 0; c < consumers; c++ {
		l.consumers.Add(1)
		go l.consume(c)
	}
	t.Cleanup(func() { l.stop(t, 0) })
	return l
}

func (l *reshardLoad) violate(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.violations) < 50 {
		l.violations = append(l.violations, fmt.Sprintf(format, args...))
	}
}

func (l *reshardLoad) produce(p int) {
	defer l.producers.Done()
	ctx := context.Background()
	var retry []string
	for seq := 0; ; {
		select {
		case <-l.stopProduce:
			if len(retry) == 0 {
				return
			}
		default:
		}
		keys := retry
		retry = nil
		for len(keys) < 20 {
			select {
			case <-l.stopProduce:
			default:
				keys = append(keys, fmt.Sprintf("rs-%d-%d", p, seq))
				seq++
				continue
			}
			break
		}
		var msgs []any
		for _, k := range keys {
			msgs = append(msgs, msg(k, map[string]any{"k": k}))
		}
		st, body, err := l.e.call(ctx, "POST", "/v1/topics/"+l.topic+"/messages", map[string]any{"messages": msgs})
		if err != nil || st != 200 {
			retry = keys
			continue
		}
		for i, r := range body["results"].([]any) {
			res := r.(map[string]any)
			k := keys[i]
			switch res["status"] {
			case "created", "duplicate":
				id := res["id"].(string)
				l.mu.Lock()
				if prev, ok := l.ids[k]; ok && prev != id {
					l.violations = append(l.violations, fmt.Sprintf("key %s: id %s, then %s", k, prev, id))
				}
				l.ids[k] = id
				l.mu.Unlock()
			case "unavailable":
				l.mu.Lock()
				l.unavail++
				l.mu.Unlock()
				retry = append(retry, k)
			default:
				l.violate("produce %s: %v", k, res)
			}
		}
	}
}

func (l *reshardLoad) consume(c int) {
	defer l.consumers.Done()
	ctx := context.Background()
	for {
		select {
		case <-l.stopConsume:
			return
		default:
		}
		st, body, err := l.e.call(ctx, "POST", "/v1/topics/"+l.topic+"/subscriptions/default/claim",
			map[string]any{"max": 50, "visibility_timeout_ms": 60000, "wait_ms": 100, "consumer": fmt.Sprint("w", c)})
		if err != nil || st != 200 {
			continue
		}
		var receipts []any
		ids := map[string]string{}
		for _, m := range body["messages"].([]any) {
			msg := m.(map[string]any)
			id := msg["id"].(string)
			l.mu.Lock()
			l.delivered[id]++
			if l.delivered[id] > 1 {
				l.violations = append(l.violations, fmt.Sprintf("message %s delivered %d times within its lease", id, l.delivered[id]))
			}
			l.mu.Unlock()
			receipts = append(receipts, msg["receipt"])
			ids[msg["receipt"].(string)] = id
		}
		// Ack until every receipt has an answer other than unavailable
		// (a frozen vshard answers unavailable after the hold).
		for len(receipts) > 0 {
			st, body, err := l.e.call(ctx, "POST", "/v1/ack", map[string]any{"receipts": receipts})
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
					l.violate("ack of message %s within its lease: %v", id, res)
				}
			}
			receipts = again
		}
	}
}

// stop ends production, lets the consumers drain everything produced
// (within d), and stops them. It is safe to call twice.
func (l *reshardLoad) stop(t *testing.T, d time.Duration) {
	select {
	case <-l.stopProduce:
	default:
		close(l.stopProduce)
	}
	l.producers.Wait()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		done := len(l.acked) >= len(l.ids)
		l.mu.Unlock()
		if done {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-l.stopConsume:
	default:
		close(l.stopConsume)
	}
	l.consumers.Wait()
}

// check fails the test on any violation or any produced message not acked.
func (l *reshardLoad) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range l.violations {
		t.Error(v)
	}
	lost := 0
	for k, id := range l.ids {
		if !l.acked[id] {
			if lost < 10 {
				t.Errorf("message %s (key %s, vshard %d) produced but never delivered and acked", id, k, shard.Of(k))
			}
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d messages lost", lost, len(l.ids))
	}
	t.Logf("load: %d messages produced and acked, %d produce items answered unavailable and retried", len(l.ids), l.unavail)
}

// reshard submits ranges and waits until the job ends; it returns the job.
func (e *env) reshard(t *testing.T, ranges []map[string]any, d time.Duration) map[string]any {
	t.Helper()
	st, body := e.do(t, "POST", "/v1/admin/reshard", map[string]any{"ranges": ranges})
	if st != 202 || body["job"] == nil || body["state"] == nil {
		t.Fatalf("POST /v1/admin/reshard: %d %v", st, body)
	}
	return e.waitJob(t, body["job"].(string), d)
}

func (e *env) waitJob(t *testing.T, id string, d time.Duration) map[string]any {
	t.Helper()
	var job map[string]any
	waitFor(t, d, func() bool {
		st, body := e.do(t, "GET", "/v1/admin/reshard/"+id, nil)
		if st != 200 {
			t.Fatalf("GET job: %d %v", st, body)
		}
		job = body
		return rebalance.Terminal(body["state"].(string))
	})
	return job
}

// vshardRows counts each moving table's rows of vshards from..to on db.
func vshardRows(t *testing.T, db *sql.DB, from, to int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, tb := range store.MoveTables() {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM "+tb.Name+" WHERE vshard BETWEEN ? AND ?", from, to).Scan(&n); err != nil {
			t.Fatal(err)
		}
		out[tb.Name] = n
	}
	return out
}

func (e *env) ownerOf(t *testing.T, v int) string {
	t.Helper()
	st, body := e.do(t, "GET", "/v1/admin/shardmap", nil)
	if st != 200 {
		t.Fatalf("shardmap: %d", st)
	}
	for _, r := range body["ranges"].([]any) {
		rg := r.(map[string]any)
		if int(rg["from"].(float64)) <= v && v <= int(rg["to"].(float64)) {
			return rg["cluster"].(string)
		}
	}
	return ""
}

// Two moves of 256 vshards under produce + claim + ack load: between the
// two clusters, then to the third that owned nothing. Nothing acked is
// lost, nothing is delivered twice within its lease, every key produced
// again answers duplicate with its first id, and the source keeps no rows
// of the moved vshards.
func TestReshardMovesUnderLoad(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupReshard(t, nil)
	const topic = "rs-load"
	// Dead letters (with their nack trace) on the vshards that move: they
	// move with them and stay listed.
	e.do(t, "PUT", "/v1/topics/rs-dead/subscriptions/s", map[string]any{"max_attempts": 1})
	var dead []any
	for i := 0; i < 300; i++ {
		dead = append(dead, msg(fmt.Sprint("dead-", i), i))
	}
	e.post(t, "/v1/topics/rs-dead/messages", map[string]any{"messages": dead})
	for n := 0; n < 300; {
		got := e.claim(t, "rs-dead", "s", map[string]any{"max": 300, "wait_ms": 2000})
		if len(got) == 0 {
			t.Fatalf("claimed %d of 300 to kill", n)
		}
		var items []any
		for _, m := range got {
			items = append(items, map[string]any{"receipt": m["receipt"], "error_code": "E_MOVE", "error": "failed"})
		}
		_, _, body := e.post(t, "/v1/nack", map[string]any{"items": items})
		for _, r := range results(t, body) {
			if r["status"] != "dead" {
				t.Fatalf("nack: %v", r)
			}
		}
		n += len(got)
	}
	countDead := func() int {
		st, body := e.do(t, "GET", "/v1/topics/rs-dead/subscriptions/s/dead-letters?limit=1000", nil)
		if st != 200 {
			t.Fatalf("dead letters: %d %v", st, body)
		}
		return len(body["dead_letters"].([]any))
	}
	if n := countDead(); n != 300 {
		t.Fatalf("%d dead letters before the moves", n)
	}

	l := startReshardLoad(t, e, topic, 4, 4)
	waitFor(t, 30*time.Second, func() bool { l.mu.Lock(); defer l.mu.Unlock(); return len(l.acked) > 300 })

	moves := []struct {
		from, to int
		source   string
		target   string
	}{
		{256, 511, "c1", "c2"},
		{0, 255, "c1", "c3"},
	}
	for _, mv := range moves {
		job := e.reshard(t, []map[string]any{{"from": mv.from, "to": mv.to, "target": mv.target}}, 3*time.Minute)
		if job["state"] != "done" || job["error"] != "" {
			t.Fatalf("job %v", job)
		}
		t.Logf("moved %d-%d %s→%s: rows_copied %v of rows_total %v (%v resynced), max_pause_ms %v, %v → %v", mv.from, mv.to, mv.source, mv.target,
			job["rows_copied"], job["rows_total"], job["rows_resynced"], job["max_pause_ms"], job["started_at"], job["finished_at"])
		// Under live load the rows to move grow while they are copied and
		// change after: progress ends at exactly the verified total, never
		// past it, and the rows copied again are counted apart.
		if job["rows_copied"] != job["rows_total"] || job["rows_total"].(float64) == 0 {
			t.Fatalf("a done job's progress: %v of %v rows", job["rows_copied"], job["rows_total"])
		}
		for _, v := range []int{mv.from, mv.to} {
			if got := e.ownerOf(t, v); got != mv.target {
				t.Fatalf("shardmap: vshard %d owned by %s after the move, want %s", v, got, mv.target)
			}
		}
		for table, n := range vshardRows(t, e.dbs[mv.source], mv.from, mv.to) {
			if n != 0 {
				t.Errorf("source %s keeps %d %s rows of the moved vshards", mv.source, n, table)
			}
		}
		rec, err := e.r.Reshard().Get(t.Context(), job["job"].(string))
		if err != nil || rec.Verified["message_store"] == 0 || rec.Verified["message_key"] != rec.Verified["message_store"] {
			t.Fatalf("verified counts %v (%v)", rec.Verified, err)
		}
		t.Logf("verified under freeze: %v", rec.Verified)
	}
	l.stop(t, time.Minute)
	l.check(t)
	if n := countDead(); n != 300 {
		t.Errorf("%d dead letters after the moves, want 300", n)
	}
	resp, err := testClient.Get(e.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{`shardmq_reshard_pause_seconds_count{outcome="flipped"} 2`, "shardmq_frozen_held_requests_total", "shardmq_frozen_vshards 0"} {
		if !strings.Contains(string(metrics), name) {
			t.Errorf("metrics lack %q", name)
		}
	}
	fs := e.r.broker.FrozenStats()
	t.Logf("frozen buffer: %d requests held, %d timed out, longest hold %v", fs.HeldTotal, fs.TimedOut, fs.MaxHeld)

	// Every message sits on the cluster that owns its vshard now.
	byOwner := map[string]int{}
	for k := range l.ids {
		byOwner[e.owner(shard.Of(k))]++
	}
	for c, want := range byOwner {
		var n int
		if err := e.dbs[c].QueryRow("SELECT COUNT(*) FROM message_store WHERE topic = ?", topic).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("cluster %s holds %d messages, want %d", c, n, want)
		}
	}
	// Every key produced again is a duplicate with its first id.
	var keys []string
	for k := range l.ids {
		keys = append(keys, k)
	}
	for i := 0; i < len(keys); i += 200 {
		batch := keys[i:min(i+200, len(keys))]
		var msgs []any
		for _, k := range batch {
			msgs = append(msgs, msg(k, map[string]any{"k": k}))
		}
		_, _, body := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs})
		for j, r := range results(t, body) {
			if r["status"] != "duplicate" || r["id"] != l.ids[batch[j]] {
				t.Fatalf("key %s (vshard %d) produced again: %v, want duplicate of %s", batch[j], shard.Of(batch[j]), r, l.ids[batch[j]])
			}
		}
	}
}

// A job aborted before the flip leaves the source serving and the target
// without the vshards' rows.
func TestReshardAbortBeforeFlip(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupReshard(t, func(c *Config) {
		c.Reshard.BatchRows = 50
		c.Reshard.RowsPerSecond = 500 // slow enough to abort mid-copy
	})
	const topic = "rs-abort"
	var msgs []any
	for i := 0; i < 1500; i++ {
		msgs = append(msgs, msg(fmt.Sprint("ab-", i), i))
	}
	for i := 0; i < len(msgs); i += 500 {
		e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs[i : i+500]})
	}
	before := vshardRows(t, e.dbs["c1"], 0, 511)
	st, body := e.do(t, "POST", "/v1/admin/reshard", map[string]any{"ranges": []any{map[string]any{"from": 0, "to": 511, "target": "c3"}}})
	if st != 202 {
		t.Fatalf("submit: %d %v", st, body)
	}
	id := body["job"].(string)
	waitFor(t, time.Minute, func() bool {
		_, j := e.do(t, "GET", "/v1/admin/reshard/"+id, nil)
		return j["state"] == "copying" && j["rows_copied"].(float64) > 0
	})
	st, body = e.do(t, "POST", "/v1/admin/reshard/"+id+"/abort", nil)
	if st != 200 || (body["state"] != "aborting" && body["state"] != "aborted") {
		t.Fatalf("abort: %d %v", st, body)
	}
	job := e.waitJob(t, id, time.Minute)
	if job["state"] != "aborted" || job["finished_at"] == nil {
		t.Fatalf("job after abort: %v", job)
	}
	if got := e.ownerOf(t, 0); got != "c1" {
		t.Fatalf("vshard 0 owned by %s after the abort", got)
	}
	for table, n := range vshardRows(t, e.dbs["c3"], 0, 1023) {
		if n != 0 {
			t.Errorf("target keeps %d %s rows after the abort", n, table)
		}
	}
	if after := vshardRows(t, e.dbs["c1"], 0, 511); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("source rows changed by the aborted job: %v, before %v", after, before)
	}
	// The source serves: a key re-sent is a duplicate, claims deliver.
	_, _, body = e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs[:100]})
	for _, r := range results(t, body) {
		if r["status"] != "duplicate" {
			t.Fatalf("re-sent after abort: %v", r)
		}
	}
	if got := e.claim(t, topic, "default", map[string]any{"max": 10}); len(got) != 10 {
		t.Fatalf("claim after abort: %d messages", len(got))
	}
	// An abort after the end is refused with the job's state.
	if st, body := e.do(t, "POST", "/v1/admin/reshard/"+id+"/resume", nil); st != 409 {
		t.Fatalf("resume of an aborted job: %d %v", st, body)
	}
}

// The runner stopped mid-copy, then mid-freeze (as a crash of its router
// would), is replaced by a new one over the same recorded state: the job
// resumes where it was and finishes, with nothing lost.
func TestReshardResumesAfterCrash(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	frozen := make(chan struct{}, 1)
	release := make(chan struct{})
	e := setupReshard(t, func(c *Config) {
		c.Reshard.BatchRows = 50
		c.Reshard.RowsPerSecond = 1000
	})
	const topic = "rs-crash"
	var msgs []any
	for i := 0; i < 1500; i++ {
		msgs = append(msgs, msg(fmt.Sprint("cr-", i), i))
	}
	ids := map[string]string{}
	for i := 0; i < len(msgs); i += 500 {
		_, _, body := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs[i : i+500]})
		for j, r := range results(t, body) {
			ids[msgs[i+j].(map[string]any)["key"].(string)] = r["id"].(string)
		}
	}
	// Lease some deliveries before the move: their receipts must ack after it.
	leased := e.claim(t, topic, "default", map[string]any{"max": 100, "visibility_timeout_ms": 120000})

	rs := e.r.reshard
	st, body := e.do(t, "POST", "/v1/admin/reshard", map[string]any{"ranges": []any{map[string]any{"from": 512, "to": 767, "target": "c1"}}})
	if st != 202 {
		t.Fatalf("submit: %d %v", st, body)
	}
	id := body["job"].(string)
	waitFor(t, time.Minute, func() bool {
		j, err := rs.manager.Get(t.Context(), id)
		return err == nil && j.State == rebalance.StateCopying && j.RowsCopied > 0
	})
	rs.manager.Stop() // crash mid-copy
	mid, _ := rs.manager.Get(t.Context(), id)
	if mid.State != rebalance.StateCopying {
		t.Fatalf("stopped in state %s, want copying", mid.State)
	}

	// Second runner: stops itself right after the freeze is recorded.
	cfg := rebalance.Config{BatchRows: 200, RowsPerSecond: -1, OnState: func(j *rebalance.Job) {
		if j.State == rebalance.StateFrozen {
			frozen <- struct{}{}
			<-release
		}
	}}
	second := rebalance.New(cfg, rs.state, rs.backend, e.r.pools.movers)
	second.Start(t.Context())
	select {
	case <-frozen:
	case <-time.After(2 * time.Minute):
		t.Fatal("second runner never froze the vshards")
	}
	stopped := make(chan struct{})
	go func() { second.Stop(); close(stopped) }()
	close(release)
	<-stopped
	j, _ := rs.manager.Get(t.Context(), id)
	if j.State != rebalance.StateFrozen || j.RowsCopied < mid.RowsCopied {
		t.Fatalf("after the second crash: state %s rows %d (mid-copy %d)", j.State, j.RowsCopied, mid.RowsCopied)
	}
	if got := e.ownerOf(t, 600); got != "c2" {
		t.Fatalf("vshard 600 owned by %s while frozen", got)
	}

	// Third runner finishes.
	third := rebalance.New(rebalance.Config{RowsPerSecond: -1}, rs.state, rs.backend, e.r.pools.movers)
	third.Start(t.Context())
	t.Cleanup(third.Stop)
	job := e.waitJob(t, id, 2*time.Minute)
	if job["state"] != "done" {
		t.Fatalf("job %v", job)
	}
	t.Logf("resumed job: rows_copied %v of %v, max_pause_ms %v (includes the time the crashed runner held the freeze)",
		job["rows_copied"], job["rows_total"], job["max_pause_ms"])
	if got := e.ownerOf(t, 600); got != "c1" {
		t.Fatalf("vshard 600 owned by %s after the move", got)
	}
	// Leases taken before the move ack after it; everything else is
	// delivered once, and every key is a duplicate with its id.
	e.ack(t, leased...)
	seen := map[string]bool{}
	for _, m := range leased {
		seen[m["id"].(string)] = true
	}
	for {
		got := e.claim(t, topic, "default", map[string]any{"max": 500, "visibility_timeout_ms": 120000})
		if len(got) == 0 {
			break
		}
		for _, m := range got {
			if seen[m["id"].(string)] {
				t.Fatalf("message %s delivered twice", m["id"])
			}
			seen[m["id"].(string)] = true
		}
		e.ack(t, got...)
	}
	if len(seen) != len(ids) {
		t.Fatalf("delivered %d of %d messages", len(seen), len(ids))
	}
	_, _, body = e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs[:500]})
	for j, r := range results(t, body) {
		k := msgs[j].(map[string]any)["key"].(string)
		if r["status"] != "duplicate" || r["id"] != ids[k] {
			t.Fatalf("%s re-sent: %v, want duplicate of %s", k, r, ids[k])
		}
	}
}

// The request is checked before anything is recorded: 400 for bad ranges,
// 409 while another job moves the vshards, 200 with the plan on a dry run.
func TestReshardRequestChecks(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupReshard(t, func(c *Config) { c.Reshard.BatchRows, c.Reshard.RowsPerSecond = 1, 1 }) // the job stays in its copy
	cases := []struct {
		name   string
		body   any
		status int
		code   string
	}{
		{"overlap", map[string]any{"ranges": []any{map[string]any{"from": 0, "to": 10, "target": "c2"}, map[string]any{"from": 10, "to": 20, "target": "c3"}}}, 400, "invalid_request"},
		{"out of range", map[string]any{"ranges": []any{map[string]any{"from": 1000, "to": 1024, "target": "c2"}}}, 400, "invalid_request"},
		{"negative", map[string]any{"ranges": []any{map[string]any{"from": -1, "to": 3, "target": "c2"}}}, 400, "invalid_request"},
		{"unknown target", map[string]any{"ranges": []any{map[string]any{"from": 0, "to": 3, "target": "c9"}}}, 400, "invalid_request"},
		{"already owned", map[string]any{"ranges": []any{map[string]any{"from": 500, "to": 520, "target": "c2"}}}, 400, "invalid_request"},
		{"no ranges", map[string]any{"ranges": []any{}}, 400, "invalid_request"},
	}
	for _, c := range cases {
		st, body := e.do(t, "POST", "/v1/admin/reshard", c.body)
		if st != c.status || body["error"].(map[string]any)["code"] != c.code {
			t.Errorf("%s: %d %v, want %d %s", c.name, st, body, c.status, c.code)
		}
	}
	st, body := e.do(t, "POST", "/v1/admin/reshard", map[string]any{"ranges": []any{map[string]any{"from": 0, "to": 63, "target": "c2"}}, "dry_run": true})
	if st != 200 || body["dry_run"] != true || len(body["moves"].([]any)) != 1 {
		t.Fatalf("dry run: %d %v", st, body)
	}
	st, body = e.do(t, "POST", "/v1/admin/reshard", map[string]any{"add_cluster": "c3", "dry_run": true})
	if st != 200 || len(body["ranges"].([]any)) == 0 {
		t.Fatalf("dry run of add_cluster: %d %v", st, body)
	}
	planned := 0
	for _, r := range body["ranges"].([]any) {
		rg := r.(map[string]any)
		planned += int(rg["to"].(float64)-rg["from"].(float64)) + 1
	}
	if planned != shard.Count/3 {
		t.Fatalf("add_cluster plans %d vshards for c3, want %d", planned, shard.Count/3)
	}
	if st, body := e.do(t, "POST", "/v1/admin/reshard", map[string]any{"drain": "c9"}); st != 400 {
		t.Fatalf("drain of an unknown cluster: %d %v", st, body)
	}
	e.post(t, "/v1/topics/rs-checks/messages", map[string]any{"messages": []any{msg("a", 1), msg("b", 2), msg("c", 3)}})
	st, body = e.do(t, "POST", "/v1/admin/reshard", map[string]any{"ranges": []any{map[string]any{"from": 0, "to": 63, "target": "c2"}}})
	if st != 202 {
		t.Fatalf("submit: %d %v", st, body)
	}
	id := body["job"].(string)
	st, body = e.do(t, "POST", "/v1/admin/reshard", map[string]any{"ranges": []any{map[string]any{"from": 60, "to": 70, "target": "c3"}}})
	if st != 409 || body["error"].(map[string]any)["code"] != "reshard_conflict" {
		t.Fatalf("overlapping job: %d %v", st, body)
	}
	st, body = e.do(t, "POST", "/v1/admin/reshard/"+id+"/pause", nil)
	if st != 200 || body["state"] != "paused" || body["job"] != id {
		t.Fatalf("pause: %d %v", st, body)
	}
	for _, f := range []string{"job", "state", "ranges", "rows_copied", "rows_total", "max_pause_ms", "started_at", "finished_at", "error"} {
		if _, ok := body[f]; !ok {
			t.Errorf("job view lacks %q: %v", f, body)
		}
	}
	st, body = e.do(t, "POST", "/v1/admin/reshard/"+id+"/resume", nil)
	if st != 200 || body["state"] == "paused" {
		t.Fatalf("resume: %d %v", st, body)
	}
	if st, _ := e.do(t, "GET", "/v1/admin/reshard/nope", nil); st != 404 {
		t.Fatalf("unknown job: %d", st)
	}
	st, body = e.do(t, "POST", "/v1/admin/reshard/"+id+"/abort", nil)
	if st != 200 {
		t.Fatalf("abort: %d %v", st, body)
	}
	if job := e.waitJob(t, id, time.Minute); job["state"] != "aborted" {
		t.Fatalf("job %v", job)
	}
}

// The operator CLI plans, starts and follows a move.
func TestReshardCLI(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupReshard(t, nil)
	run := func(args ...string) (int, map[string]any) {
		var stdout, stderr bytes.Buffer
		code := ctl.Run(append([]string{"-json"}, args...), e.url, &stdout, &stderr, testClient)
		var body map[string]any
		json.Unmarshal(stdout.Bytes(), &body)
		return code, body
	}
	if code, body := run("reshard", "add-cluster", "c3", "-dry-run"); code != 0 || body["dry_run"] != true {
		t.Fatalf("add-cluster -dry-run: %d %v", code, body)
	}
	if code, _ := run("reshard", "move", "0-63"); code != 2 {
		t.Fatalf("move without a target exited %d, want 2", code)
	}
	if code, _ := run("reshard", "move", "600-610:c2"); code != 1 {
		t.Fatalf("move onto the owner exited %d, want 1 (400)", code)
	}
	code, body := run("reshard", "move", "0-63:c3,64:c2")
	if code != 0 || body["job"] == nil {
		t.Fatalf("move: %d %v", code, body)
	}
	job := e.waitJob(t, body["job"].(string), time.Minute)
	if job["state"] != "done" || e.ownerOf(t, 63) != "c3" || e.ownerOf(t, 64) != "c2" {
		t.Fatalf("job %v; owners %s %s", job, e.ownerOf(t, 63), e.ownerOf(t, 64))
	}
	if code, body := run("reshard", "status", job["job"].(string)); code != 0 || body["state"] != "done" {
		t.Fatalf("status: %d %v", code, body)
	}
}

// An abort after the flip is a reverse move: the job finishes its cleanup,
// ends aborted, and a new job brings the vshards back to their source.
func TestReshardAbortAfterFlipMovesBack(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	inCleanup := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	e := setupReshard(t, func(c *Config) {
		c.Reshard.OnState = func(j *rebalance.Job) {
			if j.State == rebalance.StateCleanup {
				once.Do(func() { // the first job only, not the move back
					close(inCleanup)
					<-release
				})
			}
		}
	})
	const topic = "rs-back"
	var msgs []any
	for i := 0; i < 400; i++ {
		msgs = append(msgs, msg(fmt.Sprint("bk-", i), i))
	}
	ids := map[string]string{}
	_, _, body := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs})
	for j, r := range results(t, body) {
		ids[msgs[j].(map[string]any)["key"].(string)] = r["id"].(string)
	}
	st, body := e.do(t, "POST", "/v1/admin/reshard", map[string]any{"ranges": []any{map[string]any{"from": 0, "to": 255, "target": "c2"}}})
	if st != 202 {
		t.Fatalf("submit: %d %v", st, body)
	}
	id := body["job"].(string)
	select {
	case <-inCleanup:
	case <-time.After(2 * time.Minute):
		t.Fatal("the job never reached its cleanup")
	}
	st, body = e.do(t, "POST", "/v1/admin/reshard/"+id+"/abort", nil)
	close(release)
	if st != 200 || body["state"] != "cleanup" || body["error"] == "" {
		t.Fatalf("abort after the flip: %d %v", st, body)
	}
	job := e.waitJob(t, id, time.Minute)
	if job["state"] != "aborted" {
		t.Fatalf("job %v", job)
	}
	rec, err := e.r.Reshard().Get(t.Context(), id)
	if err != nil || rec.ReversedBy == "" {
		t.Fatalf("no reverse job recorded: %+v %v", rec, err)
	}
	back := e.waitJob(t, rec.ReversedBy, 2*time.Minute)
	if back["state"] != "done" || e.ownerOf(t, 0) != "c1" || e.ownerOf(t, 255) != "c1" {
		t.Fatalf("reverse job %v, vshard 0 on %s", back, e.ownerOf(t, 0))
	}
	for table, n := range vshardRows(t, e.dbs["c2"], 0, 255) {
		if n != 0 {
			t.Errorf("c2 keeps %d %s rows after the move back", n, table)
		}
	}
	_, _, body = e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs})
	for j, r := range results(t, body) {
		k := msgs[j].(map[string]any)["key"].(string)
		if r["status"] != "duplicate" || r["id"] != ids[k] {
			t.Fatalf("%s re-sent after the move back: %v, want duplicate of %s", k, r, ids[k])
		}
	}
	seen := 0
	for {
		got := e.claim(t, topic, "default", map[string]any{"max": 500})
		if len(got) == 0 {
			break
		}
		seen += len(got)
		e.ack(t, got...)
	}
	if seen != len(ids) {
		t.Fatalf("delivered %d of %d", seen, len(ids))
	}
}

// Ordering state moves with its vshards: leased heads ack after the move,
// and each order key's messages keep coming one at a time, in order.
func TestReshardKeepsOrdering(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupReshard(t, nil)
	const topic = "rs-ordered"
	if st, body := e.do(t, "PUT", "/v1/topics/"+topic+"/subscriptions/s", map[string]any{"ordered": true}); st/100 != 2 {
		t.Fatalf("subscription: %d %v", st, body)
	}
	const keys, per = 40, 4
	for seq := 0; seq < per; seq++ {
		var msgs []any
		for k := 0; k < keys; k++ {
			msgs = append(msgs, map[string]any{"key": fmt.Sprintf("o-%d-%d", k, seq), "order_key": fmt.Sprint("ok-", k), "payload": seq})
		}
		e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs})
	}
	heads := e.claim(t, topic, "s", map[string]any{"max": 100, "visibility_timeout_ms": 120000})
	if len(heads) != keys {
		t.Fatalf("claimed %d heads, want one per order key (%d)", len(heads), keys)
	}
	moved := 0
	for k := 0; k < keys; k++ {
		if shard.Of(fmt.Sprint("ok-", k)) <= 511 {
			moved++
		}
	}
	if job := e.reshard(t, []map[string]any{{"from": 0, "to": 511, "target": "c3"}}, 2*time.Minute); job["state"] != "done" {
		t.Fatalf("job %v", job)
	}
	next := map[string]int{}
	for _, m := range heads {
		if m["payload"].(float64) != 0 {
			t.Fatalf("head %v is not its key's first message", m)
		}
		next[m["order_key"].(string)] = 1
	}
	e.ack(t, heads...) // leases taken before the move
	for left := keys * (per - 1); left > 0; {
		got := e.claim(t, topic, "s", map[string]any{"max": 100, "visibility_timeout_ms": 120000, "wait_ms": 2000})
		if len(got) == 0 {
			t.Fatalf("%d messages never came", left)
		}
		inBatch := map[string]bool{}
		for _, m := range got {
			ok := m["order_key"].(string)
			if inBatch[ok] {
				t.Fatalf("two messages of %s in flight at once", ok)
			}
			inBatch[ok] = true
			if seq := int(m["payload"].(float64)); seq != next[ok] {
				t.Fatalf("%s: got message %d, want %d", ok, seq, next[ok])
			}
			next[ok]++
		}
		e.ack(t, got...)
		left -= len(got)
	}
	t.Logf("%d of %d order keys moved with their parked deliveries", moved, keys)
}
