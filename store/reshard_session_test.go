package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
)

// A leader's session runs under its limits; a newer leader's session
// kills the older one's connections — its open transaction rolled back,
// its locks released — and the older leader's new connections are
// refused.
func TestReshardSessionTakeOver(t *testing.T) {
	t.Parallel()
	testbed.Need(t)
	f := setup(t)
	ctx := context.Background()
	var items []ProduceItem
	for i := 0; i < 20; i++ {
		items = append(items, f.item("t", "k"+string(rune('a'+i)), `{"i":1}`))
	}
	if _, err := f.st.Produce(ctx, items); err != nil {
		t.Fatal(err)
	}
	old, killed, err := f.st.OpenReshardSession(ctx, ReshardSession{Epoch: 1, Router: "a", LockWait: 2 * time.Second, StatementTime: time.Second})
	if err != nil || killed != 0 {
		t.Fatalf("first session: killed %d, %v", killed, err)
	}
	t.Cleanup(func() { old.Close() })
	var lockWait int
	if err := old.DB().QueryRowContext(ctx, "SELECT @@SESSION.innodb_lock_wait_timeout").Scan(&lockWait); err != nil || lockWait != 2 {
		t.Fatalf("lock wait of a reshard session: %d (%v), want 2", lockWait, err)
	}
	if f.st.mariadb {
		// A statement past its time limit is ended by the server.
		began := time.Now()
		old.DB().ExecContext(ctx, "SELECT SLEEP(30)")
		if d := time.Since(began); d > 15*time.Second {
			t.Fatalf("SLEEP(30) ran %v under a 1s statement limit", d)
		}
	}
	// The old leader stalls with the deliveries deleted, uncommitted.
	tx, err := old.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if n, err := tx.ExecContext(ctx, "DELETE FROM message_queue WHERE vshard = 7"); err != nil {
		t.Fatal(err)
	} else if k, _ := n.RowsAffected(); k != 20 {
		t.Fatalf("stalled delete: %d rows", k)
	}
	// Another pool meets its locks and gives up after its own limit.
	waiter, _, err := f.st.OpenReshardSession(ctx, ReshardSession{Epoch: 1, Router: "a2", LockWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { waiter.Close() })
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := waiter.MoveDeleteVShards(wctx, "message_queue", []uint16{7}, 100); err == nil || wctx.Err() != nil {
		t.Fatalf("a delete behind the stalled transaction: %v (context %v), want a lock wait timeout", err, wctx.Err())
	}

	next, killed, err := f.st.OpenReshardSession(ctx, ReshardSession{Epoch: 2, Router: "b"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { next.Close() })
	if killed < 2 { // the stalled one and the waiter's, at least
		t.Fatalf("killed %d connections of epoch 1", killed)
	}
	n, err := next.MoveDeleteVShards(ctx, "message_queue", []uint16{7}, 100)
	if err != nil || n != 20 {
		t.Fatalf("delete by the new leader: %d rows, %v; want the 20 the stalled one had locked", n, err)
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("the stalled transaction committed after the takeover")
	}
	if _, err := old.MoveCount(ctx, "message_queue", []uint16{7}); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("the old leader's next statement: %v, want ErrSuperseded", err)
	}
	if got := f.count(t, "SELECT COUNT(*) FROM reshard_session WHERE epoch < 2"); got != 0 {
		t.Fatalf("%d sessions of epoch 1 still recorded", got)
	}
}

// A transaction left open by a client that went quiet (a router stopped
// mid-transaction) is ended by EndStalledTransactions once it has been
// idle long enough; a busy connection is left alone.
func TestEndStalledTransactions(t *testing.T) {
	t.Parallel()
	testbed.Need(t)
	f := setup(t)
	ctx := context.Background()
	if _, err := f.st.Produce(ctx, []ProduceItem{f.item("t", "stalled", `{}`)}); err != nil {
		t.Fatal(err)
	}
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "DELETE FROM message_queue WHERE vshard = 7"); err != nil {
		t.Fatal(err)
	}
	if n, err := f.st.EndStalledTransactions(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("with a bound of an hour: killed %d, %v", n, err)
	}
	time.Sleep(2100 * time.Millisecond)
	n, err := f.st.EndStalledTransactions(ctx, 2*time.Second)
	if err != nil || n < 1 {
		t.Fatalf("killed %d, %v; want the stalled transaction's connection", n, err)
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("the stalled transaction committed after it was ended")
	}
	if got := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE vshard = 7"); got != 1 {
		t.Fatalf("%d deliveries after the stalled delete was ended, want 1", got)
	}
}
