package store

import (
	"context"
	"github.com/shardmq/shardmq/internal/testbed"
	"testing"
	"time"
)

// copyVShards copies every table's rows of vshards from src to dst in
// pages of limit rows, as a resharding job does.
func copyVShards(t *testing.T, src, dst *Store, vshards []uint16, limit int) int {
	t.Helper()
	ctx := context.Background()
	total := 0
	for _, tb := range MoveTables() {
		var cur MoveCursor
		for {
			rows, next, err := src.MoveRead(ctx, tb.Name, vshards, cur, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) == 0 {
				break
			}
			if err := dst.MoveWrite(ctx, tb.Name, rows); err != nil {
				t.Fatal(err)
			}
			total += len(rows)
			cur = next
		}
	}
	return total
}

func sameBuckets(t *testing.T, a, b *Store, vshards []uint16) map[string]bool {
	t.Helper()
	ctx := context.Background()
	out := map[string]bool{}
	for _, tb := range MoveTables() {
		x, err := a.MoveBuckets(ctx, tb.Name, vshards)
		if err != nil {
			t.Fatal(err)
		}
		y, err := b.MoveBuckets(ctx, tb.Name, vshards)
		if err != nil {
			t.Fatal(err)
		}
		same := len(x) == len(y)
		for k, v := range x {
			if y[k] != v {
				same = false
			}
		}
		out[tb.Name] = same
	}
	return out
}

