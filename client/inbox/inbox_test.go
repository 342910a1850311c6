package inbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/client/inbox"
	"github.com/shardmq/shardmq/internal/routertest"
	"github.com/shardmq/shardmq/internal/testbed"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 2, Replicas: 1}, func(b *testbed.Bed) { bed = b }))
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestHandleOnce walks one message through the inbox: a failure rolls the
// business change back and is recorded; the redelivery runs it; a later
// redelivery is a duplicate acked without running it; a consumer whose
// claim is live makes a concurrent one busy.
func TestHandleOnce(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{})
	name := testbed.TestDatabase(t, bed, "t_inbox_")
	db, err := sql.Open("mysql", bed.Clusters[0].Primary.DSN(name)+"?interpolateParams=true")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := inbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE effects (k VARCHAR(64) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	c, _ := client.New(client.Config{URL: r.URL, Logger: quiet})
	defer c.Close()
	if err := c.PutSubscription(ctx, "ib", "s", client.Subscription{MaxAttempts: 50}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Produce(ctx, "ib", "", []client.Message{{Key: "m1", Payload: json.RawMessage(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	claim := func() *client.Delivery {
		t.Helper()
		ds, err := c.Claim(ctx, client.ClaimRequest{Topic: "ib", Subscription: "s", Max: 1, Wait: 3 * time.Second})
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %v, %v", ds, err)
		}
		return ds[0]
	}
	effects := func() int {
		var n int
		db.QueryRow(`SELECT COUNT(*) FROM effects`).Scan(&n)
		return n
	}
	apply := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ('m1')`)
		return err
	}
	in := inbox.New(db, inbox.Config{Name: "a", Logger: quiet})

	// 1. The handler fails after its write: rolled back, recorded, nacked.
	retry := time.Duration(0)
	o, err := in.Handle(ctx, claim(), func(ctx context.Context, tx *sql.Tx) error {
		if err := apply(ctx, tx); err != nil {
			return err
		}
		return &client.HandlerError{Code: "E_TEST", Err: errors.New("boom"), RetryAfter: &retry}
	})
	var lastErr sql.NullString
	var attempts int
	db.QueryRow(`SELECT attempts, last_error FROM shardmq_inbox`).Scan(&attempts, &lastErr)
	if o != inbox.Failed || err == nil || effects() != 0 || attempts != 1 || !lastErr.Valid {
		t.Fatalf("failing handler: outcome %d, %v, %d effects, attempts %d, last_error %v", o, err, effects(), attempts, lastErr)
	}

	// 2. The redelivery runs it: one effect, processed, acked.
	d := claim()
	if d.Attempt != 2 {
		t.Errorf("redelivery attempt %d, want 2", d.Attempt)
	}
	if o, err := in.Handle(ctx, d, apply); o != inbox.Processed || err != nil || effects() != 1 {
		t.Fatalf("redelivery: outcome %d, %v, %d effects", o, err, effects())
	}
	var status string
	db.QueryRow(`SELECT status, attempts FROM shardmq_inbox`).Scan(&status, &attempts)
	if status != "processed" || attempts != 2 {
		t.Errorf("inbox row %s after %d attempts", status, attempts)
	}

	// 3. The same key again (a re-publish under another transaction, or a
	// delivery whose ack was lost): a duplicate, the handler not run.
	if _, err := c.Produce(ctx, "ib", "", []client.Message{{Key: "m2", Payload: json.RawMessage(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	d = claim()
	d.Key = "m1" // what a redelivery of m1 looks like to the inbox
	ran := false
	if o, err := in.Handle(ctx, d, func(context.Context, *sql.Tx) error { ran = true; return nil }); o != inbox.Duplicate || err != nil || ran {
		t.Fatalf("duplicate: outcome %d, %v, handler ran %v", o, err, ran)
	}
	if !d.Settled() {
		t.Error("the duplicate was not acked")
	}

	// 4. A consumer dies holding the inbox claim; another one's delivery is
	// busy until the lock ends; after it, the message is processed.
	if _, err := c.Produce(ctx, "ib", "", []client.Message{{Key: "m3", Payload: json.RawMessage(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	crashing := inbox.New(db, inbox.Config{Name: "crash", Lock: time.Hour, Logger: quiet,
		Faults: inbox.FaultHooks{AfterClaim: func() error { return inbox.ErrCrash }}})
	d = claim()
	if o, err := crashing.Handle(ctx, d, apply); o != inbox.Crashed || !errors.Is(err, inbox.ErrCrash) {
		t.Fatalf("crash: %d, %v", o, err)
	}
	if _, err := c.Nack(ctx, client.NackItem{Receipt: d.Receipt, RetryAfterMS: new(int64)}); err != nil {
		t.Fatal(err)
	}
	// The redelivery while the lock holds (a delivery value is all the
	// inbox looks at; this one's nack goes nowhere).
	redelivery := &client.Delivery{Key: "m3", Topic: "ib", Subscription: "s"}
	if o, err := in.Handle(ctx, redelivery, apply); o != inbox.Busy || !errors.Is(err, inbox.ErrBusy) || effects() != 1 {
		t.Fatalf("while locked: %d, %v, %d effects", o, err, effects())
	}
	db.Exec(`UPDATE shardmq_inbox SET lock_expires_at = NOW(6) - INTERVAL 1 SECOND WHERE msg_key = 'm3'`) // the lock ends
	if o, err := in.Handle(ctx, claim(), apply); o != inbox.Processed || err != nil || effects() != 2 {
		t.Fatalf("after the lock: %d, %v, %d effects", o, err, effects())
	}
}
