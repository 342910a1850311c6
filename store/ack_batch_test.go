package store

import (
	"context"
	"fmt"
	"github.com/shardmq/shardmq/internal/testbed"
	"testing"
	"time"
)

// TestAckManyKeepsEachRequestsOutcome: several requests' acks in one
// transaction are deleted, traced with their own request id, claim time
// and consumer, and their messages marked consumed; a lost lease, a
// receipt repeated by a later group and one acked before each get their
// own status, as if the requests had run one after the other.
func TestAckManyKeepsEachRequestsOutcome(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	var items []ProduceItem
	for i := range 8 {
		items = append(items, f.item("t", fmt.Sprint("k", i), fmt.Sprintf(`{"i":%d}`, i), "a", "b"))
	}
	if _, err := f.st.Produce(ctx, items); err != nil {
		t.Fatal(err)
	}
	ca := f.claim(t, "a", 8, time.Minute, f.now)
	cb := f.claim(t, "b", 8, time.Minute, f.now)
	if len(ca) != 8 || len(cb) != 8 {
		t.Fatalf("claimed %d and %d, want 8 each", len(ca), len(cb))
	}
	leases := func(cs []Claimed, sub string) []Lease {
		var out []Lease
		for _, c := range cs {
			out = append(out, lease(c, sub))
		}
		return out
	}
	lost := lease(cb[3], "b")
	lost.Token++
	ordered := lease(cb[4], "b")
	ordered.Ordered = true
	tests := []struct {
		name   string
		groups []AckGroup
		want   [][]LeaseStatus
	}{
		{"all held", []AckGroup{
			{Leases: leases(ca[:4], "a"), RequestID: "r1"},
			{Leases: append(leases(ca[4:], "a"), leases(cb[:2], "b")...), RequestID: "r2"},
		}, [][]LeaseStatus{{LeaseOK, LeaseOK, LeaseOK, LeaseOK}, {LeaseOK, LeaseOK, LeaseOK, LeaseOK, LeaseOK, LeaseOK}}},
		{"a lost lease, a repeat across groups, one acked before", []AckGroup{
			{Leases: []Lease{lease(cb[2], "b"), lost}, RequestID: "r3"},
			{Leases: []Lease{lease(cb[2], "b"), lease(cb[0], "b")}, RequestID: "r4"},
		}, [][]LeaseStatus{{LeaseOK, LeaseLost}, {LeaseNotFound, LeaseNotFound}}},
		{"ordered", []AckGroup{
			{Leases: []Lease{ordered, lease(cb[3], "b")}, RequestID: "r5"},
		}, [][]LeaseStatus{{LeaseOK, LeaseOK}}},
	}
	for _, tc := range tests {
		res := f.st.AckMany(ctx, tc.groups, f.now)
		for i, r := range res {
			if r.Err != nil {
				t.Fatalf("%s: group %d: %v", tc.name, i, r.Err)
			}
			if fmt.Sprint(r.Statuses) != fmt.Sprint(tc.want[i]) {
				t.Errorf("%s: group %d: %v, want %v", tc.name, i, r.Statuses, tc.want[i])
			}
		}
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE subscription = 'a'"); n != 0 {
		t.Errorf("%d deliveries of a left after acking all", n)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE subscription = 'b'"); n != 3 {
		t.Errorf("%d deliveries of b left, want 3 (5, 6, 7)", n)
	}
	for rid, n := range map[string]int{"r1": 4, "r2": 6, "r3": 1, "r5": 2} {
		if got := f.count(t, `SELECT COUNT(*) FROM message_trace WHERE event = 'acked' AND request_id = ? AND consumer = 'w1'
  AND attempt = 1 AND claimed_at IS NOT NULL`, rid); got != n {
			t.Errorf("request %s: %d acked events, want %d", rid, got, n)
		}
	}
	// Messages 0–4 are acked on both subscriptions: consumed; 5–7 wait for b.
	for i, it := range items {
		want := StatusPending
		if i <= 4 {
			want = StatusConsumed
		}
		if s := f.count(t, "SELECT msg_status FROM message_store WHERE id = ?", it.Msg.ID); s != statusCode(want) {
			t.Errorf("message %d: status %d, want %d (%s)", i, s, statusCode(want), want)
		}
	}
}
