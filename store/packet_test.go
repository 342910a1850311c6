package store

import (
	"context"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
)

// Must-show (e) of issue 26, at the statements: ten messages of 1 MiB of
// zero bytes — each escaped to 2 MiB in a statement, 20 MiB together,
// above the test servers' max_allowed_packet of 16 MiB — are copied to
// another cluster, verified and archived, in statements the server takes.
func TestCopiesSizedByBytes(t *testing.T) {
	t.Parallel()
	testbed.Need(t)
	src, dst := setup(t), setup(t)
	ctx := context.Background()
	var items []ProduceItem
	for i := 0; i < 10; i++ {
		it := src.item("big", "k"+string(rune('a'+i)), "")
		it.Msg.PayloadJSON = false
		it.Msg.Payload = make([]byte, 1<<20)
		items = append(items, it)
		// One message per statement, as the API would take them.
		if _, err := src.st.Produce(ctx, []ProduceItem{it}); err != nil {
			t.Fatal(err)
		}
	}
	packet, err := src.st.maxPacket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if packet >= 20<<20 {
		t.Skipf("max_allowed_packet is %d: the ten messages would fit one statement anyway", packet)
	}
	moving := []uint16{7}
	n := copyVShards(t, src.st, dst.st, moving, 500)
	if n != 10+10+10 { // keys, messages, deliveries
		t.Fatalf("copied %d rows, want 30", n)
	}
	for table, same := range sameBuckets(t, src.st, dst.st, moving) {
		if !same {
			t.Errorf("%s differs after the copy", table)
		}
	}
	if got := dst.count(t, "SELECT COUNT(*) FROM message_store WHERE vshard = 7 AND LENGTH(payload) = 1048576 AND payload = REPEAT(0x00, 1048576)"); got != 10 {
		t.Fatalf("%d whole payloads on the target, want 10", got)
	}
	// A bucket's rows upserted again (the sync's path) go in parts too.
	rows, err := src.st.MoveBucketRows(ctx, TableMessages, moving, items[0].Msg.ID>>moveBucketShift, false)
	if err != nil || len(rows) == 0 {
		t.Fatalf("bucket rows: %d, %v", len(rows), err)
	}
	var plain []MoveRow
	for _, r := range rows {
		plain = append(plain, r[:len(r)-1])
	}
	if err := dst.st.MoveWrite(ctx, TableMessages, plain); err != nil {
		t.Fatalf("upsert of a bucket of large rows: %v", err)
	}
	// The archive copy: message_store → archive_message, as retention does.
	sp := Span{To: time.Now().Add(time.Hour), VFrom: 0, VTo: 1023}
	var after uint64
	copied := 0
	for {
		batch, last, err := dst.st.TierRead(ctx, TableMessages, sp, after, 500)
		if err != nil {
			t.Fatal(err)
		}
		if len(batch) == 0 {
			break
		}
		if err := dst.st.TierWrite(ctx, TableArchiveMessages, batch); err != nil {
			t.Fatalf("archive copy: %v", err)
		}
		copied += len(batch)
		after = last
	}
	if copied != 10 {
		t.Fatalf("archived %d messages, want 10", copied)
	}
	if got := dst.count(t, "SELECT COUNT(*) FROM archive_message WHERE payload = REPEAT(0x00, 1048576)"); got != 10 {
		t.Fatalf("%d whole payloads archived, want 10", got)
	}
}

// byBytes keeps every run within the budget, a larger row alone.
func TestByBytes(t *testing.T) {
	t.Parallel()
	small := MoveRow{[]byte("abc")}
	big := MoveRow{make([]byte, 1000)}
	cases := []struct {
		name   string
		rows   []MoveRow
		budget int
		runs   []int
	}{
		{"empty", nil, 100, nil},
		{"all fit", []MoveRow{small, small, small}, 1000, []int{3}},
		{"one each", []MoveRow{small, small}, 20, []int{1, 1}},
		{"large alone", []MoveRow{small, big, small}, 100, []int{1, 1, 1}},
		{"large then small fit", []MoveRow{big, small, small}, 2100, []int{3}},
	}
	for _, c := range cases {
		var got []int
		for _, run := range byBytes(c.rows, c.budget) {
			got = append(got, len(run))
		}
		if len(got) != len(c.runs) {
			t.Errorf("%s: runs %v, want %v", c.name, got, c.runs)
			continue
		}
		for i := range got {
			if got[i] != c.runs[i] {
				t.Errorf("%s: runs %v, want %v", c.name, got, c.runs)
			}
		}
	}
}
