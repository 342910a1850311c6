package server

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
)

// A produce whose commit is stuck on a locked primary (FLUSH TABLES WITH
// READ LOCK) is answered unknown — it may be stored, and is once the lock
// goes — not unavailable; a retry with the same key then says what
// happened and never stores it twice. A produce to a primary that is down
// is answered unavailable, and nothing of it is stored.
func TestStuckPrimaryAnswersUnknown(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 1, NoReplicas: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	e := setupOn(t, own, func(c *Config) { c.Cluster.Commit.Timeout = time.Second })
	produce := func(key string) (map[string]any, string) {
		t.Helper()
		st, hdr, out := e.post(t, "/v1/topics/stuck/messages", map[string]any{"messages": []any{msg(key, map[string]any{"k": key})}})
		if st != 200 {
			t.Fatalf("produce %s: %d %v", key, st, out)
		}
		return results(t, out)[0], hdr.Get("Retry-After")
	}
	if r, _ := produce("before"); r["status"] != "created" { // the topic and its subscription exist
		t.Fatalf("before the lock: %v", r)
	}

	db, err := sql.Open("mysql", own.Clusters[0].Primary.DSN(e.name))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	lock, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, "FLUSH TABLES WITH READ LOCK"); err != nil {
		t.Fatal(err)
	}
	r, retryAfter := produce("stuck-1")
	errObj, _ := r["error"].(map[string]any)
	if r["status"] != "unknown" || retryAfter == "" || errObj["code"] != "outcome_unknown" {
		t.Fatalf("with the primary locked: %v (Retry-After %q), want unknown, outcome_unknown, Retry-After", r, retryAfter)
	}
	if msg, _ := errObj["message"].(string); strings.Contains(msg, "127.0.0.1") || strings.Contains(msg, "tcp") {
		t.Fatalf("the answer names an address: %q", msg)
	}
	if _, err := lock.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
		t.Fatal(err)
	}
	// A retry with the key is safe: created if the stuck commit was lost,
	// duplicate if it went through after the unlock; stored once either way.
	var again map[string]any
	testtime.Until(t, "a retry with the key stored", func() bool {
		again, _ = produce("stuck-1")
		return again["status"] == "created" || again["status"] == "duplicate"
	})
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_store WHERE msg_key = 'stuck-1'")); n != 1 {
		t.Fatalf("stuck-1 stored %d times, want 1 (retry answered %v)", n, again["status"])
	}
	t.Logf("the stuck commit's retry answered %v", again["status"])

	// Down: certainly not stored.
	if err := own.Kill(own.Clusters[0].Primary); err != nil {
		t.Fatal(err)
	}
	r, retryAfter = produce("down-1")
	if r["status"] != "unavailable" || retryAfter == "" {
		t.Fatalf("with the primary down: %v (Retry-After %q), want unavailable", r, retryAfter)
	}
	if err := own.Restart(ctx, own.Clusters[0].Primary); err != nil {
		t.Fatal(err)
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_store WHERE msg_key = 'down-1'")); n != 0 {
		t.Fatalf("down-1 answered unavailable but stored %d times", n)
	}
}
