package store

import (
	"context"
	"github.com/shardmq/shardmq/internal/testbed"
	"strings"
	"testing"
	"time"
)

// Leases a claim could not hand over are released: the deliveries are
// claimable at once, at the same attempt, and no lease_expired is traced
// for them; a receipt of a later lease is not touched by a stale release.
func TestReleaseUndoesAnUndeliveredClaim(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	if _, err := f.st.Produce(ctx, []ProduceItem{f.item("t", "a", `1`), f.item("t", "b", `2`)}); err != nil {
		t.Fatal(err)
	}
	got := f.claim(t, "default", 10, time.Hour, f.now)
	if len(got) != 2 {
		t.Fatalf("claimed %d, want 2", len(got))
	}
	n, err := f.st.Release(ctx, []Lease{lease(got[0], "default"), lease(got[1], "default")}, true, f.now)
	if err != nil || n != 2 {
		t.Fatalf("release = %d, %v; want 2", n, err)
	}
	again := f.claim(t, "default", 10, time.Hour, f.now)
	if len(again) != 2 || again[0].Attempt != 1 || again[1].Attempt != 1 {
		t.Fatalf("claim after release = %+v, want both at attempt 1", again)
	}
	// A second release with the old token changes nothing.
	if n, err := f.st.Release(ctx, []Lease{lease(got[0], "default")}, true, f.now); err != nil || n != 0 {
		t.Fatalf("stale release = %d, %v; want 0", n, err)
	}
	st, err := f.st.Ack(ctx, []Lease{lease(again[0], "default"), lease(again[1], "default")}, f.now)
	if err != nil || st[0] != LeaseOK || st[1] != LeaseOK {
		t.Fatalf("ack after release = %v, %v", st, err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_trace WHERE event = 'lease_expired'"); n != 0 {
		t.Fatalf("%d lease_expired events, want 0", n)
	}
}

// A byte cap stops a claim before leasing what does not fit; the first
// message is leased even when it alone is larger (AllowOversize), or not
// at all without it. A candidate left out keeps its expired lease
// untraced until the claim that takes it.
func TestClaimManyByteCap(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	big := `"` + strings.Repeat("x", 1000) + `"`
	var items []ProduceItem
	for _, k := range []string{"a", "b", "c"} {
		items = append(items, f.item("t", k, big))
	}
	if _, err := f.st.Produce(ctx, items); err != nil {
		t.Fatal(err)
	}
	// Lease all three for a second and let the lease expire.
	if got := f.claim(t, "default", 10, time.Second, f.now); len(got) != 3 {
		t.Fatalf("first claim %d, want 3", len(got))
	}
	at := f.now.Add(2 * time.Second)
	mk := func(max, maxBytes int, oversize bool) ClaimRequest {
		return ClaimRequest{Topic: "t", Subscription: "default", Consumer: "w", Max: max, Lease: time.Minute,
			Token: f.ids.Next(), MaxAttempts: 5, Now: at, MaxBytes: maxBytes, AllowOversize: oversize}
	}
	cases := []struct {
		name string
		req  ClaimRequest
		want int
	}{
		{"nothing fits and no oversize", mk(10, 500, false), 0},
		{"two fit", mk(10, 2100, false), 2},
		{"one oversize", mk(10, 10, true), 1},
	}
	for _, c := range cases {
		got, err := f.st.ClaimMany(ctx, []ClaimRequest{c.req})
		if err != nil {
			t.Fatal(err)
		}
		if len(got[0]) != c.want {
			t.Fatalf("%s: leased %d, want %d", c.name, len(got[0]), c.want)
		}
		for _, g := range got[0] {
			if g.Attempt != 2 {
				t.Fatalf("%s: attempt %d, want 2", c.name, g.Attempt)
			}
		}
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_trace WHERE event = 'lease_expired'"); n != 3 {
		t.Fatalf("%d lease_expired events, want 3 (one per delivery)", n)
	}
}
