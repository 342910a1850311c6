package store

import (
	"context"
	"errors"
	"github.com/shardmq/shardmq/internal/testbed"
	"testing"
	"time"
)

// The fence refuses, writing nothing, every write routed with a map older
// than the cluster's fence — the fast produce path, the general one
// (duplicates: no answer from a stale writer) and the other transactions —
// and lets the current and newer maps through.
func TestFenceRefusesOlderMaps(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	at := time.Now()
	if err := f.st.RaiseFence(ctx, 5, []VShardOwner{{VShard: 7, Cluster: "c1", MapVersion: 5}}, "job-1", at); err != nil {
		t.Fatal(err)
	}
	if err := f.st.RaiseFence(ctx, 3, nil, "late", at); err != nil { // never lowers
		t.Fatal(err)
	}
	if v, err := f.st.ShardFence(ctx); err != nil || v != 5 {
		t.Fatalf("fence = %d, %v; want 5", v, err)
	}
	held := f.item("t", "held", `1`)
	if res, err := f.st.Produce(ctx, []ProduceItem{held}); err != nil || res[0].Status != Created {
		t.Fatalf("unfenced produce: %v %v", res, err)
	}

	cases := []struct {
		name    string
		version int64
		refused bool
	}{
		{"older map", 4, true},
		{"the fence's map", 5, false},
		{"newer map", 6, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				var fe *FenceError
				switch {
				case tc.refused && (!errors.As(err, &fe) || fe.Have != tc.version || fe.Need != 5 || !errors.Is(err, ErrUnavailable)):
					t.Fatalf("%s with map %d: %v, want a FenceError (have %d, need 5) that is unavailable", what, tc.version, err, tc.version)
				case !tc.refused && err != nil:
					t.Fatalf("%s with map %d: %v", what, tc.version, err)
				}
			}
			// The fast path: every key new.
			fresh := f.item("t", "fresh-"+tc.name, `1`)
			fresh.MapVersion = tc.version
			_, err := f.st.Produce(ctx, []ProduceItem{fresh})
			check("new key", err)
			if n := f.count(t, "SELECT COUNT(*) FROM message_key WHERE topic = 't' AND msg_key = ?", fresh.Msg.Key); tc.refused && n != 0 {
				t.Fatalf("a refused produce registered its key")
			}
			// The general path: a duplicate is not answered either.
			dup := f.item("t", "held", `1`)
			dup.MapVersion = tc.version
			res, err := f.st.Produce(ctx, []ProduceItem{dup})
			check("duplicate", err)
			if !tc.refused && res[0].Status != Duplicate {
				t.Fatalf("duplicate with map %d: %v", tc.version, res)
			}
			// Any other write transaction (inTx), fenced through ctx.
			_, err = f.st.Ack(WithFence(ctx, Fence{MapVersion: tc.version}), nil, time.Now())
			check("ack", err)
		})
	}
	// A batch is as old as its oldest item.
	a, b := f.item("t", "mixed-a", `1`), f.item("t", "mixed-b", `1`)
	a.MapVersion, b.MapVersion = 9, 4
	if _, err := f.st.Produce(ctx, []ProduceItem{a, b}); !errors.Is(err, ErrFenced) {
		t.Fatalf("batch of maps 9 and 4: %v, want refused", err)
	}
}

// The raise waits for the fenced writes in flight (their shared lock on
// the fence row): a write past the check commits before the raise does,
// and none after it passes.
func TestFenceRaiseWaitsForWritersInFlight(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := checkFence(WithFence(ctx, Fence{MapVersion: 1}), tx); err != nil {
		t.Fatal(err)
	}
	raised := make(chan error, 1)
	go func() { raised <- f.st.RaiseFence(ctx, 2, nil, "job", time.Now()) }()
	select {
	case err := <-raised:
		t.Fatalf("the raise passed a writer holding the fence: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-raised; err != nil {
		t.Fatal(err)
	}
	it := f.item("t", "after", `1`)
	it.MapVersion = 1
	if _, err := f.st.Produce(ctx, []ProduceItem{it}); !errors.Is(err, ErrFenced) {
		t.Fatalf("produce after the raise: %v, want refused", err)
	}
}

// A cleanup's delete carries an OwnerCheck: it runs only while the
// cluster's own record gives every vshard to the check's cluster at its
// version or later.
func TestOwnerCheckGuardsCleanupDeletes(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	owners := []VShardOwner{{VShard: 7, Cluster: "c2", MapVersion: 5}, {VShard: 8, Cluster: "c2", MapVersion: 5}}
	if err := f.st.RecordVShardOwners(ctx, owners, time.Now()); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		check OwnerCheck
		ok    bool
	}{
		{"given to the target", OwnerCheck{Cluster: "c2", MinVersion: 5, VShards: []uint16{7, 8}}, true},
		{"given at an older version than the job's", OwnerCheck{Cluster: "c2", MinVersion: 6, VShards: []uint16{7}}, false},
		{"given to another cluster", OwnerCheck{Cluster: "c3", MinVersion: 5, VShards: []uint16{8}}, false},
		{"a vshard with no record", OwnerCheck{Cluster: "c2", MinVersion: 1, VShards: []uint16{7, 9}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.st.Ack(WithOwnerCheck(ctx, tc.check), nil, time.Now())
			if tc.ok && err != nil || !tc.ok && !errors.Is(err, ErrNotOwnerRecord) {
				t.Fatalf("check %+v: %v", tc.check, err)
			}
			if errors.Is(err, ErrUnavailable) {
				t.Fatalf("a refusal by the record is not unavailable: %v", err)
			}
		})
	}
}
