package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testbed"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 1}, func(b *testbed.Bed) { bed = b }))
}

// fixture is one test's own database on the first cluster's primary.
type fixture struct {
	st  *Store
	db  *sql.DB
	ids *idgen.Gen
	now time.Time
}

func setup(t testing.TB) *fixture {
	t.Helper()
	ctx := context.Background()
	name := testbed.TestDatabase(t, bed, "t_store_")
	dsn := bed.Clusters[0].Primary.DSN(name)
	ids := idgen.New(nil)
	st, err := Open(ctx, dsn, Options{IDs: ids})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx, time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	// After the migration, which can take seconds on a loaded machine: the
	// tests' clock must not lag the ids they make (their creation times).
	return &fixture{st: st, db: st.DB(), ids: ids, now: time.Now().UTC()}
}

func (f *fixture) item(topic, key, payload string, subs ...string) ProduceItem {
	id := f.ids.Next()
	if len(subs) == 0 {
		subs = []string{"default"}
	}
	return ProduceItem{
		Msg: &Message{ID: id, VShard: 7, Topic: topic, Key: key, Priority: 0, PayloadJSON: true,
			Payload: []byte(payload), CreatedAt: idgen.Time(id)},
		Hash:          hash16(payload),
		AvailableAt:   f.now,
		Subscriptions: subs,
	}
}

func hash16(s string) []byte {
	b := make([]byte, 16)
	copy(b, s)
	return b
}

