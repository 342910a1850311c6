package store

import (
	"context"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
)

// orderIndexOf says whether the fixture's message_queue has idx_order.
func (f *fixture) orderIndexOf(t *testing.T) bool {
	t.Helper()
	on, err := orderIndexPresent(context.Background(), f.db)
	if err != nil {
		t.Fatal(err)
	}
	return on
}

// A new cluster's migration drops idx_order at once; order rows live as
// long as their deliveries: written by produce, one per subscription, none
// for a message without an order key, deleted by the owners' acks (the
// fast flush here; the general one in the ordered tests) and by the
// durable paths (a purge of dead letters here).
func TestOrderRowsFollowTheirDeliveries(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	if f.orderIndexOf(t) || !f.st.orderTable.Load() {
		t.Fatal("a new cluster keeps idx_order after its migration")
	}
	keyed := f.produce(t, 3, "K", "s", "s2")
	plain := f.produce(t, 2, "", "s")
	if n := f.count(t, "SELECT COUNT(*) FROM message_order"); n != 6 {
		t.Fatalf("%d order rows, want 6 (3 keyed messages × 2 subscriptions)", n)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_order WHERE message_id IN (?, ?)", plain[0], plain[1]); n != 0 {
		t.Fatal("order rows for messages without an order key")
	}
	heads, err := f.st.OrderHeads(ctx, "t", "s", []string{"K", "none"})
	if err != nil || len(heads) != 1 || heads["K"] != keyed[0] {
		t.Fatalf("heads %v, %v; want K → %d", heads, err, keyed[0])
	}

	g, _, err := f.st.AcquireOwner(ctx, "t", "s", "r1", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	u := OwnedUnit{Topic: "t", Subscription: "s", Epoch: g.Epoch}
	now := f.now.Add(time.Second)
	ack := []OwnedAck{{MessageID: keyed[0], VShard: 7, OrderKey: "K", Consumer: "w", Attempt: 1, ClaimedAt: now},
		{MessageID: plain[0], VShard: 7, Consumer: "w", Attempt: 1, ClaimedAt: now}}
	if _, path, err := f.st.flushOwned(ctx, []OwnedFlush{{Unit: u, Acks: ack}}, now, true); err != nil || path != flushFast {
		t.Fatalf("flush of an unordered ack with an order key: path %v, %v; want the fast path", path, err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_order WHERE message_id = ?", keyed[0]); n != 1 {
		t.Fatalf("%d order rows of the acked message, want 1 (its other subscription's)", n)
	}
	heads, err = f.st.OrderHeads(ctx, "t", "s", []string{"K"})
	if err != nil || heads["K"] != keyed[1] {
		t.Fatalf("heads after the head's ack: %v, %v; want %d", heads, err, keyed[1])
	}

	// A dead head does not hold its key; purged, its row goes with it.
	if _, err := f.db.ExecContext(ctx, "UPDATE message_queue SET is_dead = 1, dead_at = NOW(6) WHERE subscription = 's' AND message_id = ?", keyed[1]); err != nil {
		t.Fatal(err)
	}
	if heads, err = f.st.OrderHeads(ctx, "t", "s", []string{"K"}); err != nil || heads["K"] != keyed[2] {
		t.Fatalf("heads behind a dead letter: %v, %v; want %d", heads, err, keyed[2])
	}
	if n, err := f.st.DeleteDead(ctx, "t", "s", []uint64{keyed[1]}); err != nil || n != 1 {
		t.Fatalf("delete of the dead letter: %d, %v", n, err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_order WHERE subscription = 's' AND message_id = ?", keyed[1]); n != 0 {
		t.Fatal("a purged dead letter kept its order row")
	}

	// An ordered ack takes the general path, which deletes its order row.
	ordered := []OwnedAck{{MessageID: keyed[2], VShard: 7, OrderKey: "K", Ordered: true, Consumer: "w", Attempt: 1, ClaimedAt: now}}
	if _, path, err := f.st.flushOwned(ctx, []OwnedFlush{{Unit: u, Acks: ordered}}, now, true); err != nil || path != flushGeneral {
		t.Fatalf("flush of an ordered ack: path %v, %v; want the general path", path, err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_order WHERE subscription = 's' AND message_id = ?", keyed[2]); n != 0 {
		t.Fatal("an ordered ack kept its order row")
	}

	// The general produce path and reconciliation's re-created deliveries
	// write their order rows too.
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	it := f.item("t", "general", `{}`, "s3")
	it.Msg.OrderKey = "G"
	if err := insertDeliveries(ctx, tx, []*Message{it.Msg}, []string{"s3"}, map[uint64]time.Time{it.Msg.ID: f.now}); err != nil {
		t.Fatal(err)
	}
	lost := delivery{messageID: keyed[1], subscription: "s", topic: "t", vshard: 7, orderKey: "K"}
	if _, err := restoreDeliveries(ctx, tx, []delivery{lost}, f.now); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM message_order WHERE (message_id, subscription) IN ((?, 's3'), (?, 's'))", it.Msg.ID, keyed[1]).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d order rows of an inserted and a restored delivery, want 2 (%v)", n, err)
	}
}

// An upgrade while a router older than the order table is live keeps
// idx_order and reads heads through it; the first beat without such a
// router fills in the rows that router wrote without the table, drops the
// index, and heads read the same through message_order. A router that
// still believes the index is there switches when the server says it is
// gone.
func TestOrderIndexDroppedOnceNoOlderRouterIsLive(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := f.db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// The cluster as migration 22 left it, with a live router of that version.
	exec("DROP TABLE message_order")
	exec("ALTER TABLE message_queue ADD KEY idx_order (topic, subscription, order_key, is_dead, message_id)")
	exec("DELETE FROM schema_migrations WHERE version = ?", OrderTableSince)
	exec("INSERT INTO router_member (router, addr, seen_at, schema_version) VALUES ('old', '127.0.0.1:1', NOW(6), ?)", OrderTableSince-1)
	// And an older router with no address: seen only by its heartbeats.
	exec("INSERT INTO heartbeat (router, beat_at) VALUES ('old-unaddressed', NOW(6))")
	// What the older router produced: deliveries with an order key, no order rows.
	old := func(n int) []uint64 {
		t.Helper()
		var ids []uint64
		for range n {
			id := f.ids.Next()
			exec("INSERT INTO message_queue (message_id, subscription, topic, vshard, priority, order_key, available_at) VALUES (?, 's', 't', 7, 0, 'K', ?)", id, f.now)
			ids = append(ids, id)
		}
		return ids
	}
	before := old(2)

	if err := f.st.Migrate(ctx, time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	if !f.orderIndexOf(t) || f.st.orderTable.Load() {
		t.Fatal("idx_order dropped while an older router is live")
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_order"); n != 2 {
		t.Fatalf("%d order rows after the migration, want the 2 deliveries' rows", n)
	}
	after := old(1) // the older router goes on writing without order rows
	mine := f.produce(t, 1, "K", "s")
	// The older router acks one that a newer router produced: its order
	// row stays behind until the drop.
	gone := f.produce(t, 1, "K", "s")
	exec("DELETE FROM message_queue WHERE message_id = ?", gone[0])
	heads, err := f.st.OrderHeads(ctx, "t", "s", []string{"K"})
	if err != nil || heads["K"] != before[0] {
		t.Fatalf("heads through idx_order: %v, %v; want %d", heads, err, before[0])
	}

	// Another router's Store that learnt of the index before the drop.
	var name string
	if err := f.db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	other, err := Open(ctx, bed.Clusters[0].Primary.DSN(name), Options{IDs: f.ids})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	members := []Member{{Router: "old", SchemaVersion: OrderTableSince - 1}, {Router: "new", SchemaVersion: SchemaVersion()}}
	if err := f.st.DropOrderIndexIfReady(ctx, members); err != nil || !f.orderIndexOf(t) {
		t.Fatalf("dropped with an older member live (%v)", err)
	}
	// The addressed older router leaves: a beat tries the drop in the
	// background, which the unaddressed one's heartbeats still hold off.
	exec("DELETE FROM router_member WHERE router = 'old'")
	if _, _, err := f.st.Beat(ctx, "new", "127.0.0.1:2", time.Minute); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); f.st.orderDropping.Load() || f.st.orderDropAfter.Load() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no drop tried 20 s after a beat with no older member")
		}
	}
	if !f.orderIndexOf(t) || f.st.orderTable.Load() {
		t.Fatal("idx_order dropped while an unaddressed older router beats")
	}
	// It leaves too; the next try (its retry time passed) drops the index.
	exec("DELETE FROM heartbeat WHERE router = 'old-unaddressed'")
	f.st.orderDropAfter.Store(0)
	if _, _, err := f.st.Beat(ctx, "new", "127.0.0.1:2", time.Minute); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); !f.st.orderTable.Load(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("heads not read through message_order 20 s after a beat with no older router")
		}
	}
	if f.orderIndexOf(t) {
		t.Fatal("idx_order still there after the drop")
	}
	for _, id := range append(append(before, after...), mine...) {
		if n := f.count(t, "SELECT COUNT(*) FROM message_order WHERE message_id = ?", id); n != 1 {
			t.Fatalf("delivery %d has %d order rows after the drop, want 1", id, n)
		}
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_order WHERE message_id = ?", gone[0]); n != 0 {
		t.Fatal("an order row whose delivery an older router deleted survived the drop")
	}
	for _, st := range []*Store{f.st, other} {
		heads, err := st.OrderHeads(ctx, "t", "s", []string{"K"})
		if err != nil || heads["K"] != before[0] {
			t.Fatalf("heads through message_order: %v, %v; want %d", heads, err, before[0])
		}
	}
	if !other.orderTable.Load() {
		t.Fatal("a Store that read with idx_order gone did not switch to message_order")
	}
}

// A cluster that kept idx_order past its migration (an older router was
// live) drops it at a router's next start once none is: routers without
// an address never beat the membership that drops it in the background.
func TestOrderIndexDroppedAtStartOnceNoOlderRouterIsLive(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	if _, err := f.db.ExecContext(ctx, "ALTER TABLE message_queue ADD KEY idx_order (topic, subscription, order_key, is_dead, message_id)"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.ExecContext(ctx, "INSERT INTO heartbeat (router, beat_at) VALUES ('old', NOW(6))"); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Migrate(ctx, time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	if !f.orderIndexOf(t) || f.st.orderTable.Load() {
		t.Fatal("idx_order dropped at start while an older router beats")
	}
	if _, err := f.db.ExecContext(ctx, "UPDATE heartbeat SET schema_version = ? WHERE router = 'old'", SchemaVersion()); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Migrate(ctx, time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	if f.orderIndexOf(t) || !f.st.orderTable.Load() {
		t.Fatal("idx_order kept at a start with every router upgraded")
	}
}
