package server

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/topology"
)

// replicaConns counts the connections a replica's server holds to the
// test's database (this router's only: every test has its own database).
func replicaConns(t *testing.T, inst *testbed.Instance, database string) int {
	t.Helper()
	db, err := sql.Open("mysql", inst.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = ?", database).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A router holds one connection pool per replica DSN: the lag monitor's
// checks, the replica reads and the replicated-durability waits all use
// it, so every connection a replica sees from the router is one of that
// pool's. The pool closes when its replica leaves the topology, and the
// others when the router closes.
func TestOnePoolPerReplica(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, fastHA)
	var batch []any
	for i := 0; i < 40; i++ {
		batch = append(batch, msg(fmt.Sprint("p-", i), i))
	}
	st, _, body := e.post(t, "/v1/topics/pools/messages", map[string]any{"messages": batch, "durability": "replicated"})
	if st != 200 {
		t.Fatalf("produce: %d %v", st, body)
	}
	for _, r := range results(t, body) {
		if r["status"] != "created" {
			t.Fatalf("result %v", r)
		}
	}
	e.traceFrom(t, "replica", "pools", "p-0", "")

	reg := e.r.pools.replicas
	dbs := reg.DBs()
	if len(dbs) != len(bed.Clusters) {
		t.Fatalf("%d replica pools, want one per replica (%d)", len(dbs), len(bed.Clusters))
	}
	for _, c := range bed.Clusters {
		dsn := c.Replicas[0].DSN(e.name)
		pool, err := reg.Get(context.Background(), dsn)
		if err != nil || dbs[dsn] != pool.DB() {
			t.Fatalf("cluster %s: registry pool %v, %v; listed %v", c.Name, pool, err, dbs[dsn])
		}
		// The monitor hands out that very pool for reads.
		waitFor(t, 10*time.Second, func() bool { rep, ok := e.r.eps.monitor.Pick(c.Name); return ok && rep.Store == pool })
		// Every connection the replica sees from the router is the pool's.
		waitFor(t, 10*time.Second, func() bool {
			n := replicaConns(t, c.Replicas[0], e.name)
			return n > 0 && n == pool.DB().Stats().OpenConnections
		})
	}

	// The first cluster's replica leaves the topology: its pool closes,
	// the monitor offers it no more, and replicated durability on that
	// cluster has no replica to wait for.
	gone := bed.Clusters[0]
	data, err := os.ReadFile(e.topology)
	if err != nil {
		t.Fatal(err)
	}
	entry := fmt.Sprintf("    replicas:\n      - %q\n", gone.Replicas[0].DSN(e.name))
	if !strings.Contains(string(data), entry) {
		t.Fatalf("topology lacks %q", entry)
	}
	if err := os.WriteFile(e.topology, []byte(strings.Replace(string(data), entry, "", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := topology.LoadFile(e.topology)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.r.apply(ctx, top)
	if _, open := reg.Peek(gone.Replicas[0].DSN(e.name)); open {
		t.Fatal("the pool of a replica that left is still open")
	}
	if _, err := reg.Get(ctx, gone.Replicas[0].DSN(e.name)); err == nil {
		t.Fatal("a replica that left got a pool again")
	}
	if _, ok := e.r.eps.monitor.Pick(gone.Name); ok {
		t.Fatal("the monitor offers a replica that left")
	}
	waitFor(t, 10*time.Second, func() bool { return replicaConns(t, gone.Replicas[0], e.name) == 0 })
	stay := bed.Clusters[1]
	if n := replicaConns(t, stay.Replicas[0], e.name); n == 0 {
		t.Fatalf("the replica that stays has no connection left")
	}

	// The router closes: so does every replica pool.
	e.r.Close()
	if len(reg.DBs()) != 0 {
		t.Fatal("replica pools listed after Close")
	}
	waitFor(t, 10*time.Second, func() bool { return replicaConns(t, stay.Replicas[0], e.name) == 0 })
}