func (f *fixture) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func TestMigrateIsIdempotent(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	if err := f.st.Migrate(context.Background(), f.now); err != nil {
		t.Fatal(err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM schema_migrations"); n != len(migrations) {
		t.Fatalf("schema_migrations has %d rows, want %d", n, len(migrations))
	}
	if n := f.count(t, "SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'message_store'"); n != 6 {
		t.Fatalf("message_store has %d partitions, want 6", n)
	}
	// The final ack's slot (19) and the rebuild (20) run again whole
	// when they were not recorded: DDL commits on its own, so a run cut
	// short may have added a column already.
	if _, err := f.db.Exec("DELETE FROM schema_migrations WHERE version IN (19, 20)"); err != nil {
		t.Fatal(err)
	}
	f.produce(t, 3, "")
	if err := f.st.Migrate(context.Background(), f.now); err != nil {
		t.Fatalf("migrations 19 and 20 again: %v", err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME = 'ack_slot'"); n != 2 {
		t.Fatalf("ack_slot in %d tables, want 2 (message_store, archive_message)", n)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_store WHERE ack_slot = ?", emptyAckSlot); n != 3 {
		t.Fatalf("%d messages with an empty slot after the rebuild, want 3", n)
	}
}

func TestProduceDedupAndConflict(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a := f.item("orders", "k1", `{"a":1}`)
	aAgain := f.item("orders", "k1", `{"a":1}`) // same key, same payload, same batch
	b := f.item("orders", "K1", `{"b":1}`)      // keys are byte-exact: K1 is not k1
	res, err := f.st.Produce(ctx, []ProduceItem{a, aAgain, b})
	if err != nil {
		t.Fatal(err)
	}
	want := []ProduceResult{{Status: Created, ID: a.Msg.ID}, {Status: Duplicate, ID: a.Msg.ID, VShard: 7}, {Status: Created, ID: b.Msg.ID}}
	for i := range want {
		if res[i] != want[i] {
			t.Errorf("item %d: got %+v, want %+v", i, res[i], want[i])
		}
	}
	dup := f.item("orders", "k1", `{"a":1}`)
	conflict := f.item("orders", "K1", `{"b":2}`)
	other := f.item("payments", "k1", `{"a":1}`) // same key, other topic: new
	res, err = f.st.Produce(ctx, []ProduceItem{dup, conflict, other})
	if err != nil {
		t.Fatal(err)
	}
	want = []ProduceResult{{Status: Duplicate, ID: a.Msg.ID, VShard: 7}, {Status: Conflict, ID: b.Msg.ID, VShard: 7}, {Status: Created, ID: other.Msg.ID}}
	for i := range want {
		if res[i] != want[i] {
			t.Errorf("second batch item %d: got %+v, want %+v", i, res[i], want[i])
		}
	}
	for table, n := range map[string]int{"message_key": 3, "message_store": 3, "message_queue": 3} {
		if got := f.count(t, "SELECT COUNT(*) FROM "+table); got != n {
			t.Errorf("%s has %d rows, want %d", table, got, n)
		}
	}
	if got := f.count(t, "SELECT COUNT(*) FROM message_store WHERE id = ?", conflict.Msg.ID); got != 0 {
		t.Errorf("conflict wrote a message")
	}
}

func TestProduceFansOutToSubscriptions(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	it := f.item("t", "k", `1`, "billing", "shipping")
	if _, err := f.st.Produce(context.Background(), []ProduceItem{it}); err != nil {
		t.Fatal(err)
	}
	if got := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE message_id = ?", it.Msg.ID); got != 2 {
		t.Fatalf("%d deliveries, want 2", got)
	}
}

func (f *fixture) claim(t *testing.T, sub string, max int, lease time.Duration, at time.Time) []Claimed {
	t.Helper()
	got, err := f.st.Claim(context.Background(), ClaimRequest{Topic: "t", Subscription: sub, Consumer: "w1", Max: max,
		Lease: lease, Token: f.ids.Next(), MaxAttempts: 5, Now: at})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func lease(c Claimed, sub string) Lease {
	return Lease{MessageID: c.Message.ID, Subscription: sub, Token: c.Token}
}

func TestClaimAckConsumes(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	it := f.item("t", "k", `{"x":1}`, "a", "b")
	if _, err := f.st.Produce(ctx, []ProduceItem{it}); err != nil {
		t.Fatal(err)
	}
	ca := f.claim(t, "a", 10, time.Minute, f.now)
	if len(ca) != 1 || ca[0].Attempt != 1 || string(ca[0].Message.Payload) != `{"x":1}` {
		t.Fatalf("claim = %+v", ca)
	}
	if again := f.claim(t, "a", 10, time.Minute, f.now); len(again) != 0 {
		t.Fatalf("a leased delivery was claimed twice")
	}
	st, err := f.st.Ack(ctx, []Lease{lease(ca[0], "a")}, f.now)
	if err != nil || st[0] != LeaseOK {
		t.Fatalf("ack = %v, %v", st, err)
	}
	if s := f.count(t, "SELECT msg_status FROM message_store WHERE id = ?", it.Msg.ID); s != statusCode(StatusPending) {
		t.Fatalf("status %d after one of two subscriptions acked", s)
	}
	cb := f.claim(t, "b", 10, time.Minute, f.now)
	st, err = f.st.Ack(ctx, []Lease{lease(cb[0], "b"), lease(cb[0], "b")}, f.now)
	if err != nil || st[0] != LeaseOK || st[1] != LeaseNotFound {
		t.Fatalf("ack = %v, %v", st, err)
	}
	if s := f.count(t, "SELECT msg_status FROM message_store WHERE id = ?", it.Msg.ID); s != statusCode(StatusConsumed) {
		t.Fatalf("status %d after every subscription acked, want consumed", s)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event = 'acked' AND attempt = 1 AND consumer = 'w1' AND claimed_at IS NOT NULL", it.Msg.ID); n != 2 {
		t.Fatalf("%d acked events, want 2", n)
	}
	st, _ = f.st.Ack(ctx, []Lease{lease(ca[0], "a")}, f.now)
	if st[0] != LeaseNotFound {
		t.Fatalf("second ack = %v, want not_found", st[0])
	}
}

func TestExpiredLeaseIsReclaimedAsNewAttempt(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	it := f.item("t", "k", `1`)
	if _, err := f.st.Produce(ctx, []ProduceItem{it}); err != nil {
		t.Fatal(err)
	}
	first := f.claim(t, "default", 1, time.Second, f.now)
	if got := f.claim(t, "default", 1, time.Second, f.now.Add(500*time.Millisecond)); len(got) != 0 {
		t.Fatal("claimed before the lease expired")
	}
	second := f.claim(t, "default", 1, time.Second, f.now.Add(2*time.Second))
	if len(second) != 1 || second[0].Attempt != 2 {
		t.Fatalf("reclaim = %+v, want attempt 2", second)
	}
	st, err := f.st.Ack(ctx, []Lease{lease(first[0], "default")}, f.now.Add(2*time.Second))
	if err != nil || st[0] != LeaseLost {
		t.Fatalf("stale ack = %v, %v; want lease_lost", st, err)
	}
	ext, _, err := f.st.Extend(ctx, []Lease{lease(first[0], "default"), lease(second[0], "default")}, time.Minute, f.now.Add(2*time.Second))
	if err != nil || ext[0] != LeaseLost || ext[1] != LeaseOK {
		t.Fatalf("extend = %v, %v", ext, err)
	}
	if got := f.claim(t, "default", 1, time.Second, f.now.Add(30*time.Second)); len(got) != 0 {
		t.Fatal("claimed within the extended lease")
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event = 'lease_expired' AND attempt = 1", it.Msg.ID); n != 1 {
		t.Fatalf("%d lease_expired events, want 1", n)
	}
}

func TestNackBacksOffThenDies(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	it := f.item("t", "k", `1`)
	if _, err := f.st.Produce(ctx, []ProduceItem{it}); err != nil {
		t.Fatal(err)
	}
	policy := func(string, string) RetryPolicy {
		return RetryPolicy{MaxAttempts: 5, Initial: time.Second, Multiplier: 2, Max: time.Hour, Jitter: 0}
	}
	at := f.now
	for attempt := 1; attempt <= 5; attempt++ {
		got := f.claim(t, "default", 1, time.Minute, at)
		if len(got) != 1 || got[0].Attempt != attempt {
			t.Fatalf("attempt %d: claim = %+v", attempt, got)
		}
		res, err := f.st.Nack(ctx, []NackItem{{Lease: lease(got[0], "default"), ErrorCode: "E_STOCK", Error: "out of stock"}}, policy, func() float64 { return 0.5 }, at)
		if err != nil {
			t.Fatal(err)
		}
		if attempt < 5 {
			wantNext := at.Add(time.Second << (attempt - 1))
			if res[0].Status != RetryScheduled || !res[0].NextAttemptAt.Equal(wantNext) {
				t.Fatalf("attempt %d: nack = %+v, want retry at %v", attempt, res[0], wantNext)
			}
			if early := f.claim(t, "default", 1, time.Minute, wantNext.Add(-time.Millisecond)); len(early) != 0 {
				t.Fatalf("attempt %d: claimed before the backoff ended", attempt)
			}
			at = wantNext
			continue
		}
		if res[0].Status != Dead {
			t.Fatalf("fifth nack = %+v, want dead", res[0])
		}
		stale, _ := f.st.Nack(ctx, []NackItem{{Lease: lease(got[0], "default")}}, policy, func() float64 { return 0.5 }, at)
		if stale[0].Status != NackLeaseLost {
			t.Fatalf("nack of a dead delivery = %v", stale[0].Status)
		}
	}
	if s := f.count(t, "SELECT msg_status FROM message_store WHERE id = ?", it.Msg.ID); s != statusCode(StatusDead) {
		t.Fatalf("message status %d, want dead", s)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE message_id = ? AND is_dead = 1 AND error_code = 'E_STOCK'", it.Msg.ID); n != 1 {
		t.Fatal("delivery not dead with its error code")
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event IN ('nacked','retry_scheduled','dead_lettered')", it.Msg.ID); n != 10 {
		t.Fatalf("%d nack-related events, want 10", n)
	}
	if got := f.claim(t, "default", 1, time.Minute, at.Add(time.Hour)); len(got) != 0 {
		t.Fatal("a dead delivery was claimed")
	}
}

func TestExpiredLeaseOnLastAttemptDies(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	if _, err := f.st.Produce(ctx, []ProduceItem{f.item("t", "k", `1`)}); err != nil {
		t.Fatal(err)
	}
	at := f.now
	for attempt := 1; attempt <= 5; attempt++ {
		if got := f.claim(t, "default", 1, time.Second, at); len(got) != 1 || got[0].Attempt != attempt {
			t.Fatalf("attempt %d: %+v", attempt, got)
		}
		at = at.Add(2 * time.Second)
	}
	if got := f.claim(t, "default", 1, time.Second, at); len(got) != 0 {
		t.Fatalf("a sixth attempt was delivered")
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE is_dead = 1 AND error_code = 'lease_expired'"); n != 1 {
		t.Fatal("the delivery did not die after its last lease expired")
	}
}

func TestClaimOrdersByPriorityThenAgeAndHidesDelayed(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	old := f.item("t", "old", `1`)
	young := f.item("t", "young", `1`)
	urgent := f.item("t", "urgent", `1`)
	urgent.Msg.Priority = 9
	later := f.item("t", "later", `1`)
	later.Msg.Priority = 9
	later.AvailableAt = f.now.Add(time.Hour)
	if _, err := f.st.Produce(context.Background(), []ProduceItem{old, young, urgent, later}); err != nil {
		t.Fatal(err)
	}
	got := f.claim(t, "default", 10, time.Minute, f.now)
	var keys []string
	for _, c := range got {
		keys = append(keys, c.Message.Key)
	}
	if strings.Join(keys, ",") != "urgent,old,young" {
		t.Fatalf("claim order %v, want urgent,old,young (later is delayed)", keys)
	}
	var leases []Lease
	for _, c := range got {
		leases = append(leases, lease(c, "default"))
	}
	if _, err := f.st.Ack(context.Background(), leases, f.now); err != nil {
		t.Fatal(err)
	}
	if got := f.claim(t, "default", 10, time.Minute, f.now.Add(time.Hour)); len(got) != 1 || got[0].Message.Key != "later" {
		t.Fatalf("the delayed message was not claimable when due: %+v", got)
	}
}

func TestTranslateUnavailable(t *testing.T) {
	t.Parallel()
	_, err := Open(context.Background(), "root@tcp(127.0.0.1:1)/x", Options{})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("open of a closed port: %v, want ErrUnavailable", err)
	}
}

// ClaimMany serves several consumers with one scan; each keeps its own
// lease, token and consumer name.
func TestClaimManySharesOneScan(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	var items []ProduceItem
	for _, k := range []string{"a", "b", "c", "d"} {
		items = append(items, f.item("t", k, `1`))
	}
	if _, err := f.st.Produce(ctx, items); err != nil {
		t.Fatal(err)
	}
	mk := func(consumer string, max int) ClaimRequest {
		return ClaimRequest{Topic: "t", Subscription: "default", Consumer: consumer, Max: max, Lease: time.Minute,
			Token: f.ids.Next(), MaxAttempts: 5, Now: f.now}
	}
	got, err := f.st.ClaimMany(ctx, []ClaimRequest{mk("w1", 2), mk("w2", 3)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got[0]) != 2 || len(got[1]) != 2 || got[0][0].Token == got[1][0].Token {
		t.Fatalf("shares %d and %d (tokens %d, %d), want 2 and 2 with their own tokens", len(got[0]), len(got[1]), got[0][0].Token, got[1][0].Token)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE locked_by = 'w2' AND claim_token = ?", got[1][0].Token); n != 2 {
		t.Fatalf("w2 holds %d leases, want 2", n)
	}
	st, err := f.st.Ack(ctx, []Lease{lease(got[0][0], "default"), lease(got[1][1], "default")}, f.now)
	if err != nil || st[0] != LeaseOK || st[1] != LeaseOK {
		t.Fatalf("acks = %v, %v", st, err)
	}
}

// A batch run again after it committed (its answer was lost, e.g. in a
// failover) answers created for its own items and writes nothing twice.
func TestProduceRetryOfCommittedBatchIsCreated(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	batch := []ProduceItem{f.item("t", "r1", `1`), f.item("t", "r2", `2`)}
	if _, err := f.st.Produce(ctx, batch); err != nil {
		t.Fatal(err)
	}
	other := f.item("t", "r3", `3`)
	res, err := f.st.Produce(ctx, append(batch, other))
	if err != nil {
		t.Fatalf("retry of a committed batch: %v", err)
	}
	for i, r := range res {
		if r.Status != Created {
			t.Fatalf("item %d: %v, want created", i, r.Status)
		}
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_store"); n != 3 {
		t.Fatalf("%d messages stored, want 3", n)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue"); n != 3 {
		t.Fatalf("%d deliveries, want 3", n)
	}
}

// Dead letters untouched past the cutoff move to dead_letter_archive and
// their trace says archived; younger ones and leased ones stay.
func TestArchiveDeadMovesOnlyStaleOnes(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	old, young, leased := f.item("t", "old", `1`), f.item("t", "young", `1`), f.item("t", "leased", `1`)
	if _, err := f.st.Produce(ctx, []ProduceItem{old, young, leased}); err != nil {
		t.Fatal(err)
	}
	f.db.Exec("UPDATE message_queue SET is_dead = 1, error_code = 'E', dead_at = ? WHERE message_id IN (?, ?)", f.now.Add(-40*24*time.Hour), old.Msg.ID, leased.Msg.ID)
	f.db.Exec("UPDATE message_queue SET is_dead = 1, error_code = 'E', dead_at = ? WHERE message_id = ?", f.now.Add(-time.Hour), young.Msg.ID)
	f.db.Exec("UPDATE message_queue SET claim_token = 7 WHERE message_id = ?", leased.Msg.ID)
	n, err := f.st.ArchiveDead(ctx, "t", "default", f.now.Add(-30*24*time.Hour), f.now)
	if err != nil || n != 1 {
		t.Fatalf("archived %d, %v; want 1", n, err)
	}
	if c := f.count(t, "SELECT COUNT(*) FROM dead_letter_archive WHERE message_id = ? AND error_code = 'E'", old.Msg.ID); c != 1 {
		t.Fatal("the stale dead letter is not in the archive")
	}
	if c := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE is_dead = 1"); c != 2 {
		t.Fatalf("%d dead letters left, want 2 (the young and the leased one)", c)
	}
	if c := f.count(t, "SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event = 'archived'", old.Msg.ID); c != 1 {
		t.Fatal("no archived event")
	}
}

// Redrive on an ordered subscription: the revived dead letter heads its
// key again and the key never sticks; a dead letter leased on the
// dead-letter channel is not redriven under its handler.
func TestRedriveOrderedAndLeasedDeadLetters(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	m1, m2 := f.item("t", "m1", `1`), f.item("t", "m2", `2`)
	m1.Msg.OrderKey, m2.Msg.OrderKey = "acct", "acct"
	if _, err := f.st.Produce(ctx, []ProduceItem{m1, m2}); err != nil {
		t.Fatal(err)
	}
	at := f.now
	claim := func(dead bool) []Claimed {
		t.Helper()
		got, err := f.st.Claim(ctx, ClaimRequest{Topic: "t", Subscription: "default", Consumer: "w", Max: 10, Lease: time.Minute,
			Token: f.ids.Next(), MaxAttempts: 1, Now: at, Ordered: true, Dead: dead})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	got := claim(false)
	if len(got) != 1 || got[0].Message.Key != "m1" {
		t.Fatalf("first ordered claim %+v, want m1 only", got)
	}
	one := func(string, string) RetryPolicy { return RetryPolicy{MaxAttempts: 1} }
	l := lease(got[0], "default")
	l.Ordered = true
	if res, err := f.st.Nack(ctx, []NackItem{{Lease: l, ErrorCode: "E"}}, one, func() float64 { return 0 }, at); err != nil || res[0].Status != Dead {
		t.Fatalf("nack: %+v %v", res, err)
	}
	// m1 is dead, m2 is now the head and ready. Redrive m1 while m2 is
	// not in flight: m1 heads the key again.
	if n, err := f.st.Redrive(ctx, RedriveRequest{Topic: "t", Subscription: "default", Ordered: true, Now: at}); err != nil || n != 1 {
		t.Fatalf("redrive: %d %v", n, err)
	}
	got = claim(false)
	if len(got) != 1 || got[0].Message.Key != "m1" {
		t.Fatalf("after redrive claimed %+v, want m1 alone", got)
	}
	l = lease(got[0], "default")
	l.Ordered = true
	if st, err := f.st.Ack(ctx, []Lease{l}, at); err != nil || st[0] != LeaseOK {
		t.Fatalf("ack m1: %v %v", st, err)
	}
	got = claim(false)
	if len(got) != 1 || got[0].Message.Key != "m2" {
		t.Fatalf("after m1 was acked claimed %+v, want m2 (the key must not stick)", got)
	}
	l = lease(got[0], "default")
	l.Ordered = true
	f.st.Nack(ctx, []NackItem{{Lease: l, ErrorCode: "E"}}, one, func() float64 { return 0 }, at)
	// m2 is dead; a handler leases it on the dead-letter channel: a
	// redrive now leaves it to that handler.
	if dl := claim(true); len(dl) != 1 {
		t.Fatalf("dead-letter claim %+v", dl)
	}
	if n, err := f.st.Redrive(ctx, RedriveRequest{Topic: "t", Subscription: "default", Ordered: true, Now: at}); err != nil || n != 0 {
		t.Fatalf("redrive of a leased dead letter: %d %v, want 0", n, err)
	}
}

// DeadByCode counts, by error code, exactly what Redrive with the same
// request would take — leased dead letters left out, selections by code
// and by ids — and changes nothing.
func TestDeadByCodeCountsWhatRedriveTakes(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	var items []ProduceItem
	for _, k := range []string{"a", "b", "c", "d", "e", "live"} {
		items = append(items, f.item("t", k, `1`))
	}
	if _, err := f.st.Produce(ctx, items); err != nil {
		t.Fatal(err)
	}
	id := func(i int) uint64 { return items[i].Msg.ID }
	f.db.Exec("UPDATE message_queue SET is_dead = 1, error_code = 'E_STOCK', dead_at = ? WHERE message_id IN (?, ?, ?)", f.now, id(0), id(1), id(2))
	f.db.Exec("UPDATE message_queue SET is_dead = 1, error_code = 'E_PAY', dead_at = ? WHERE message_id IN (?, ?)", f.now, id(3), id(4))
	// c is leased to a dead-letter handler until after now.
	f.db.Exec("UPDATE message_queue SET claim_token = 7, available_at = ? WHERE message_id = ?", f.now.Add(time.Minute), id(2))
	for _, c := range []struct {
		name string
		req  RedriveRequest
		want map[string]int64
	}{
		{"all", RedriveRequest{}, map[string]int64{"E_STOCK": 2, "E_PAY": 2}},
		{"one code", RedriveRequest{ErrorCode: "E_PAY"}, map[string]int64{"E_PAY": 2}},
		{"unknown code", RedriveRequest{ErrorCode: "E_NONE"}, map[string]int64{}},
		{"ids, a live one among them", RedriveRequest{IDs: []uint64{id(0), id(3), id(5)}}, map[string]int64{"E_STOCK": 1, "E_PAY": 1}},
		{"the leased one", RedriveRequest{IDs: []uint64{id(2)}}, map[string]int64{}},
	} {
		c.req.Topic, c.req.Subscription, c.req.Now = "t", "default", f.now
		got, err := f.st.DeadByCode(ctx, c.req)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Fatalf("%s: %v %v, want %v", c.name, got, err, c.want)
		}
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE is_dead = 1"); n != 5 {
		t.Fatalf("%d dead letters after counting, want 5", n)
	}
	want, _ := f.st.DeadByCode(ctx, RedriveRequest{Topic: "t", Subscription: "default", ErrorCode: "E_STOCK", Now: f.now})
	if n, err := f.st.Redrive(ctx, RedriveRequest{Topic: "t", Subscription: "default", ErrorCode: "E_STOCK", Now: f.now}); err != nil || n != want["E_STOCK"] {
		t.Fatalf("redrive took %d (%v), the count said %d", n, err, want["E_STOCK"])
	}
}

// A row that is not there is ErrNotFound, never an outage: callers (the
// load tester's lost-message proof, lookups) tell the two apart.
func TestLookupKeyMissingIsNotFound(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	if _, err := f.st.LookupKey(ctx, "nothing", "absent"); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("missing key: %v, want ErrNotFound only", err)
	}
	it := f.item("lk", "present", `{"a":1}`)
	if _, err := f.st.Produce(ctx, []ProduceItem{it}); err != nil {
		t.Fatal(err)
	}
	if id, err := f.st.LookupKey(ctx, "lk", "present"); err != nil || id != it.Msg.ID {
		t.Fatalf("present key: %d, %v; want %d", id, err, it.Msg.ID)
	}
}

// Every connection of a Store carries the session settings its
// statements rely on: UTC, READ COMMITTED, and statistics instead of
// index reads for the range estimates of long id lists.
func TestSessionSettings(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	var zone, iso string
	var dives int
	// Several connections at once: each new one is set up the same way.
	for range 3 {
		conn, err := f.st.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := conn.QueryRowContext(ctx, "SELECT @@SESSION.time_zone, @@SESSION.eq_range_index_dive_limit").Scan(&zone, &dives); err != nil {
			t.Fatal(err)
		}
		// MySQL 8 and MariaDB 11.1 on name the isolation
		// transaction_isolation; MariaDB before 11.1 only tx_isolation.
		if err := conn.QueryRowContext(ctx, "SELECT @@SESSION.transaction_isolation").Scan(&iso); err != nil {
			if err := conn.QueryRowContext(ctx, "SELECT @@SESSION.tx_isolation").Scan(&iso); err != nil {
				t.Fatal(err)
			}
		}
		if zone != "+00:00" || iso != "READ-COMMITTED" || dives != 10 {
			t.Fatalf("session: time_zone %q, isolation %q, eq_range_index_dive_limit %d; want +00:00, READ-COMMITTED, 10", zone, iso, dives)
		}
	}
}
