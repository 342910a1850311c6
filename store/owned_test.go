package store

import (
	"context"
	"errors"
	"fmt"
	"github.com/shardmq/shardmq/internal/testbed"
	"testing"
	"time"
)

// produce stores n messages on topic t for sub and answers their ids.
func (f *fixture) produce(t *testing.T, n int, orderKey string, subs ...string) []uint64 {
	t.Helper()
	var items []ProduceItem
	var ids []uint64
	for i := 0; i < n; i++ {
		it := f.item("t", fmt.Sprint("k", f.ids.Next()), `{"n":1}`, subs...)
		it.Msg.OrderKey = orderKey
		items = append(items, it)
		ids = append(ids, it.Msg.ID)
	}
	if _, err := f.st.Produce(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	return ids
}

// Ownership: the first router takes a unit at epoch 1; another is refused
// while its lease runs, then takes it at the next epoch and must wait for
// the first one's horizon; a release with the leases in the table ends the
// horizon at once.
func TestOwnerAcquireRenewRelease(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	g, _, err := f.st.AcquireOwner(ctx, "t", "s", "r1", "10.0.0.1:8080", 300*time.Millisecond)
	if err != nil || g.Epoch != 1 {
		t.Fatalf("first acquire: %+v, %v", g, err)
	}
	if _, rec, err := f.st.AcquireOwner(ctx, "t", "s", "r2", "10.0.0.2:8080", time.Second); !errors.Is(err, ErrOwned) || rec.Owner != "r1" || rec.Addr != "10.0.0.1:8080" {
		t.Fatalf("second router while the lease runs: %+v, %v", rec, err)
	}
	held, _, err := f.st.RenewOwners(ctx, "r1", 300*time.Millisecond, 2*time.Second)
	if err != nil || len(held) != 1 || held[0] != (OwnedUnit{"t", "s", 1}) {
		t.Fatalf("renew: %v, %v", held, err)
	}
	time.Sleep(400 * time.Millisecond) // r1's lease runs out (its horizon, 2s, does not)
	g2, _, err := f.st.AcquireOwner(ctx, "t", "s", "r2", "10.0.0.2:8080", time.Second)
	if err != nil || g2.Epoch != 2 {
		t.Fatalf("takeover: %+v, %v", g2, err)
	}
	if wait := g2.WaitUntil.Sub(g2.ServerNow); wait < time.Second || wait > 2*time.Second {
		t.Fatalf("takeover waits %v for r1's horizon, want 1–2s", wait)
	}
	if held, _, err := f.st.RenewOwners(ctx, "r1", time.Second, time.Second); err != nil || len(held) != 0 {
		t.Fatalf("r1 still holds %v after the takeover (%v)", held, err)
	}
	if err := f.st.ReleaseOwner(ctx, "t", "s", "r2", 2, true); err != nil {
		t.Fatal(err)
	}
	g3, _, err := f.st.AcquireOwner(ctx, "t", "s", "r3", "", time.Second)
	if err != nil || g3.Epoch != 3 || g3.WaitUntil.After(g3.ServerNow) {
		t.Fatalf("after a release with the leases in the table: %+v, %v (want no wait)", g3, err)
	}
	recs, err := f.st.Owners(ctx)
	if err != nil || len(recs) != 1 || recs[0].Owner != "r3" || !recs[0].Live {
		t.Fatalf("records: %+v, %v", recs, err)
	}
	// A router restarted on r3's address (a new name, r3 dead) takes the
	// unit at once, its lease still running, and waits for its horizon.
	if _, _, err := f.st.RenewOwners(ctx, "r3", time.Minute, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.st.AcquireOwner(ctx, "t", "s", "r3b", "10.0.0.3:8080", time.Second); !errors.Is(err, ErrOwned) {
		t.Fatalf("another address while r3's lease runs: %v, want ErrOwned", err)
	}
	if _, _, err := f.st.AcquireOwner(ctx, "t", "s", "r3", "10.0.0.3:8080", time.Minute); err != nil {
		t.Fatal(err) // r3 records its address
	}
	g4, _, err := f.st.AcquireOwner(ctx, "t", "s", "r3b", "10.0.0.3:8080", time.Second)
	if err != nil || g4.Epoch != 5 {
		t.Fatalf("restart on the owner's address: %+v, %v (want epoch 5)", g4, err)
	}
	if wait := g4.WaitUntil.Sub(g4.ServerNow); wait < time.Second {
		t.Fatalf("restart on the owner's address waits %v, want r3's horizon (about 2s)", wait)
	}
	members, _, err := f.st.Beat(ctx, "r3", "x:1", time.Minute)
	if err != nil || len(members) != 1 || members[0].Router != "r3" {
		t.Fatalf("beat: %+v, %v", members, err)
	}
	if err := f.st.LeaveMembers(ctx, "r3", time.Hour); err != nil {
		t.Fatal(err)
	}
	if members, _, _ := f.st.Beat(ctx, "r4", "y:1", time.Minute); len(members) != 1 || members[0].Router != "r4" {
		t.Fatalf("members after r3 left: %+v", members)
	}
}

// A flush writes each unit's outcomes in one transaction — acks delete and
// trace, nacks retry or kill, leases are written out — and a unit whose
// epoch is stale writes nothing.
func TestFlushOwnedWritesAndFences(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ids := f.produce(t, 5, "", "s")
	g, _, err := f.st.AcquireOwner(ctx, "t", "s", "r1", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	cands, err := f.st.ScanClaimable(ctx, "t", "s", f.now.Add(time.Second), nil, 10, nil)
	if err != nil || len(cands) != 5 || !cands[0].Fresh() {
		t.Fatalf("scan: %+v, %v", cands, err)
	}
	u := OwnedUnit{Topic: "t", Subscription: "s", Epoch: g.Epoch}
	now := f.now.Add(2 * time.Second)
	claimed := now.Add(-time.Second)
	ack := func(id uint64) OwnedAck {
		return OwnedAck{MessageID: id, VShard: 7, Consumer: "w", Attempt: 1, ClaimedAt: claimed, RequestID: "req-1"}
	}
	stale := OwnedUnit{Topic: "t", Subscription: "s", Epoch: g.Epoch + 1}
	res, err := f.st.FlushOwned(ctx, []OwnedFlush{{Unit: stale, Acks: []OwnedAck{ack(ids[4])}}}, now)
	if err != nil || !res[0].Stale {
		t.Fatalf("stale flush: %+v, %v", res, err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE message_id = ?", ids[4]); n != 1 {
		t.Fatal("a stale owner's ack deleted the delivery")
	}
	res, err = f.st.FlushOwned(ctx, []OwnedFlush{{Unit: u,
		Acks: []OwnedAck{ack(ids[0]), ack(ids[1]), ack(999)},
		Nacks: []OwnedNack{
			{OwnedAck: ack(ids[2]), ErrorCode: "E", Error: "boom", RetryAt: now.Add(time.Minute)},
			{OwnedAck: ack(ids[3]), ErrorCode: "E", Error: "boom", Dead: true},
		},
		Leases: []OwnedLease{{MessageID: ids[4], VShard: 7, Token: 42, Consumer: "w", Attempt: 1, ClaimedAt: claimed, Expires: now.Add(time.Hour)}},
	}}, now)
	if err != nil || res[0].Stale {
		t.Fatalf("flush: %+v, %v", res, err)
	}
	if r := res[0]; !r.Acks[0] || !r.Acks[1] || r.Acks[2] || !r.Nacks[0] || !r.Nacks[1] || !r.Leases[0] {
		t.Fatalf("outcomes: %+v", r)
	}
	for _, c := range []struct {
		query string
		args  []any
		want  int
	}{
		{"SELECT COUNT(*) FROM message_queue WHERE message_id IN (?, ?)", []any{ids[0], ids[1]}, 0},
		{"SELECT COUNT(*) FROM message_trace WHERE event = 'acked' AND consumer = 'w' AND attempt = 1 AND claimed_at IS NOT NULL AND request_id = 'req-1'", nil, 2},
		{"SELECT COUNT(*) FROM message_store WHERE msg_status = 1", nil, 2},
		{"SELECT COUNT(*) FROM message_queue WHERE message_id = ? AND attempts = 1 AND available_at > ? AND claim_token = 0 AND error_code = 'E'", []any{ids[2], now}, 1},
		{"SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event IN ('nacked', 'retry_scheduled')", []any{ids[2]}, 2},
		{"SELECT COUNT(*) FROM message_queue WHERE message_id = ? AND is_dead = 1 AND attempts = 1", []any{ids[3]}, 1},
		{"SELECT COUNT(*) FROM message_store WHERE id = ? AND msg_status = 2", []any{ids[3]}, 1},
		{"SELECT COUNT(*) FROM message_queue WHERE message_id = ? AND claim_token = 42 AND locked_by = 'w' AND attempts = 1 AND available_at > ?", []any{ids[4], now}, 1},
	} {
		if n := f.count(t, c.query, c.args...); n != c.want {
			t.Errorf("%s %v: %d, want %d", c.query, c.args, n, c.want)
		}
	}
	// The lease written out is a durable lease: the table's ack takes it.
	st, err := f.st.Ack(ctx, []Lease{{MessageID: ids[4], Subscription: "s", Token: 42}}, now)
	if err != nil || st[0] != LeaseOK {
		t.Fatalf("durable ack of a written-out lease: %v, %v", st, err)
	}
}

// A retry is claimed durably: the lapsed lease is traced and counted, and
// a stale epoch claims nothing.
func TestClaimDurableCountsTheAttempt(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ids := f.produce(t, 1, "", "s")
	g, _, err := f.st.AcquireOwner(ctx, "t", "s", "r1", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	u := OwnedUnit{Topic: "t", Subscription: "s", Epoch: g.Epoch}
	now := f.now.Add(time.Second)
	// A lease held in memory lapsed and was written out.
	if _, err := f.st.FlushOwned(ctx, []OwnedFlush{{Unit: u, Leases: []OwnedLease{{MessageID: ids[0], VShard: 7, Token: 5, Consumer: "w",
		Attempt: 1, ClaimedAt: now, Expires: now.Add(time.Second)}}}}, now); err != nil {
		t.Fatal(err)
	}
	later := now.Add(2 * time.Second)
	cands, err := f.st.ScanClaimable(ctx, "t", "s", later, nil, 10, nil)
	if err != nil || len(cands) != 1 || cands[0].Fresh() || cands[0].ClaimToken != 5 {
		t.Fatalf("scan after the lapse: %+v, %v", cands, err)
	}
	req := ClaimRequest{Topic: "t", Subscription: "s", Consumer: "w2", Max: 1, Lease: time.Minute, Token: 77, MaxAttempts: 5, Now: later}
	if _, err := f.st.ClaimDurable(ctx, OwnedUnit{Topic: "t", Subscription: "s", Epoch: g.Epoch + 1}, req, ids); !errors.Is(err, ErrStaleOwner) {
		t.Fatalf("stale durable claim: %v", err)
	}
	got, err := f.st.ClaimDurable(ctx, u, req, ids)
	if err != nil || len(got) != 1 || got[0].Attempt != 2 || got[0].Token != 77 || got[0].Message == nil {
		t.Fatalf("durable claim: %+v, %v", got, err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event = 'lease_expired' AND consumer = 'w'", ids[0]); n != 1 {
		t.Fatalf("%d lease_expired events, want 1", n)
	}
	if again, err := f.st.ClaimDurable(ctx, u, req, ids); err != nil || len(again) != 0 {
		t.Fatalf("a leased delivery claimed again: %+v, %v", again, err)
	}
}

// Parking keeps a delivery parked only when it is still behind its key's
// head, and the head's ack in a later flush lets it go.
func TestFlushParksBehindTheHead(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ids := f.produce(t, 3, "K", "s")
	g, _, err := f.st.AcquireOwner(ctx, "t", "s", "r1", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	u := OwnedUnit{Topic: "t", Subscription: "s", Epoch: g.Epoch}
	now := f.now.Add(time.Second)
	park := []OwnedPark{{ids[0], "K"}, {ids[1], "K"}, {ids[2], "K"}}
	if _, err := f.st.FlushOwned(ctx, []OwnedFlush{{Unit: u, Park: park}}, now); err != nil {
		t.Fatal(err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE parked = 1"); n != 2 {
		t.Fatalf("%d parked, want the 2 behind the head", n)
	}
	heads, err := f.st.OrderHeads(ctx, "t", "s", []string{"K"})
	if err != nil || heads["K"] != ids[0] {
		t.Fatalf("heads: %v, %v", heads, err)
	}
	if _, err := f.st.FlushOwned(ctx, []OwnedFlush{{Unit: u, Acks: []OwnedAck{{MessageID: ids[0], VShard: 7, OrderKey: "K", Ordered: true,
		Consumer: "w", Attempt: 1, ClaimedAt: now}}}}, now); err != nil {
		t.Fatal(err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE message_id = ? AND parked = 0", ids[1]); n != 1 {
		t.Fatal("the next of the key stayed parked after its head's ack")
	}
	cands, err := f.st.ScanClaimable(ctx, "t", "s", now, nil, 10, nil)
	if err != nil || len(cands) != 1 || cands[0].MessageID != ids[1] {
		t.Fatalf("claimable after the ack: %+v, %v", cands, err)
	}
}
