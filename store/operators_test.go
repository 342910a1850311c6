package store

import (
	"context"
	"fmt"
	"github.com/shardmq/shardmq/internal/testbed"
	"testing"
	"time"
)

// DeleteDead removes exactly the chosen dead letters of the subscription:
// not a live delivery among the ids, not another subscription's, and a
// second delete of the same ids finds nothing.
func TestDeleteDeadTakesOnlyTheChosenDeadLetters(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	var items []ProduceItem
	for _, k := range []string{"a", "b", "c", "live"} {
		items = append(items, f.item("t", k, `1`, "default", "other"))
	}
	if _, err := f.st.Produce(ctx, items); err != nil {
		t.Fatal(err)
	}
	id := func(i int) uint64 { return items[i].Msg.ID }
	f.db.Exec("UPDATE message_queue SET is_dead = 1, error_code = 'E', dead_at = ? WHERE message_id IN (?, ?, ?)", f.now, id(0), id(1), id(2))
	n, err := f.st.DeleteDead(ctx, "t", "default", []uint64{id(0), id(2), id(3)})
	if err != nil || n != 2 {
		t.Fatalf("delete: %d %v, want 2", n, err)
	}
	left := func(sub string) string {
		var out []uint64
		rows, err := f.db.Query("SELECT message_id FROM message_queue WHERE subscription = ? ORDER BY message_id", sub)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var v uint64
			rows.Scan(&v)
			out = append(out, v)
		}
		return fmt.Sprint(out)
	}
	if got, want := left("default"), fmt.Sprint([]uint64{id(1), id(3)}); got != want {
		t.Fatalf("default keeps %s, want %s (b dead, live ready)", got, want)
	}
	if got, want := left("other"), fmt.Sprint([]uint64{id(0), id(1), id(2), id(3)}); got != want {
		t.Fatalf("the other subscription lost deliveries: %s, want %s", got, want)
	}
	if n, err := f.st.DeleteDead(ctx, "t", "default", []uint64{id(0)}); err != nil || n != 0 {
		t.Fatalf("second delete: %d %v, want 0", n, err)
	}
	if n, err := f.st.DeleteDead(ctx, "t", "default", nil); err != nil || n != 0 {
		t.Fatalf("delete of no ids: %d %v, want 0 (never all)", n, err)
	}
}

// LeaseHolders counts live leases by consumer: an expired lease, a dead
// letter leased on the dead-letter channel and a ready delivery are not
// in flight.
func TestLeaseHoldersCountsLiveLeasesByConsumer(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	var items []ProduceItem
	for i := range 7 {
		items = append(items, f.item("t", fmt.Sprintf("k%d", i), `1`))
	}
	if _, err := f.st.Produce(ctx, items); err != nil {
		t.Fatal(err)
	}
	id := func(i int) uint64 { return items[i].Msg.ID }
	lease := func(i int, by string, at time.Time, until time.Time) {
		if _, err := f.db.Exec("UPDATE message_queue SET locked_by = NULLIF(?, ''), claim_token = ?, claimed_at = ?, available_at = ? WHERE message_id = ?",
			by, 100+i, at, until, id(i)); err != nil {
			t.Fatal(err)
		}
	}
	early, late := f.now.Add(-time.Minute), f.now.Add(-time.Second)
	lease(0, "w1", late, f.now.Add(time.Minute))
	lease(1, "w1", early, f.now.Add(time.Minute))
	lease(2, "w2", late, f.now.Add(time.Minute))
	lease(3, "", late, f.now.Add(time.Minute))
	lease(4, "w3", early, f.now.Add(-time.Second)) // expired
	lease(5, "w4", late, f.now.Add(time.Minute))
	f.db.Exec("UPDATE message_queue SET is_dead = 1 WHERE message_id = ?", id(5)) // the dead-letter channel's
	got, err := f.st.LeaseHolders(ctx, "t", "default", f.now, 10)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, h := range got {
		s = append(s, fmt.Sprintf("%q:%d@%s", h.Consumer, h.InFlight, h.OldestLeaseAt.UTC().Format(time.RFC3339)))
	}
	want := fmt.Sprint([]string{
		fmt.Sprintf("%q:2@%s", "w1", early.Format(time.RFC3339)),
		fmt.Sprintf("%q:1@%s", "", late.Format(time.RFC3339)),
		fmt.Sprintf("%q:1@%s", "w2", late.Format(time.RFC3339)),
	})
	if fmt.Sprint(s) != want {
		t.Fatalf("lease holders %v, want %s", s, want)
	}
	if got, err := f.st.LeaseHolders(ctx, "t", "default", f.now, 1); err != nil || len(got) != 1 || got[0].Consumer != "w1" {
		t.Fatalf("limit 1: %+v %v", got, err)
	}
}
