package loadtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/store"
)

// setupFloor is a Floor on its own database on the bed's first primary.
func setupFloor(t *testing.T) *Floor {
	t.Helper()
	name := testbed.TestDatabase(t, bed, "t_floor_")
	db, err := sql.Open("mysql", bed.Clusters[0].Primary.DSN(name)+"?interpolateParams=true&parseTime=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f := &Floor{DB: db}
	if err := f.Create(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFloorWritesTheBudget runs every floor phase small and checks that
// the rows are what the budget says: every produced message stored once,
// every one consumed exactly once with its acked event and its status.
func TestFloorWritesTheBudget(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx, cancel := context.WithCancel(testtime.Context(t))
	defer cancel()
	f := setupFloor(t)
	batched, err := f.ProduceBatched(ctx, "t", 2, 20, 600*time.Millisecond, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	single, err := f.ProduceSingle(ctx, "t", 8, 2, 600*time.Millisecond, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if batched.Total == 0 || single.Total == 0 || batched.Messages > batched.Total || single.Messages > single.Total {
		t.Fatalf("batched %+v, single %+v: want messages counted within what was moved", batched, single)
	}
	if err := f.Preload(ctx, "t", 130, 3, 50); err != nil {
		t.Fatal(err)
	}
	if err := f.Preload(ctx, "other", 40, 2, 30); err != nil {
		t.Fatal(err)
	}
	produced := batched.Total + single.Total + 130
	consumed, err := f.Consume(ctx, "t", 3, 25, produced)
	if err != nil {
		t.Fatal(err)
	}
	if consumed.Messages != produced {
		t.Fatalf("consumed %d of %d", consumed.Messages, produced)
	}
	messages, deliveries, acked, done, err := f.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if messages != produced+40 || deliveries != 40 || acked != produced || done != produced {
		t.Fatalf("messages %d, deliveries %d, acked events %d, consumed %d; want %d, 40 (the other topic's), %d, %d",
			messages, deliveries, acked, done, produced+40, produced, produced)
	}
}

// TestFloorAcks checks what each kind of ack writes.
func TestFloorAcks(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	for _, tc := range []struct {
		ack                  FloorAck
		leasedOut            bool
		acked, consumed, all int64
	}{
		{AckBudget, false, 30, 30, 30},
		{AckBudget, true, 30, 30, 30},
		{AckFolded, false, 30, 30, 30},
		{AckDeleteOnly, false, 0, 0, 30},
	} {
		t.Run(fmt.Sprint(tc.ack, "/leased-out=", tc.leasedOut), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := &Floor{DB: setupFloor(t).DB, Acks: tc.ack, LeasedOut: tc.leasedOut}
			if err := f.Create(ctx); err != nil {
				t.Fatal(err)
			}
			if err := f.Preload(ctx, "t", 30, 2, 10); err != nil {
				t.Fatal(err)
			}
			if _, err := f.Consume(ctx, "t", 2, 7, 30); err != nil {
				t.Fatal(err)
			}
			messages, deliveries, acked, consumed, err := f.Counts(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if messages != tc.all || deliveries != 0 || acked != tc.acked || consumed != tc.consumed {
				t.Fatalf("messages %d, deliveries %d, acked %d, consumed %d; want %d, 0, %d, %d",
					messages, deliveries, acked, consumed, tc.all, tc.acked, tc.consumed)
			}
			if back, err := ParseFloorAck(tc.ack.String()); err != nil || back != tc.ack {
				t.Fatalf("ParseFloorAck(%q) = %v, %v", tc.ack, back, err)
			}
		})
	}
	if _, err := ParseFloorAck("none"); err == nil {
		t.Fatal(`ParseFloorAck("none") accepted`)
	}
}

// TestFloorAckNeedsTheLease refuses an ack whose token no longer holds the
// deliveries, and writes nothing for it.
func TestFloorAckNeedsTheLease(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	f := setupFloor(t)
	if err := f.Publish(ctx, "t", []FloorMessage{{Key: "a", Payload: []byte(`{}`)}, {Key: "b", Payload: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Publish(ctx, "t", []FloorMessage{{Key: "a", Payload: []byte(`{}`)}}); err == nil {
		t.Fatal("a key published twice was stored twice")
	}
	leases, err := f.Claim(ctx, "t", "c", 10, time.Minute)
	if err != nil || len(leases) != 2 {
		t.Fatalf("claim: %d leases, %v; want 2", len(leases), err)
	}
	stale := append([]FloorLease(nil), leases...)
	for i := range stale {
		stale[i].Token++
	}
	if err := f.Ack(ctx, stale); err == nil {
		t.Fatal("an ack with another token succeeded")
	}
	if _, deliveries, acked, done, _ := f.Counts(ctx); deliveries != 2 || acked != 0 || done != 0 {
		t.Fatalf("after a refused ack: deliveries %d, acked %d, consumed %d; want 2, 0, 0", deliveries, acked, done)
	}
	if again, err := f.Claim(ctx, "t", "c", 10, time.Minute); err != nil || len(again) != 0 {
		t.Fatalf("leased deliveries claimed again: %d, %v", len(again), err)
	}
	if err := f.Ack(ctx, leases); err != nil {
		t.Fatal(err)
	}
	if _, deliveries, acked, done, _ := f.Counts(ctx); deliveries != 0 || acked != 2 || done != 2 {
		t.Fatalf("after the ack: deliveries %d, acked %d, consumed %d; want 0, 2, 2", deliveries, acked, done)
	}
}

// TestFloorOwnedConsumesEachMessageOnce drains a backlog with the owned
// consume in every layout, the final ack on the message row: every
// message of the topic consumed once with its ack, the other topic's
// left as they were.
func TestFloorOwnedConsumesEachMessageOnce(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	for _, layout := range []FloorLayout{LayoutQueue, LayoutInline, LayoutOneRow} {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			ctx := testtime.Context(t)
			f := &Floor{DB: setupFloor(t).DB, Layout: layout, Acks: AckFolded}
			if err := f.Create(ctx); err != nil {
				t.Fatal(err)
			}
			if err := f.Preload(ctx, "t", 260, 3, 40); err != nil {
				t.Fatal(err)
			}
			if err := f.Preload(ctx, "other", 30, 2, 10); err != nil {
				t.Fatal(err)
			}
			run, err := f.ConsumeOwned(ctx, "t", 3, 25, 260, 2*time.Millisecond, 100)
			if err != nil {
				t.Fatal(err)
			}
			if run.Messages != 260 {
				t.Fatalf("consumed %d of 260", run.Messages)
			}
			messages, deliveries, acked, consumed, err := f.Counts(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if messages != 290 || deliveries != 30 || acked != 260 || consumed != 260 {
				t.Fatalf("messages %d, deliveries %d, acked %d, consumed %d; want 290, 30 (the other topic's), 260, 260",
					messages, deliveries, acked, consumed)
			}
			var requests int64
			if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM floor_store WHERE LOCATE(?, ack_slot) > 0 AND acked_sub IS NULL",
				FloorSubscription).Scan(&requests); err != nil || requests != 260 {
				t.Fatalf("%d rows carry the whole final ack (%v); want 260", requests, err)
			}
		})
	}
}

// TestFloorInlineLayout checks the inline layout's budget: a produced
// message is two rows (its key and its message, no delivery row), spread
// over the month partitions it was created in; the owned consume finds
// both months' messages through the claim index (read in claim order,
// no sort) and acks each once, and an ack of a message acked already
// changes nothing and fails.
func TestFloorInlineLayout(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := testtime.Context(t)
	db := setupFloor(t).DB
	if err := (&Floor{DB: db, Layout: LayoutInline}).Create(ctx); err == nil {
		t.Fatal("an inline floor with the budget's ack (a trace row) was created")
	}
	now := time.Now().UTC()
	f := &Floor{DB: db, Layout: LayoutInline, Acks: AckFolded}
	if err := f.Create(ctx); err != nil {
		t.Fatal(err)
	}
	// A second producer a month ahead: its rows are next month's.
	next := &Floor{DB: db, Layout: LayoutInline, Acks: AckFolded, Clock: func() time.Time { return time.Now().AddDate(0, 1, 0) }}
	if err := f.Preload(ctx, "t", 300, 3, 50); err != nil {
		t.Fatal(err)
	}
	var seq atomic.Int64
	for range 4 {
		if err := next.Publish(ctx, "t", floorMessages(50, "next", &seq)); err != nil {
			t.Fatal(err)
		}
	}
	var keys, stored, queued, traced int64
	if err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM floor_key), (SELECT COUNT(*) FROM floor_store),"+
		" (SELECT COUNT(*) FROM floor_queue), (SELECT COUNT(*) FROM floor_trace)").Scan(&keys, &stored, &queued, &traced); err != nil {
		t.Fatal(err)
	}
	if keys != 500 || stored != 500 || queued != 0 || traced != 0 {
		t.Fatalf("after 500 produced: %d keys, %d messages, %d deliveries, %d trace rows; want 500, 500, 0, 0", keys, stored, queued, traced)
	}
	for month, want := range map[time.Time]int64{store.MonthOf(now): 300, store.MonthOf(now.AddDate(0, 1, 0)): 200} {
		var n int64
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM floor_store PARTITION ("+store.PartitionName(month)+")").Scan(&n); err != nil || n != want {
			t.Fatalf("partition %s holds %d messages (%v); want %d", store.PartitionName(month), n, err, want)
		}
	}
	checkClaimScan(t, db, now)

	if _, err := next.ConsumeOwned(ctx, "t", 3, 30, 500, 2*time.Millisecond, 120); err != nil {
		t.Fatal(err)
	}
	messages, deliveries, acked, consumed, err := next.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if messages != 500 || deliveries != 0 || acked != 500 || consumed != 500 {
		t.Fatalf("messages %d, deliveries %d, acked %d, consumed %d; want 500, 0, 500, 500", messages, deliveries, acked, consumed)
	}
	if _, err := f.Claim(ctx, "t", "c", 1, time.Minute); err == nil {
		t.Fatal("the inline layout wrote a durable lease")
	}

	var id uint64
	var status any
	if err := db.QueryRowContext(ctx, "SELECT id, status_at FROM floor_store ORDER BY id LIMIT 1").Scan(&id, &status); err != nil {
		t.Fatal(err)
	}
	o := &floorOwner{f: f, topic: "t", inflight: map[uint64]bool{}}
	again := floorAck{leases: []FloorLease{{MessageID: id, Consumer: "late", Attempt: 1, ClaimedAt: now}}, request: "again"}
	if err := o.flush(ctx, []floorAck{again}); err == nil {
		t.Fatal("a message acked twice")
	}
	var late int
	if err := db.QueryRowContext(ctx, "SELECT LOCATE('late', ack_slot) FROM floor_store WHERE id = ?", id).Scan(&late); err != nil || late != 0 {
		t.Fatalf("the second ack was written: %d (%v)", late, err)
	}
}

// checkClaimScan fails the test unless the owned claim's scan of the
// message rows (floorInlineOwnedScan) reads idx_claim in claim order, with
// no sort.
func checkClaimScan(t *testing.T, db *sql.DB, now time.Time) {
	t.Helper()
	plan := map[string]sql.NullString{}
	rows, err := db.QueryContext(testtime.Context(t), "EXPLAIN "+floorInlineOwnedScan, "t", now, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		v := make([]sql.NullString, len(cols))
		dest := make([]any, len(cols))
		for i := range v {
			dest[i] = &v[i]
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatal(err)
		}
		for i, c := range cols {
			plan[c] = v[i]
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if plan["key"].String != "idx_claim" || strings.Contains(plan["Extra"].String, "filesort") {
		t.Fatalf("the owned claim's scan reads key %q (%s); want idx_claim in claim order", plan["key"].String, plan["Extra"].String)
	}
}

// TestFloorOneRowLayout checks the one-row layout's budget: a produced
// message is one row, in a table that is not partitioned (the registry
// beside it holds only retired keys: TestFloorOneRowRetire); a key
// stored already in the topic fails its whole batch (in another topic it
// is a new message); the owned consume finds
// the messages through the claim index (in claim order, no sort) and
// hands each out once; an ack updates the message row, and a second ack
// of it changes nothing and fails.
func TestFloorOneRowLayout(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := testtime.Context(t)
	db := setupFloor(t).DB
	if err := (&Floor{DB: db, Layout: LayoutOneRow}).Create(ctx); err == nil {
		t.Fatal("a one-row floor with the budget's ack (a trace row) was created")
	}
	now := time.Now().UTC()
	f := &Floor{DB: db, Layout: LayoutOneRow, Acks: AckFolded}
	if err := f.Create(ctx); err != nil {
		t.Fatal(err)
	}
	var registries, partitions int64
	if err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'floor_key'),"+
		" (SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'floor_store' AND PARTITION_NAME IS NOT NULL)").
		Scan(&registries, &partitions); err != nil || registries != 1 || partitions != 0 {
		t.Fatalf("floor_key tables %d, floor_store partitions %d (%v); want 1 (the retired keys'), 0", registries, partitions, err)
	}
	if err := f.Preload(ctx, "t", 300, 3, 50); err != nil {
		t.Fatal(err)
	}
	if err := f.Preload(ctx, "other", 30, 2, 10); err != nil {
		t.Fatal(err)
	}
	rowsPerTable := func() (stored, hashed, queued, traced int64) {
		t.Helper()
		if err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM floor_store), (SELECT COUNT(*) FROM floor_store WHERE payload_hash = UNHEX(MD5(payload))),"+
			" (SELECT COUNT(*) FROM floor_queue), (SELECT COUNT(*) FROM floor_trace)").Scan(&stored, &hashed, &queued, &traced); err != nil {
			t.Fatal(err)
		}
		return
	}
	if stored, hashed, queued, traced := rowsPerTable(); stored != 330 || hashed != 330 || queued != 0 || traced != 0 {
		t.Fatalf("after 330 produced: %d messages (%d with their payload's hash), %d deliveries, %d trace rows; want 330, 330, 0, 0",
			stored, hashed, queued, traced)
	}

	var reused string
	if err := db.QueryRowContext(ctx, "SELECT msg_key FROM floor_store WHERE topic = 't' ORDER BY id DESC LIMIT 1").Scan(&reused); err != nil {
		t.Fatal(err)
	}
	batch := []FloorMessage{{Key: "fresh", Payload: []byte(`{}`)}, {Key: reused, Payload: []byte(`{}`)}}
	var dup *mysql.MySQLError
	if err := f.Publish(ctx, "t", batch); !errors.As(err, &dup) || dup.Number != 1062 {
		t.Fatalf("key %q published twice in topic t: %v; want a duplicate key (1062)", reused, err)
	}
	if stored, _, _, _ := rowsPerTable(); stored != 330 {
		t.Fatalf("a batch with a reused key left %d messages; want 330 (none of the batch)", stored)
	}
	if err := f.Publish(ctx, "elsewhere", batch); err != nil {
		t.Fatalf("topic t's key in another topic: %v", err)
	}

	checkClaimScan(t, db, now)
	if _, err := f.ConsumeOwned(ctx, "t", 3, 30, 300, 2*time.Millisecond, 120); err != nil {
		t.Fatal(err)
	}
	messages, deliveries, acked, consumed, err := f.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if messages != 332 || deliveries != 32 || acked != 300 || consumed != 300 {
		t.Fatalf("messages %d, deliveries %d, acked %d, consumed %d; want 332, 32 (the other topics'), 300, 300", messages, deliveries, acked, consumed)
	}
	var handedTwice int64
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM floor_store WHERE topic = 't' AND (dlv_state <> 1 OR msg_status <> 1 OR ack_slot = REPEAT(0x00, 64))").
		Scan(&handedTwice); err != nil || handedTwice != 0 {
		t.Fatalf("%d of topic t's messages not acked once (%v)", handedTwice, err)
	}
	if _, err := f.Claim(ctx, "t", "c", 1, time.Minute); err == nil {
		t.Fatal("the one-row layout wrote a durable lease")
	}

	// Two more messages of t, claimed and acked by the owner (its epoch
	// row is the consume's).
	if err := f.Publish(ctx, "t", []FloorMessage{{Key: "solo-1", Payload: []byte(`{}`)}, {Key: "solo-2", Payload: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	o := &floorOwner{f: f, topic: "t", inflight: map[uint64]bool{}}
	leases, err := o.claim(ctx, "first", 10)
	if err != nil || len(leases) != 2 {
		t.Fatalf("claim of the two new messages: %d leases, %v; want 2", len(leases), err)
	}
	if err := o.flush(ctx, []floorAck{{leases: leases, request: "once"}}); err != nil {
		t.Fatal(err)
	}
	var state, status, by, request int
	if err := db.QueryRowContext(ctx, "SELECT dlv_state, msg_status, LOCATE('first', ack_slot), LOCATE('once', ack_slot) FROM floor_store WHERE id = ?", leases[0].MessageID).
		Scan(&state, &status, &by, &request); err != nil || state != 1 || status != 1 || by == 0 || request == 0 {
		t.Fatalf("after the ack: state %d, status %d, consumer at %d, request at %d in the slot (%v); want 1, 1, found, found", state, status, by, request, err)
	}
	again := floorAck{leases: []FloorLease{{MessageID: leases[0].MessageID, Consumer: "late", Attempt: 1, ClaimedAt: now}}, request: "again"}
	if err := o.flush(ctx, []floorAck{again}); err == nil {
		t.Fatal("a message acked twice")
	}
	if err := db.QueryRowContext(ctx, "SELECT LOCATE('late', ack_slot) FROM floor_store WHERE id = ?", leases[0].MessageID).Scan(&by); err != nil || by != 0 {
		t.Fatalf("the second ack was written: %d (%v)", by, err)
	}
}

// TestFloorOneRowRetire checks the one-row layout's retention: every row
// leaves floor_store, its key, id and payload hash stay in floor_key, and
// a retired key fails a later publish of its topic as a stored one does.
func TestFloorOneRowRetire(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := testtime.Context(t)
	db := setupFloor(t).DB
	f := &Floor{DB: db, Layout: LayoutOneRow, Acks: AckFolded}
	if err := f.Create(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := (&Floor{DB: db}).Retire(ctx, 10); err == nil {
		t.Fatal("the queue layout retired rows")
	}
	if err := f.Preload(ctx, "t", 250, 3, 40); err != nil {
		t.Fatal(err)
	}
	var reused string
	if err := db.QueryRowContext(ctx, "SELECT msg_key FROM floor_store ORDER BY id LIMIT 1").Scan(&reused); err != nil {
		t.Fatal(err)
	}
	run, err := f.Retire(ctx, 60)
	if err != nil || run.Messages != 250 || run.Total != 250 {
		t.Fatalf("retired %d (total %d), %v; want 250", run.Messages, run.Total, err)
	}
	var stored, keys, matched int64
	if err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM floor_store), (SELECT COUNT(*) FROM floor_key),"+
		" (SELECT COUNT(*) FROM floor_key WHERE topic = 't' AND message_id > 0 AND payload_hash <> REPEAT(0x00, 16))").Scan(&stored, &keys, &matched); err != nil {
		t.Fatal(err)
	}
	if stored != 0 || keys != 250 || matched != 250 {
		t.Fatalf("after the retire: %d messages, %d keys (%d with their id and hash); want 0, 250, 250", stored, keys, matched)
	}
	if err := f.Publish(ctx, "t", []FloorMessage{{Key: "new", Payload: []byte(`{}`)}, {Key: reused, Payload: []byte(`{}`)}}); !errors.Is(err, ErrFloorRetiredKey) {
		t.Fatalf("a retired key published again: %v; want ErrFloorRetiredKey", err)
	}
	if err := f.Publish(ctx, "t", []FloorMessage{{Key: "new", Payload: []byte(`{}`)}}); err != nil {
		t.Fatalf("a new key after a refused batch: %v", err)
	}
	if err := f.Publish(ctx, "u", []FloorMessage{{Key: reused, Payload: []byte(`{}`)}}); err != nil {
		t.Fatalf("topic t's retired key in another topic: %v", err)
	}
	if run, err := f.Retire(ctx, 60); err != nil || run.Messages != 2 {
		t.Fatalf("second retire: %d, %v; want 2", run.Messages, err)
	}
}
