package store

import (
	"context"
	"github.com/shardmq/shardmq/internal/testbed"
	"slices"
	"testing"
)

// A produce answered duplicate or conflict is traced on the message that
// holds the key, in the same transaction; running the same attempt again
// adds no second row, and a batch of new keys (the fast path) writes no
// trace row at all.
func TestRejectedProducesAreTraced(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a := f.item("orders", "k1", `{"a":1}`)
	sameBatch := f.item("orders", "k1", `{"a":1}`)
	if _, err := f.st.Produce(ctx, []ProduceItem{f.item("orders", "fresh-1", `1`), f.item("orders", "fresh-2", `2`)}); err != nil {
		t.Fatal(err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_trace"); n != 0 {
		t.Fatalf("a batch of new keys wrote %d trace rows", n)
	}
	if _, err := f.st.Produce(ctx, []ProduceItem{a, sameBatch}); err != nil {
		t.Fatal(err)
	}
	dup := f.item("orders", "k1", `{"a":1}`)
	conflict := f.item("orders", "k1", `{"a":2}`)
	res, err := f.st.Produce(ctx, []ProduceItem{dup, conflict})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != Duplicate || res[1].Status != Conflict {
		t.Fatalf("got %v and %v, want duplicate and conflict", res[0].Status, res[1].Status)
	}
	// The same attempt once more (a group commit retried whole): no new row.
	if _, err := f.st.Produce(ctx, []ProduceItem{dup}); err != nil {
		t.Fatal(err)
	}
	tr, err := f.st.Trace(ctx, "orders", "k1", f.now)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	var conflictEv Event
	for _, e := range tr.Events {
		types = append(types, e.Type)
		if e.Type == EventConflict {
			conflictEv = e
		}
		if e.MessageID != a.Msg.ID || e.VShard != a.Msg.VShard {
			t.Errorf("event %s on message %d vshard %d, want %d vshard %d", e.Type, e.MessageID, e.VShard, a.Msg.ID, a.Msg.VShard)
		}
	}
	want := []string{EventProduced, EventDuplicate, EventDuplicate, EventConflict}
	if !slices.Equal(types, want) {
		t.Fatalf("events %v, want %v", types, want)
	}
	if conflictEv.ErrorCode != "payload_differs" || conflictEv.Error == "" {
		t.Errorf("conflict event %+v does not say what differed", conflictEv)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_trace WHERE id = ?", dup.Msg.ID); n != 1 {
		t.Errorf("the retried attempt has %d trace rows, want 1", n)
	}
	// AppendEvents (the router's cache-answered attempts) is exactly once too.
	ev := RejectedEvent(f.item("orders", "k1", `{"a":1}`), Duplicate, a.Msg.ID, a.Msg.VShard)
	for range 2 {
		if err := f.st.AppendEvents(ctx, []Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event = ?", a.Msg.ID, EventDuplicate); n != 3 {
		t.Errorf("%d duplicate rows, want 3", n)
	}
}