// A vshard's rows copied page by page (composite keys included) arrive
// whole, twice is harmless, the buckets' counts and checksums agree, a
// change on the source shows in them, a lease taken on the source acks on
// the target, claims can skip vshards, and keys delete the rows.
func TestMoveCopiesVerifiesAndDeletes(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	src, dst := setup(t), setup(t)
	ctx := context.Background()
	var items []ProduceItem
	for i := 0; i < 30; i++ {
		it := src.item("t", "k"+string(rune('a'+i%26))+string(rune('a'+i/26)), `{"i":1}`, "a", "b")
		if i >= 25 {
			it.Msg.VShard = 8 // stays
		}
		items = append(items, it)
	}
	if _, err := src.st.Produce(ctx, items); err != nil {
		t.Fatal(err)
	}
	leased := src.claim(t, "a", 4, time.Hour, src.now) // priority then age: the vshard 7 ones
	if _, err := src.st.Ack(ctx, []Lease{lease(leased[0], "a")}, src.now); err != nil {
		t.Fatal(err)
	}
	loads, err := src.st.VShardLoads(ctx, src.now.Add(-time.Hour))
	if err != nil || loads[7] != (VShardLoad{25, 25}) || loads[8] != (VShardLoad{5, 5}) {
		t.Fatalf("vshard loads %v (%v)", loads, err)
	}
	if later, _ := src.st.VShardLoads(ctx, src.now.Add(time.Hour)); later[7] != (VShardLoad{25, 0}) {
		t.Fatalf("vshard 7 has recent messages from the future: %v", later[7])
	}
	moving := []uint16{7}
	n := copyVShards(t, src.st, dst.st, moving, 7)
	// 25 keys, 25 messages, 49 deliveries (one acked), 1 acked event.
	if n != 25+25+49+1 {
		t.Fatalf("copied %d rows", n)
	}
	if again := copyVShards(t, src.st, dst.st, moving, 500); again != n {
		t.Fatalf("second copy read %d rows, want %d", again, n)
	}
	for table, same := range sameBuckets(t, src.st, dst.st, moving) {
		if !same {
			t.Errorf("%s differs after the copy", table)
		}
	}
	if k := dst.count(t, "SELECT COUNT(*) FROM message_store WHERE vshard = 8"); k != 0 {
		t.Fatalf("copied %d rows of a vshard that does not move", k)
	}
	// The lease moved with its claim token: its ack works on the target.
	st, err := dst.st.Ack(ctx, []Lease{lease(leased[1], "a")}, dst.now)
	if err != nil || st[0] != LeaseOK {
		t.Fatalf("ack on the target of a lease taken on the source: %v %v", st, err)
	}
	// A change on the source (the same ack) shows in the buckets.
	if same := sameBuckets(t, src.st, dst.st, moving); same["message_queue"] {
		t.Fatal("buckets agree although a delivery was acked on one side only")
	}
	if _, err := src.st.Ack(ctx, []Lease{lease(leased[1], "a")}, src.now); err != nil {
		t.Fatal(err)
	}
	// The ack's trace events carry their own ids on each side: sync them
	// the way a job does, row by row in the differing bucket.
	for table, same := range sameBuckets(t, src.st, dst.st, moving) {
		if !same && table != "message_trace" {
			t.Errorf("%s differs after the same ack on both sides", table)
		}
	}
	// Claims skip excluded vshards.
	got, err := src.st.Claim(ctx, ClaimRequest{Topic: "t", Subscription: "b", Consumer: "w", Max: 100, Lease: time.Minute,
		Token: src.ids.Next(), MaxAttempts: 5, Now: src.now, ExcludeVShards: []uint16{7}})
	if err != nil || len(got) != 5 {
		t.Fatalf("claim excluding vshard 7: %d deliveries, %v; want the 5 of vshard 8", len(got), err)
	}
	for _, c := range got {
		if c.Message.VShard != 8 {
			t.Fatalf("claimed a delivery of excluded vshard %d", c.Message.VShard)
		}
	}
	// Deliveries go by vshard, limit per statement, others untouched.
	before8 := src.count(t, "SELECT COUNT(*) FROM message_queue WHERE vshard = 8")
	if n, err := src.st.MoveDeleteVShards(ctx, "message_queue", moving, 7); err != nil || n < 7 {
		t.Fatalf("delete deliveries by vshard: %d %v", n, err)
	}
	if left, _ := src.st.MoveCount(ctx, "message_queue", moving); left != 0 {
		t.Fatalf("%d deliveries left", left)
	}
	if after8 := src.count(t, "SELECT COUNT(*) FROM message_queue WHERE vshard = 8"); after8 != before8 || after8 == 0 {
		t.Fatalf("vshard 8 deliveries %d, before %d", after8, before8)
	}
	// Delete by key, page by page.
	for _, tb := range MoveTables() {
		var cur MoveCursor
		for {
			keys, next, err := dst.st.MoveReadKeys(ctx, tb.Name, moving, cur, 6)
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) == 0 {
				break
			}
			if _, err := dst.st.MoveDelete(ctx, tb.Name, keys); err != nil {
				t.Fatal(err)
			}
			cur = next
		}
		if left, err := dst.st.MoveCount(ctx, tb.Name, moving); err != nil || left != 0 {
			t.Fatalf("%s: %d rows left after the delete (%v)", tb.Name, left, err)
		}
	}
}

// A message row whose final ack's slot is empty fingerprints as it did
// before the slot existed, so the sums kept in older cold files'
// manifests still verify a restore; a filled slot counts.
func TestFingerprintLeavesAnEmptySlotOut(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ids := f.produce(t, 2, "")
	before := (&moveTable{cols: messageStoreMove.cols[:len(messageStoreMove.cols)-1]}).rowText()
	now := (&moveTable{cols: messageStoreMove.cols}).rowText()
	sums := func() (old, cur int64) {
		t.Helper()
		if err := f.db.QueryRow("SELECT SUM(CRC32("+before+")), SUM(CRC32("+now+")) FROM message_store").Scan(&old, &cur); err != nil {
			t.Fatal(err)
		}
		return old, cur
	}
	if old, cur := sums(); old != cur {
		t.Fatalf("empty slots: sum %d, %d without the slot", cur, old)
	}
	slot, _ := encodeAckSlot(finalAck{sub: "default", consumer: "w", attempt: 1}, time.Now())
	if _, err := f.db.Exec("UPDATE message_store SET ack_slot = ? WHERE id = ?", slot, ids[0]); err != nil {
		t.Fatal(err)
	}
	if old, cur := sums(); old == cur {
		t.Fatal("a filled slot left the fingerprint unchanged")
	}
}
