package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"

	_ "github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/client/outbox"
	"github.com/shardmq/shardmq/internal/routertest"
	"github.com/shardmq/shardmq/internal/testbed"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 2, Replicas: 1}, func(b *testbed.Bed) { bed = b }))
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func serviceDB(t *testing.T) *sql.DB {
	t.Helper()
	name := testbed.TestDatabase(t, bed, "t_outbox_")
	db, err := sql.Open("mysql", bed.Clusters[0].Primary.DSN(name)+"?interpolateParams=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := outbox.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(context.Background(), db); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	return db
}

func enqueue(t *testing.T, db *sql.DB, topic string, msgs ...client.Message) []string {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, m := range msgs {
		k, err := outbox.Enqueue(context.Background(), tx, topic, m)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestRelaysShareTheOutbox: three relays at once publish 300 rows; every
// row ends published with the id the router gave its key, and the router
// holds each key once.
func TestRelaysShareTheOutbox(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{})
	db := serviceDB(t)
	ctx := context.Background()
	c, _ := client.New(client.Config{URL: r.URL, Logger: quiet})
	defer c.Close()
	msgs := make([]client.Message, 300)
	for i := range msgs {
		msgs[i] = client.Message{Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	keys := enqueue(t, db, "ob-share", msgs...)
	// A rolled-back business transaction leaves nothing to publish.
	tx, _ := db.Begin()
	if _, err := outbox.Enqueue(ctx, tx, "ob-share", client.Message{Key: "rolled-back", Payload: json.RawMessage(`1`)}); err != nil {
		t.Fatal(err)
	}
	tx.Rollback()

	var wg sync.WaitGroup
	for i := range 3 {
		p, _ := c.NewProducer(client.ProducerConfig{})
		defer p.Close(ctx)
		rl := outbox.NewRelay(db, p, outbox.RelayConfig{Name: fmt.Sprintf("r%d", i), Batch: 7, Logger: quiet})
		wg.Go(func() {
			for {
				n, err := rl.RunOnce(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if n == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	counts, err := outbox.Count(ctx, db)
	if err != nil || counts != (outbox.Counts{Published: 300}) {
		t.Fatalf("counts %+v, %v", counts, err)
	}
	// The router has each key once: resending every key answers duplicate
	// with the id the outbox recorded.
	stored := map[string]string{}
	rows, err := db.Query(`SELECT msg_key, message_id FROM shardmq_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k, id string
		rows.Scan(&k, &id)
		stored[k] = id
	}
	rows.Close()
	res, err := c.Produce(ctx, "ob-share", "", func() []client.Message {
		for i := range msgs {
			msgs[i].Key = keys[i]
		}
		return msgs
	}())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Status != client.StatusDuplicate || r.ID != stored[r.Key] {
			t.Fatalf("resend of %s: %+v; want duplicate of %s", r.Key, r, stored[r.Key])
		}
	}
	// Enqueueing a key twice is refused.
	tx, _ = db.Begin()
	defer tx.Rollback()
	if _, err := outbox.Enqueue(ctx, tx, "ob-share", client.Message{Key: keys[0], Payload: json.RawMessage(`1`)}); !errors.Is(err, outbox.ErrDuplicateKey) {
		t.Errorf("enqueue of a known key: %v", err)
	}
}

// failing answers every message with an error.
type failing struct{ err error }

func (f failing) SendMany(_ context.Context, _ string, msgs []client.Message) []client.SendResult {
	out := make([]client.SendResult, len(msgs))
	for i := range out {
		out[i].Err = f.err
	}
	return out
}

// TestRelayRetriesThenBuries: a row whose publish keeps failing is retried
// and dead after MaxAttempts with its last error; a conflict is dead at
// once; a lease that a crashed relay left is taken over once expired.
func TestRelayRetriesThenBuries(t *testing.T) {
	testbed.Need(t)
	db := serviceDB(t)
	ctx := context.Background()
	enqueue(t, db, "ob-fail", client.Message{Key: "a", Payload: json.RawMessage(`1`)})
	unavailable := &client.Error{Code: client.CodeUnavailable, Message: "cluster down"}
	rl := outbox.NewRelay(db, failing{unavailable}, outbox.RelayConfig{MaxAttempts: 3, InitialBackoff: 1, MaxBackoff: 1, Logger: quiet})
	for range 3 {
		if _, err := rl.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var status, lastErr string
	var attempts int
	db.QueryRow(`SELECT status, attempts, last_error FROM shardmq_outbox WHERE msg_key='a'`).Scan(&status, &attempts, &lastErr)
	if status != "dead" || attempts != 3 || lastErr != unavailable.Error() {
		t.Errorf("after 3 failures: %s, %d attempts, %q", status, attempts, lastErr)
	}
	if n, err := outbox.Redrive(ctx, db); err != nil || n != 1 {
		t.Errorf("redrive: %d, %v", n, err)
	}

	enqueue(t, db, "ob-fail", client.Message{Key: "b", Payload: json.RawMessage(`1`)})
	conflict := outbox.NewRelay(db, failing{fmt.Errorf("send: %w", client.ErrConflict)}, outbox.RelayConfig{Logger: quiet})
	if _, err := conflict.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	counts, _ := outbox.Count(ctx, db)
	if counts.Dead != 2 {
		t.Errorf("after a conflict: %+v, want both rows dead", counts)
	}

	// A relay that crashes between publish and mark leaves its lease; a
	// second relay cannot take the rows before it ends, and marks them
	// after.
	outbox.Redrive(ctx, db)
	crashed := outbox.NewRelay(db, failing{nil}, outbox.RelayConfig{Lease: 300_000_000, Logger: quiet,
		Faults: outbox.FaultHooks{BeforeMark: func() error { return outbox.ErrCrash }}})
	if n, err := crashed.RunOnce(ctx); !errors.Is(err, outbox.ErrCrash) || n != 2 {
		t.Fatalf("crashing relay: %d, %v", n, err)
	}
	second := outbox.NewRelay(db, failing{nil}, outbox.RelayConfig{Logger: quiet})
	if n, err := second.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("second relay during the lease: claimed %d, %v", n, err)
	}
	db.Exec(`UPDATE shardmq_outbox SET locked_until = NOW(6) - INTERVAL 1 SECOND`) // the lease ends
	if n, err := second.UnlockExpired(ctx); err != nil || n != 2 {
		t.Fatalf("unlock expired: %d, %v", n, err)
	}
	if n, err := second.RunOnce(ctx); err != nil || n != 2 {
		t.Fatalf("second relay after the lease: claimed %d, %v", n, err)
	}
	counts, _ = outbox.Count(ctx, db)
	if counts.Published != 2 {
		t.Errorf("%+v, want both published", counts)
	}
}
