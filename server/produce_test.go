package server

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/shard"
)

func TestReplicatedDurabilityIsOnReplicaWhenAnswered(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	var batch []any
	for i := 0; i < 50; i++ {
		batch = append(batch, msg(fmt.Sprint("r-", i), i))
	}
	st, _, body := e.post(t, "/v1/topics/t/messages", map[string]any{"messages": batch, "durability": "replicated"})
	if st != 200 {
		t.Fatalf("produce: %d %v", st, body)
	}
	// Answered created means applied on a replica already: read there with
	// no wait at all.
	found := 0
	for _, c := range bed.Clusters {
		db, err := sql.Open("mysql", c.Replicas[0].DSN(e.name))
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM message_store").Scan(&n); err != nil {
			t.Fatal(err)
		}
		db.Close()
		found += n
	}
	for _, r := range results(t, body) {
		if r["status"] != "created" {
			t.Fatalf("result %v", r)
		}
	}
	if found != 50 {
		t.Fatalf("replicas hold %d of 50 messages answered created", found)
	}
}

// A stopped replica: replicated durability answers unknown after the
// timeout, the message is safe on the primary, a retry says duplicate.
func TestReplicatedDurabilityWithReplicaStopped(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	e := setupOn(t, own, func(c *Config) { c.Broker.ReplicatedTimeout = time.Second })
	replica := own.Clusters[0].Replicas[0]
	if err := own.StopReplication(ctx, replica); err != nil {
		t.Fatal(err)
	}
	body := map[string]any{"messages": []any{msg("safe-1", map[string]any{"v": 1})}, "durability": "replicated"}
	began := time.Now()
	st, hdr, out := e.post(t, "/v1/topics/t/messages", body)
	took := time.Since(began)
	r := results(t, out)[0]
	if st != 200 || r["status"] != "unknown" || hdr.Get("Retry-After") == "" || r["error"] == nil {
		t.Fatalf("got %d %v (Retry-After %q)", st, r, hdr.Get("Retry-After"))
	}
	if took < time.Second || took > 10*time.Second {
		t.Fatalf("answered after %v, want after the 1s timeout and promptly", took)
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_store")); n != 1 {
		t.Fatalf("primary holds %d messages, want 1", n)
	}
	_, _, out = e.post(t, "/v1/topics/t/messages", map[string]any{"messages": []any{msg("safe-1", map[string]any{"v": 1})}})
	if r := results(t, out)[0]; r["status"] != "duplicate" {
		t.Fatalf("retry = %v, want duplicate", r)
	}
	if err := own.StartReplication(ctx, replica); err != nil {
		t.Fatal(err)
	}
	_, _, out = e.post(t, "/v1/topics/t/messages", map[string]any{"messages": []any{msg("safe-1", map[string]any{"v": 1})}, "durability": "replicated"})
	if r := results(t, out)[0]; r["status"] != "duplicate" {
		t.Fatalf("replicated retry after the replica resumed = %v, want duplicate", r)
	}
}

func TestGroupCommitCoalescesConcurrentRequests(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, func(c *Config) {
		c.Cluster.Commit.Committers = 1
		c.Cluster.Commit.Linger = 50 * time.Millisecond
		c.Cluster.Commit.LingerAfter = 1 // every batch lingers: the test is about coalescing
	})
	const n = 40
	var wg sync.WaitGroup
	var created atomic.Int64
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, out := e.post(t, "/v1/topics/gc/messages", map[string]any{"messages": []any{msg(fmt.Sprint("g-", i), i)}})
			if results(t, out)[0]["status"] == "created" {
				created.Add(1)
			}
		}()
	}
	wg.Wait()
	if created.Load() != n {
		t.Fatalf("%d of %d created", created.Load(), n)
	}
	var tx, msgs int64
	for _, s := range e.r.broker.CommitStats() {
		tx += s.Transactions
		msgs += s.Messages
	}
	if msgs != n || tx >= n/2 {
		t.Fatalf("%d messages in %d transactions: requests were not coalesced", msgs, tx)
	}
}

// Kill one cluster's primary in the middle of a produce load: every message
// answered created is stored, and the other cluster's items never fail.
func TestKillPrimaryDuringProduce(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 2, NoReplicas: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	e := setupOn(t, own, nil)
	victim := own.Clusters[0]

	var mu sync.Mutex
	created := map[string]bool{}
	var otherFailed, victimFailed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var batch []any
				for j := 0; j < 20; j++ {
					batch = append(batch, msg(fmt.Sprintf("w%d-%d-%d", w, i, j), j))
				}
				_, _, out := e.post(t, "/v1/topics/kill/messages", map[string]any{"messages": batch})
				for _, r := range results(t, out) {
					key := r["key"].(string)
					onVictim := e.owner(shard.Of(key)) == victim.Name
					switch {
					case r["status"] == "created":
						mu.Lock()
						created[key] = true
						mu.Unlock()
					case onVictim:
						victimFailed.Add(1)
					default:
						otherFailed.Add(1)
					}
				}
			}
		}()
	}
	testtime.Until(t, "over 500 messages created", func() bool { mu.Lock(); defer mu.Unlock(); return len(created) > 500 })
	if err := own.Kill(victim.Primary); err != nil {
		t.Fatal(err)
	}
	testtime.Until(t, "over 100 of the victim's produces failed", func() bool { return victimFailed.Load() > 100 })
	close(stop)
	wg.Wait()
	if err := own.Restart(ctx, victim.Primary); err != nil {
		t.Fatal(err)
	}
	if otherFailed.Load() != 0 {
		t.Fatalf("%d items of the healthy cluster failed", otherFailed.Load())
	}
	stored := storedKeys(t, e.name, own.Clusters[0].Primary, own.Clusters[1].Primary)
	for k := range created {
		if !stored[k] {
			t.Fatalf("%s was answered created but is not stored", k)
		}
	}
	t.Logf("%d created, %d failed fast on the killed cluster, all stored", len(created), victimFailed.Load())
}

// storedKeys reads the message keys stored in database name on insts.
func storedKeys(t *testing.T, name string, insts ...*testbed.Instance) map[string]bool {
	t.Helper()
	stored := map[string]bool{}
	for _, inst := range insts {
		db, err := sql.Open("mysql", inst.DSN(name))
		if err != nil {
			t.Fatal(err)
		}
		rows, err := db.Query("SELECT msg_key FROM message_store")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				t.Fatal(err)
			}
			stored[k] = true
		}
		rows.Close()
		db.Close()
	}
	return stored
}
