package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/testbed"
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
	// r2's next renewal (it renews every lease naming it) does not bring
	// the released unit back: found by a router frozen and woken, whose
	// units the other router handed back and renewed again, each router
	// then naming the other as the owner.
	if held, _, err := f.st.RenewOwners(ctx, "r2", time.Minute, time.Minute); err != nil || len(held) != 0 {
		t.Fatalf("r2 renews %v after its release (%v)", held, err)
	}
	if recs, err := f.st.Owners(ctx); err != nil || len(recs) != 1 || recs[0].Live {
		t.Fatalf("released record after r2's renewal: %+v, %v (want not live)", recs, err)
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
		// The final acks are on the message rows, not rows of their own.
		{"SELECT COUNT(*) FROM message_trace WHERE event = 'acked'", nil, 0},
		// In the slot (written in place), not the columns that grow the row.
		{"SELECT COUNT(*) FROM message_store WHERE msg_status = 1 AND acked_sub IS NULL AND status_at IS NULL AND ack_slot <> ?", []any{emptyAckSlot}, 2},
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
	// The trace reads them as acked events.
	evs, err := eventsOf(ctx, f.st.db, []uint64{ids[0], ids[1]}, EventAcked)
	if err != nil || len(evs) != 2 {
		t.Fatalf("acked events: %+v, %v", evs, err)
	}
	for _, e := range evs {
		if e.Type != EventAcked || e.Subscription != "s" || e.Consumer != "w" || e.Attempt != 1 || !near(e.ClaimedAt, claimed) || e.RequestID != "req-1" || !near(e.At, now) {
			t.Errorf("acked event %+v", e)
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

// A message's final ack — no delivery left — is written on its row; an
// ack that leaves another subscription's delivery is a trace row. Either
// way the trace has one acked event per subscription and the message ends
// consumed, also when the two subscriptions' last acks commit at once.
func TestFinalAckOnTheMessageRow(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ids := f.produce(t, 3, "", "a", "b")
	unit := map[string]OwnedUnit{}
	for _, sub := range []string{"a", "b"} {
		g, _, err := f.st.AcquireOwner(ctx, "t", sub, "r1", "", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		unit[sub] = OwnedUnit{Topic: "t", Subscription: sub, Epoch: g.Epoch}
	}
	now := f.now.Add(time.Second)
	ack := func(sub string, id uint64) OwnedFlush {
		return OwnedFlush{Unit: unit[sub], Acks: []OwnedAck{{MessageID: id, VShard: 7, Consumer: "w-" + sub, Attempt: 1, ClaimedAt: now, RequestID: "r-" + sub}}}
	}
	flush := func(batch ...OwnedFlush) {
		t.Helper()
		res, err := f.st.FlushOwned(ctx, batch, now)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Stale || !r.Acks[0] {
				t.Fatalf("flush: %+v", res)
			}
		}
	}
	check := func(id uint64, status domain.MessageStatus, traceRows int) {
		t.Helper()
		if n := f.count(t, "SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event = 'acked'", id); n != traceRows {
			t.Errorf("message %d: %d acked trace rows, want %d", id, n, traceRows)
		}
		msgs, err := selectMessages(ctx, f.st.db, []uint64{id})
		if err != nil || msgs[id].Status != status {
			t.Fatalf("message %d: %+v, %v; want %s", id, msgs[id], err, status)
		}
		evs, err := eventsOf(ctx, f.st.db, []uint64{id})
		if err != nil {
			t.Fatal(err)
		}
		subs := map[string]int{}
		for _, e := range evs {
			if e.Type == EventAcked {
				subs[e.Subscription]++
				if e.Consumer != "w-"+e.Subscription || e.RequestID != "r-"+e.Subscription || e.Attempt != 1 || !near(e.ClaimedAt, now) {
					t.Errorf("message %d: acked event %+v", id, e)
				}
			}
		}
		want := map[string]int{"a": 1}
		if status == StatusConsumed {
			want["b"] = 1
		}
		if fmt.Sprint(subs) != fmt.Sprint(want) {
			t.Errorf("message %d: acked events by subscription %v, want %v", id, subs, want)
		}
	}
	// One subscription first: a trace row, still pending; then the last.
	flush(ack("a", ids[0]))
	check(ids[0], StatusPending, 1)
	flush(ack("b", ids[0]))
	check(ids[0], StatusConsumed, 1)
	// Both in one flush: one of them on the row.
	flush(ack("a", ids[1]), ack("b", ids[1]))
	check(ids[1], StatusConsumed, 1)
	// Both at once in two transactions.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, sub := range []string{"a", "b"} {
		wg.Go(func() {
			res, err := f.st.FlushOwned(ctx, []OwnedFlush{ack(sub, ids[2])}, now)
			if err == nil && (res[0].Stale || !res[0].Acks[0]) {
				err = fmt.Errorf("outcome %+v", res[0])
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	check(ids[2], StatusConsumed, 1)
}

// A final ack whose details fit the slot is written there, in place, and
// one that does not (a long consumer name) in the acked_* columns; the
// trace reads either as the same acked event, and so does the lost
// commit's check of which rows a group marked (ackedOn).
func TestFinalAckSlotOrColumns(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ids := f.produce(t, 2, "", "s")
	g, _, err := f.st.AcquireOwner(ctx, "t", "s", "r1", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	u := OwnedUnit{Topic: "t", Subscription: "s", Epoch: g.Epoch}
	now := f.now.Add(time.Second)
	claimed := now.Add(-time.Second)
	long := strings.Repeat("consumer-", 5)
	acks := []OwnedAck{
		{MessageID: ids[0], VShard: 7, Consumer: "w", Attempt: 2, ClaimedAt: claimed, RequestID: "0123456789abcdef"},
		{MessageID: ids[1], VShard: 7, Consumer: long, Attempt: 3, ClaimedAt: claimed, RequestID: "req-2"},
	}
	res, err := f.st.FlushOwned(ctx, []OwnedFlush{{Unit: u, Acks: acks}}, now)
	if err != nil || res[0].Stale || !res[0].Acks[0] || !res[0].Acks[1] {
		t.Fatalf("flush: %+v, %v", res, err)
	}
	for _, c := range []struct {
		query string
		args  []any
	}{
		{"SELECT COUNT(*) FROM message_store WHERE id = ? AND msg_status = 1 AND ack_slot <> ? AND acked_sub IS NULL AND status_at IS NULL", []any{ids[0], emptyAckSlot}},
		{"SELECT COUNT(*) FROM message_store WHERE id = ? AND msg_status = 1 AND ack_slot = ? AND acked_sub = 's' AND acked_by = ? AND status_at IS NOT NULL", []any{ids[1], emptyAckSlot, long}},
	} {
		if n := f.count(t, c.query, c.args...); n != 1 {
			t.Errorf("%s %v: %d rows, want 1", c.query, c.args, n)
		}
	}
	evs, err := eventsOf(ctx, f.st.db, ids)
	if err != nil {
		t.Fatal(err)
	}
	var got []OwnedAck
	for _, e := range evs {
		if e.Type != EventAcked || e.Subscription != "s" || e.ID != e.MessageID || e.VShard != 7 || !near(e.At, now) || !near(e.ClaimedAt, claimed) {
			t.Errorf("event %+v", e)
		}
		got = append(got, OwnedAck{MessageID: e.MessageID, VShard: 7, Consumer: e.Consumer, Attempt: e.Attempt, ClaimedAt: claimed, RequestID: e.RequestID})
	}
	if !reflect.DeepEqual(got, acks) {
		t.Errorf("acked events %+v, want %+v", got, acks)
	}
	for i, a := range acks {
		k := finalAck{sub: "s", consumer: a.Consumer, request: a.RequestID, attempt: a.Attempt, claimedAt: claimed.UTC()}
		on, err := ackedOn(ctx, f.st.db, ids, k, now.Truncate(time.Microsecond))
		if err != nil || len(on) != 1 || !on[ids[i]] {
			t.Errorf("ack %d: the rows it marked %v, %v; want its own", i, on, err)
		}
		if on, err := ackedOn(ctx, f.st.db, ids, k, now.Add(time.Millisecond)); err != nil || len(on) != 0 {
			t.Errorf("ack %d at another time: marked %v, %v; want none", i, on, err)
		}
	}
}

// A row that holds an ack in its columns and another in its slot (a
// message made pending again and acked once more the other way) reads as
// both acks, in time order.
func TestRowWithBothAcksReadsBoth(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ids := f.produce(t, 1, "", "a", "b")
	at := f.now.Add(time.Second).Truncate(time.Microsecond)
	slot, ok := encodeAckSlot(finalAck{sub: "b", consumer: "wb", request: "rb", attempt: 2, claimedAt: at}, at.Add(time.Second))
	if !ok {
		t.Fatal("the slot does not fit")
	}
	if _, err := f.db.Exec(`UPDATE message_store SET msg_status = 1, status_at = ?, acked_sub = 'a', acked_by = 'wa', acked_attempt = 1,
  acked_claimed_at = ?, acked_request = 'ra', ack_slot = ? WHERE id = ?`, at, at, slot, ids[0]); err != nil {
		t.Fatal(err)
	}
	evs, err := eventsOf(ctx, f.db, ids, EventAcked)
	if err != nil || len(evs) != 2 {
		t.Fatalf("acked events %+v, %v; want two", evs, err)
	}
	if a, b := evs[0], evs[1]; a.Subscription != "a" || a.Consumer != "wa" || a.Attempt != 1 || !near(a.At, at) ||
		b.Subscription != "b" || b.Consumer != "wb" || b.RequestID != "rb" || b.Attempt != 2 || !near(b.At, at.Add(time.Second)) {
		t.Errorf("acked events %+v", evs)
	}
	// A warm trace merged with the hot events (the same two, one id)
	// keeps both, once each.
	msgs, err := selectMessages(ctx, f.db, ids)
	if err != nil {
		t.Fatal(err)
	}
	tr := MergeEvents(&MessageTrace{Message: msgs[ids[0]]}, evs, at)
	tr = MergeEvents(tr, evs, at)
	acked := 0
	for _, e := range tr.Events {
		if e.Type == EventAcked {
			acked++
		}
	}
	if acked != 2 {
		t.Errorf("merged trace has %d acked events, want 2: %+v", acked, tr.Events)
	}
}

// While a router that does not read the slot (a version before
// migration 19, whose member row has no schema version) is a live member,
// final acks go to the acked_* columns, which it reads; once it is gone,
// to the slot again.
func TestFinalAckAvoidsTheSlotWhileAnOlderRouterIsLive(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ids := f.produce(t, 2, "", "s")
	g, _, err := f.st.AcquireOwner(ctx, "t", "s", "r1", "a:1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	u := OwnedUnit{Topic: "t", Subscription: "s", Epoch: g.Epoch}
	if _, err := f.db.Exec("INSERT INTO router_member (router, addr, seen_at) VALUES ('old', 'b:1', NOW(6))"); err != nil {
		t.Fatal(err)
	}
	ack := func(id uint64) {
		t.Helper()
		now := time.Now().UTC()
		res, err := f.st.FlushOwned(ctx, []OwnedFlush{{Unit: u, Acks: []OwnedAck{{MessageID: id, VShard: 7, Consumer: "w", Attempt: 1, ClaimedAt: now, RequestID: "req"}}}}, now)
		if err != nil || res[0].Stale || !res[0].Acks[0] {
			t.Fatalf("flush: %+v, %v", res, err)
		}
	}
	members, _, err := f.st.Beat(ctx, "r1", "a:1", time.Minute)
	if err != nil || len(members) != 2 {
		t.Fatalf("members %+v, %v", members, err)
	}
	for _, m := range members {
		if want := map[string]int{"old": 0, "r1": SchemaVersion()}[m.Router]; m.SchemaVersion != want {
			t.Errorf("member %s: schema version %d, want %d", m.Router, m.SchemaVersion, want)
		}
	}
	ack(ids[0])
	if n := f.count(t, "SELECT COUNT(*) FROM message_store WHERE id = ? AND acked_sub = 's' AND ack_slot = ?", ids[0], emptyAckSlot); n != 1 {
		t.Fatal("with an older router live, the final ack was not written to the columns")
	}
	if _, err := f.db.Exec("DELETE FROM router_member WHERE router = 'old'"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.st.Beat(ctx, "r1", "a:1", time.Minute); err != nil {
		t.Fatal(err)
	}
	ack(ids[1])
	if n := f.count(t, "SELECT COUNT(*) FROM message_store WHERE id = ? AND acked_sub IS NULL AND ack_slot <> ?", ids[1], emptyAckSlot); n != 1 {
		t.Fatal("with every member current, the final ack was not written to the slot")
	}
	evs, err := eventsOf(ctx, f.db, ids, EventAcked)
	if err != nil || len(evs) != 2 {
		t.Fatalf("acked events %+v, %v; want both", evs, err)
	}
}

// Leases written out together (a hand-over writes every lease its owner
// holds) are written in chunks of statements, and answer, each, whether
// its delivery was there to take it: a live one takes its token,
// consumer, claim time, expiry and the higher attempt; a dead letter and
// a delivery that is gone do not.
func TestLeasesWrittenOutTogether(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ids := f.produce(t, 5, "", "s")
	if _, err := f.db.Exec("UPDATE message_queue SET is_dead = 1 WHERE message_id = ?", ids[3]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec("UPDATE message_queue SET attempts = 4 WHERE message_id = ?", ids[2]); err != nil {
		t.Fatal(err)
	}
	g, _, err := f.st.AcquireOwner(ctx, "t", "s", "r1", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	now := f.now.Add(time.Second).Truncate(time.Microsecond)
	var ls []OwnedLease
	for i, id := range append(ids, 999) {
		ls = append(ls, OwnedLease{MessageID: id, VShard: 7, Token: uint64(100 + i), Consumer: fmt.Sprint("w", i), Attempt: 2,
			ClaimedAt: now, Expires: now.Add(time.Duration(i+1) * time.Minute)})
	}
	ls[1].Consumer = "" // written NULL
	res, err := f.st.FlushOwned(ctx, []OwnedFlush{{Unit: OwnedUnit{Topic: "t", Subscription: "s", Epoch: g.Epoch}, Leases: ls}}, now)
	if err != nil || res[0].Stale {
		t.Fatalf("flush: %+v, %v", res, err)
	}
	if want := []bool{true, true, true, false, true, false}; !reflect.DeepEqual(res[0].Leases, want) {
		t.Fatalf("leases taken %v, want %v", res[0].Leases, want)
	}
	for i, id := range ids {
		var token uint64
		var by sql.NullString
		var attempts int
		var claimed sql.NullTime
		var avail time.Time
		if err := f.db.QueryRow("SELECT claim_token, locked_by, attempts, claimed_at, available_at FROM message_queue WHERE message_id = ?", id).
			Scan(&token, &by, &attempts, &claimed, &avail); err != nil {
			t.Fatal(err)
		}
		if i == 3 {
			if token != 0 || by.Valid {
				t.Errorf("the dead letter took a lease: token %d, by %v", token, by)
			}
			continue
		}
		wantAttempts := 2
		if i == 2 {
			wantAttempts = 4
		}
		if token != ls[i].Token || by.String != ls[i].Consumer || by.Valid != (ls[i].Consumer != "") || attempts != wantAttempts ||
			!near(claimed.Time, now) || !near(avail, ls[i].Expires) {
			t.Errorf("delivery %d: token %d, by %v, attempts %d, claimed %v, available %v; want %+v (attempts %d)", i, token, by, attempts, claimed, avail, ls[i], wantAttempts)
		}
	}
	// Across chunks: live deliveries at their first and last places.
	many := make([]OwnedLease, 2*materializeLeasesChunk+1)
	for i := range many {
		many[i] = OwnedLease{MessageID: uint64(1_000_000 + i), Token: 1, Attempt: 1, ClaimedAt: now, Expires: now.Add(time.Hour)}
	}
	live := map[int]bool{0: true, materializeLeasesChunk - 1: true, materializeLeasesChunk: true, 2 * materializeLeasesChunk: true}
	at := 0
	for i := range many {
		if live[i] {
			many[i].MessageID = []uint64{ids[0], ids[1], ids[2], ids[4]}[at]
			at++
		}
	}
	res2, err := f.st.FlushOwned(ctx, []OwnedFlush{{Unit: OwnedUnit{Topic: "t", Subscription: "s", Epoch: g.Epoch}, Leases: many}}, now)
	if err != nil || res2[0].Stale || len(res2[0].Leases) != len(many) {
		t.Fatalf("flush of %d leases: %v", len(many), err)
	}
	for i, ok := range res2[0].Leases {
		if ok != live[i] {
			t.Errorf("lease %d of %d: taken %v, want %v", i, len(many), ok, live[i])
		}
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE claim_token = 1 AND message_id IN (?, ?, ?, ?)", ids[0], ids[1], ids[2], ids[4]); n != 4 {
		t.Errorf("%d of the 4 live deliveries took the second leases, want 4", n)
	}
}

// near says a time read back from a DATETIME(6) column is t (stored to
// the microsecond).
func near(read, t time.Time) bool { return read.Sub(t).Abs() < time.Microsecond }

// A scan that skips what its reader holds answers what ScanClaimable
// answers without those, walks the same positions (Read, Last), leaves
// out a delivery that stopped being claimable, honours a cursor and
// excluded vshards, and reads its positions from idx_claim alone.
func TestScanClaimableSkipping(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ids := f.produce(t, 8, "", "s")
	at := f.now.Add(time.Second)
	all, err := f.st.ScanClaimable(ctx, "t", "s", at, nil, 100, nil)
	if err != nil || len(all) != 8 {
		t.Fatalf("scan: %d rows, %v", len(all), err)
	}
	idsOf := func(cs []Candidate) []uint64 {
		var out []uint64
		for _, c := range cs {
			out = append(out, c.MessageID)
		}
		return out
	}
	skip := map[uint64]bool{ids[0]: true, ids[1]: true, ids[2]: true, ids[5]: true}
	for _, tc := range []struct {
		name    string
		after   *ClaimCursor
		limit   int
		exclude []uint16
		skip    map[uint64]bool
		want    []uint64
		read    int
		last    uint64 // the last position read; 0: none
	}{
		{"nothing skipped", nil, 100, nil, nil, ids, 8, ids[7]},
		{"leases skipped", nil, 100, nil, skip, []uint64{ids[3], ids[4], ids[6], ids[7]}, 8, ids[7]},
		{"limit counts the skipped", nil, 4, nil, skip, []uint64{ids[3]}, 4, ids[3]},
		{"after a cursor", &ClaimCursor{Priority: 0, MessageID: ids[4]}, 100, nil, skip, []uint64{ids[6], ids[7]}, 3, ids[7]},
		{"all skipped", nil, 3, nil, skip, nil, 3, ids[2]},
		{"excluded vshard", nil, 100, []uint16{7}, skip, nil, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := f.st.ScanClaimableSkipping(ctx, "t", "s", at, tc.after, tc.limit, tc.exclude, tc.skip)
			if err != nil {
				t.Fatal(err)
			}
			if got := idsOf(sc.Candidates); fmt.Sprint(got) != fmt.Sprint(tc.want) || sc.Read != tc.read {
				t.Fatalf("candidates %v read %d, want %v read %d", got, sc.Read, tc.want, tc.read)
			}
			var last uint64
			if sc.Last != nil {
				last = sc.Last.MessageID
			}
			if last != tc.last {
				t.Fatalf("last position %d, want %d", last, tc.last)
			}
			if tc.skip == nil {
				if fmt.Sprintf("%+v", sc.Candidates) != fmt.Sprintf("%+v", all) {
					t.Fatalf("rows differ from ScanClaimable's:\n%+v\n%+v", sc.Candidates, all)
				}
			}
		})
	}
	// A delivery that stopped being claimable between the walk and the
	// read (here: not yet claimable at the read's time) is left out.
	if _, err := f.db.Exec("UPDATE message_queue SET available_at = ? WHERE message_id = ?", at.Add(time.Hour), ids[3]); err != nil {
		t.Fatal(err)
	}
	sc, err := f.st.ScanClaimableSkipping(ctx, "t", "s", at, nil, 100, nil, skip)
	if err != nil || fmt.Sprint(idsOf(sc.Candidates)) != fmt.Sprint([]uint64{ids[4], ids[6], ids[7]}) || sc.Read != 7 {
		t.Fatalf("after a change: %v read %d, %v", idsOf(sc.Candidates), sc.Read, err)
	}
	for _, p := range explain(t, f.db, claimPositionsQuery(false, 0), "t", "s", at, 10) {
		if p["key"] != "idx_claim" || !strings.Contains(p["Extra"], "Using index") {
			t.Fatalf("positions are not read from idx_claim alone: %+v", p)
		}
	}
}
