package server

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/consuldouble"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/consul"
)

// startConsulRouter starts a router on Consul the way cmd/router does:
// registered before it loads the topology, publishing the shard-map
// version it vouches for, campaigning for the job lock, and recording
// resharding jobs in KV.
func startReshardConsulRouter(t *testing.T, addr, database, id string) *env {
	t.Helper()
	ctx := context.Background()
	src, err := consul.New(consul.Config{Address: addr, DSN: consul.DSN{User: "root", Database: database}, SessionTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := src.Register(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	leader := src.Leader(id)
	var rp atomic.Pointer[Router]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: ln.Addr().String(), Subscriptions: src.Subscriptions(), Leader: leader, Backend: src, ReshardState: src.ReshardState(),
		Source: topology.Publishing(src, reg, func() *routing.Map {
			if r := rp.Load(); r != nil {
				return r.AppliedShardMap()
			}
			return nil
		})}
	cfg.Broker.RecentKeys = -1
	cfg.Reshard.RowsPerSecond = -1
	cfg.SelfFence = reg.(topology.SelfFencer) // as cmd/router does
	r, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rp.Store(r)
	reg.Publish(r.AppliedShardMapVersion())
	lctx, stopLeader := context.WithCancel(ctx)
	leader.Start(lctx)
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- r.Run(rctx, ln) }()
	t.Cleanup(func() {
		leader.Stop()
		stopLeader()
		stop()
		<-ran
		reg.Stop()
	})
	e := &env{name: database, url: "http://" + ln.Addr().String(), r: r, dbs: map[string]*sql.DB{}, leading: leader.IsLeader}
	e.owner = func(v shard.ID) string { c, _ := r.table.Load().Lookup(v); return c }
	return e
}

// Two routers on Consul (the double) over real MariaDB: a job submitted
// through one is run by whichever leads, the barrier waits for both, and
// both route the moved vshards to their new cluster, with every key still
// a duplicate of its first id and every message delivered once.
func TestReshardOnConsul(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	database := testbed.TestDatabase(t, bed, "t_rsc_")
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
	a := startReshardConsulRouter(t, d.Addr(), database, "router-a")
	b := startReshardConsulRouter(t, d.Addr(), database, "router-b")

	const topic = "rs-consul"
	ids := map[string]string{}
	var msgs []any
	for i := 0; i < 1000; i++ {
		msgs = append(msgs, msg(fmt.Sprint("cs-", i), i))
	}
	for i := 0; i < len(msgs); i += 250 {
		via := []*env{a, b}[i/250%2]
		_, _, body := via.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs[i : i+250]})
		for j, r := range results(t, body) {
			if r["status"] != "created" {
				t.Fatalf("produce: %v", r)
			}
			ids[msgs[i+j].(map[string]any)["key"].(string)] = r["id"].(string)
		}
	}
	job := b.reshard(t, []map[string]any{{"from": 0, "to": 255, "target": "c2"}}, 3*time.Minute)
	if job["state"] != "done" {
		t.Fatalf("job %v", job)
	}
	t.Logf("consul move 0-255 c1→c2: rows_copied %v of %v, max_pause_ms %v", job["rows_copied"], job["rows_total"], job["max_pause_ms"])
	for _, e := range []*env{a, b} {
		waitFor(t, 10*time.Second, func() bool { return e.owner(0) == "c2" && e.owner(255) == "c2" && e.owner(256) == "c1" })
		if st, j := e.do(t, "GET", "/v1/admin/reshard/"+job["job"].(string), nil); st != 200 || j["state"] != "done" {
			t.Fatalf("job seen through %s: %d %v", e.url, st, j)
		}
	}
	for i, e := range []*env{a, b} {
		_, _, body := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs[i*500 : i*500+500]})
		for j, r := range results(t, body) {
			k := msgs[i*500+j].(map[string]any)["key"].(string)
			if r["status"] != "duplicate" || r["id"] != ids[k] {
				t.Fatalf("%s re-sent: %v, want duplicate of %s", k, r, ids[k])
			}
		}
	}
	seen := map[string]bool{}
	for {
		got := a.claim(t, topic, "default", map[string]any{"max": 500, "visibility_timeout_ms": 120000})
		if len(got) == 0 {
			break
		}
		for _, m := range got {
			if seen[m["id"].(string)] {
				t.Fatalf("message %s delivered twice", m["id"])
			}
			seen[m["id"].(string)] = true
		}
		b.ack(t, got...)
	}
	if len(seen) != len(ids) {
		t.Fatalf("delivered %d of %d messages", len(seen), len(ids))
	}
}
