package loadtest

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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
