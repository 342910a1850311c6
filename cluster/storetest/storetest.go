// Package storetest is the contract of cluster.Store: one suite of
// behaviours that every implementation passes — the real store on
// MariaDB (store.Store) and the in-memory fake the broker's and the
// cluster's tests run on (clustertest.Store) — so that the fake cannot
// drift from what the broker relies on. Each behaviour uses a topic of
// its own, so one store serves the whole suite.
package storetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/store"
)

// Run runs the suite on s.
func Run(t *testing.T, s cluster.Store) {
	// One id generator for every behaviour: they share the store, and
	// generators of their own (a random 10-bit node each) could give two
	// of them the same id in the same millisecond.
	gen := idgen.New(nil)
	for _, tc := range []struct {
		name string
		test func(t *testing.T, e *env)
	}{
		{"ProduceDedupAndConflict", testProduceDedupAndConflict},
		{"ProduceRefusesInvalidBatchWhole", testProduceRefusesInvalidBatchWhole},
		{"ClaimManyLeasesEachRequestItsOwn", testClaimManyLeasesEachRequestItsOwn},
		{"ClaimOrderIsPriorityThenAge", testClaimOrderIsPriorityThenAge},
		{"PeekShowsWhatAClaimTakes", testPeekShowsWhatAClaimTakes},
		{"ClaimSkipsExcludedVShards", testClaimSkipsExcludedVShards},
		{"AckNeedsTheLease", testAckNeedsTheLease},
		{"ExtendNeedsTheLease", testExtendNeedsTheLease},
		{"ReleaseMakesReady", testReleaseMakesReady},
		{"NackRetriesThenDies", testNackRetriesThenDies},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t, newEnv(t, s, gen))
		})
	}
}

// env is one behaviour's topic on the store under test.
type env struct {
	s     cluster.Store
	topic string
	ids   *idgen.Gen
	ctx   context.Context
}

func newEnv(t *testing.T, s cluster.Store, ids *idgen.Gen) *env {
	var b [6]byte
	rand.Read(b[:])
	return &env{s: s, topic: "contract." + hex.EncodeToString(b[:]), ids: ids, ctx: context.Background()}
}

// item is a message of the env's topic for the default subscription.
func (e *env) item(key, payload string, priority int, vshard uint16) store.ProduceItem {
	id := e.ids.Next()
	h := sha256.Sum256([]byte(payload))
	return store.ProduceItem{
		Msg: &store.Message{ID: id, VShard: vshard, Topic: e.topic, Key: key, Priority: priority, PayloadJSON: true,
			Payload: []byte(payload), CreatedAt: idgen.Time(id)},
		Hash:          h[:16],
		AvailableAt:   time.Now().UTC(),
		Subscriptions: []string{"default"},
	}
}

func (e *env) produce(t *testing.T, items ...store.ProduceItem) []store.ProduceResult {
	t.Helper()
	res, err := e.s.Produce(e.ctx, items)
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
	return res
}

// claim runs one ClaimMany of one request.
func (e *env) claim(t *testing.T, max int, exclude ...uint16) []store.Claimed {
	t.Helper()
	got, err := e.s.ClaimMany(e.ctx, []store.ClaimRequest{e.req(max, exclude...)})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return got[0]
}

func (e *env) req(max int, exclude ...uint16) store.ClaimRequest {
	return store.ClaimRequest{Topic: e.topic, Subscription: "default", Consumer: "w", Max: max, Lease: time.Minute,
		Token: e.ids.Next(), MaxAttempts: 5, Now: time.Now().UTC(), ExcludeVShards: exclude}
}

func lease(c store.Claimed) store.Lease {
	return store.Lease{MessageID: c.Message.ID, Subscription: "default", Token: c.Token}
}

func ids(cs []store.Claimed) []uint64 {
	out := make([]uint64, len(cs))
	for i, c := range cs {
		out[i] = c.Message.ID
	}
	return out
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A key is stored once per topic: the same payload again is a duplicate
// and the other payload a conflict, both naming the holder; the key on
// another topic is new.
func testProduceDedupAndConflict(t *testing.T, e *env) {
	a := e.item("k1", `{"a":1}`, 0, 7)
	res := e.produce(t, a, e.item("k1", `{"a":1}`, 0, 9))
	if res[0].Status != store.Created || res[0].ID != a.Msg.ID {
		t.Fatalf("first: %+v, want created %d", res[0], a.Msg.ID)
	}
	if res[1].Status != store.Duplicate || res[1].ID != a.Msg.ID || res[1].VShard != 7 {
		t.Fatalf("same key and payload in the batch: %+v, want duplicate of %d on vshard 7", res[1], a.Msg.ID)
	}
	res = e.produce(t, e.item("k1", `{"a":2}`, 0, 9), e.item("k1", `{"a":1}`, 0, 9))
	if res[0].Status != store.Conflict || res[0].ID != a.Msg.ID || res[0].VShard != 7 {
		t.Fatalf("other payload: %+v, want conflict with %d on vshard 7", res[0], a.Msg.ID)
	}
	if res[1].Status != store.Duplicate || res[1].ID != a.Msg.ID {
		t.Fatalf("same payload later: %+v, want duplicate of %d", res[1], a.Msg.ID)
	}
	other := &env{s: e.s, topic: e.topic + ".other", ids: e.ids, ctx: e.ctx}
	if res := other.produce(t, other.item("k1", `{"a":1}`, 0, 7)); res[0].Status != store.Created {
		t.Fatalf("the key on another topic: %+v, want created", res[0])
	}
}

// A batch with an item the database refuses (headers too long for their
// column) fails whole with ErrInvalidData, applying nothing: its good
// items are new afterwards.
func testProduceRefusesInvalidBatchWhole(t *testing.T, e *env) {
	good := e.item("good", `1`, 0, 7)
	bad := e.item("bad", `2`, 0, 7)
	bad.Msg.Headers = []byte(`{"h":"` + strings.Repeat("x", store.MaxHeadersBytes) + `"}`)
	_, err := e.s.Produce(e.ctx, []store.ProduceItem{good, bad})
	if !errors.Is(err, store.ErrInvalidData) {
		t.Fatalf("batch with oversized headers: %v, want ErrInvalidData", err)
	}
	again := e.item("good", `1`, 0, 7)
	if res := e.produce(t, again); res[0].Status != store.Created || res[0].ID != again.Msg.ID {
		t.Fatalf("the good item after the refused batch: %+v, want created (nothing was applied)", res[0])
	}
}

// Requests of one ClaimMany each get their own deliveries under their
// own token, oldest first, at attempt 1, leased until now + lease.
func testClaimManyLeasesEachRequestItsOwn(t *testing.T, e *env) {
	var want []uint64
	for i := range 5 {
		it := e.item("k"+string(rune('a'+i)), `1`, 0, 7)
		want = append(want, it.Msg.ID)
		e.produce(t, it)
	}
	r1, r2 := e.req(2), e.req(2)
	got, err := e.s.ClaimMany(e.ctx, []store.ClaimRequest{r1, r2})
	if err != nil {
		t.Fatal(err)
	}
	if !equal(ids(got[0]), want[:2]) || !equal(ids(got[1]), want[2:4]) {
		t.Fatalf("shares %v and %v, want %v and %v", ids(got[0]), ids(got[1]), want[:2], want[2:4])
	}
	for i, r := range []store.ClaimRequest{r1, r2} {
		for _, c := range got[i] {
			if c.Token != r.Token || c.Attempt != 1 {
				t.Fatalf("request %d: token %d attempt %d, want token %d attempt 1", i, c.Token, c.Attempt, r.Token)
			}
			if d := c.LeaseExpires.Sub(r.Now.Add(r.Lease)); d < -time.Second || d > time.Second {
				t.Fatalf("request %d: lease until %v, want %v", i, c.LeaseExpires, r.Now.Add(r.Lease))
			}
		}
	}
	if rest := e.claim(t, 10); !equal(ids(rest), want[4:]) {
		t.Fatalf("what is left: %v, want %v (leased deliveries are not claimed again)", ids(rest), want[4:])
	}
}

// A claim takes the highest priority first, then the oldest.
func testClaimOrderIsPriorityThenAge(t *testing.T, e *env) {
	low1, high, low2, mid := e.item("l1", `1`, 0, 7), e.item("h", `1`, 9, 7), e.item("l2", `1`, 0, 7), e.item("m", `1`, 5, 7)
	e.produce(t, low1, high, low2, mid)
	want := []uint64{high.Msg.ID, mid.Msg.ID, low1.Msg.ID, low2.Msg.ID}
	if got := e.claim(t, 4); !equal(ids(got), want) {
		t.Fatalf("claim order %v, want %v (priority, then age)", ids(got), want)
	}
}

// PeekClaimable shows, without leasing, what a claim would take and in
// which order.
func testPeekShowsWhatAClaimTakes(t *testing.T, e *env) {
	e.produce(t, e.item("a", `1`, 0, 7), e.item("b", `1`, 3, 7), e.item("c", `1`, 0, 7))
	heads, err := e.s.PeekClaimable(e.ctx, e.topic, "default", time.Now().UTC(), 10, false, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	peeked := make([]uint64, len(heads))
	for i, h := range heads {
		peeked[i] = h.MessageID
	}
	if len(heads) == 0 || heads[0].Priority != 3 {
		t.Fatalf("peek %+v, want the priority 3 delivery first", heads)
	}
	if got := e.claim(t, 10); !equal(ids(got), peeked) {
		t.Fatalf("claim took %v after a peek showed %v", ids(got), peeked)
	}
}

// Deliveries of excluded vshards (frozen for a cut-over) are not claimed.
func testClaimSkipsExcludedVShards(t *testing.T, e *env) {
	frozen, serving := e.item("f", `1`, 0, 3), e.item("s", `1`, 0, 4)
	e.produce(t, frozen, serving)
	if got := e.claim(t, 10, 3); !equal(ids(got), []uint64{serving.Msg.ID}) {
		t.Fatalf("claim excluding vshard 3: %v, want only %d", ids(got), serving.Msg.ID)
	}
	if got := e.claim(t, 10); !equal(ids(got), []uint64{frozen.Msg.ID}) {
		t.Fatalf("claim without exclusion: %v, want %d", ids(got), frozen.Msg.ID)
	}
}

// Only the lease holder's token acks; an acked delivery is gone; acks of
// several requests in one AckMany are answered per request.
func testAckNeedsTheLease(t *testing.T, e *env) {
	e.produce(t, e.item("a", `1`, 0, 7), e.item("b", `1`, 0, 7), e.item("c", `1`, 0, 7))
	got := e.claim(t, 3)
	if len(got) != 3 {
		t.Fatalf("claimed %d, want 3", len(got))
	}
	wrong := lease(got[0])
	wrong.Token++
	st, err := e.s.Ack(e.ctx, []store.Lease{wrong, lease(got[1])}, time.Now().UTC())
	if err != nil || st[0] != store.LeaseLost || st[1] != store.LeaseOK {
		t.Fatalf("ack with a wrong token and a right one: %v, %v; want lease_lost, ok", st, err)
	}
	res := e.s.AckMany(e.ctx, []store.AckGroup{{Leases: []store.Lease{lease(got[1])}}, {Leases: []store.Lease{lease(got[0]), lease(got[2])}}},
		time.Now().UTC())
	if res[0].Err != nil || res[0].Statuses[0] != store.LeaseNotFound {
		t.Fatalf("acking an acked delivery again: %+v, want not_found", res[0])
	}
	if res[1].Err != nil || res[1].Statuses[0] != store.LeaseOK || res[1].Statuses[1] != store.LeaseOK {
		t.Fatalf("the other request's acks: %+v, want ok, ok", res[1])
	}
	if rest := e.claim(t, 10); len(rest) != 0 {
		t.Fatalf("claimed %v after every delivery was acked", ids(rest))
	}
}

// Extend moves a held lease's expiry to now + lease; a wrong token is
// refused.
func testExtendNeedsTheLease(t *testing.T, e *env) {
	e.produce(t, e.item("a", `1`, 0, 7))
	got := e.claim(t, 1)
	wrong := lease(got[0])
	wrong.Token++
	now := time.Now().UTC()
	st, until, err := e.s.Extend(e.ctx, []store.Lease{wrong, lease(got[0])}, time.Hour, now)
	if err != nil || st[0] != store.LeaseLost || st[1] != store.LeaseOK {
		t.Fatalf("extend with a wrong token and the right one: %v, %v; want lease_lost, ok", st, err)
	}
	if d := until.Sub(now.Add(time.Hour)); d < -time.Second || d > time.Second {
		t.Fatalf("extended until %v, want %v", until, now.Add(time.Hour))
	}
}

// Released leases are claimable again at once.
func testReleaseMakesReady(t *testing.T, e *env) {
	e.produce(t, e.item("a", `1`, 0, 7), e.item("b", `1`, 0, 7))
	got := e.claim(t, 2)
	n, err := e.s.Release(e.ctx, []store.Lease{lease(got[0])}, false, time.Now().UTC())
	if err != nil || n != 1 {
		t.Fatalf("release: %d, %v; want 1", n, err)
	}
	if again := e.claim(t, 10); !equal(ids(again), []uint64{got[0].Message.ID}) {
		t.Fatalf("claim after release: %v, want %d", ids(again), got[0].Message.ID)
	}
}

// A nack schedules a retry after a backoff while attempts remain, and
// kills the delivery at the policy's max attempts; a dead delivery counts
// in CountDead and Stats.
func testNackRetriesThenDies(t *testing.T, e *env) {
	e.produce(t, e.item("a", `1`, 0, 7))
	policy := func(topic, sub string) store.RetryPolicy {
		return store.RetryPolicy{MaxAttempts: 2, Initial: time.Hour, Max: time.Hour, Multiplier: 1}.WithDefaults()
	}
	nack := func(c store.Claimed) store.NackResult {
		t.Helper()
		res, err := e.s.Nack(e.ctx, []store.NackItem{{Lease: lease(c), ErrorCode: "E_TEST"}}, policy, func() float64 { return 0.5 }, time.Now().UTC())
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	first := e.claim(t, 1)
	now := time.Now().UTC()
	if r := nack(first[0]); r.Status != store.RetryScheduled || !r.NextAttemptAt.After(now) {
		t.Fatalf("first nack: %+v, want retry_scheduled in the future", r)
	}
	if r := nack(first[0]); r.Status != store.NackLeaseLost {
		t.Fatalf("nack of a nacked lease: %+v, want lease_lost", r)
	}
	if again := e.claim(t, 1); len(again) != 0 {
		t.Fatalf("claimed %v during the backoff", ids(again))
	}
	stats := func() store.QueueStats {
		t.Helper()
		all, err := e.s.Stats(e.ctx, time.Now().UTC())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range all {
			if s.Topic == e.topic && s.Subscription == "default" {
				return s
			}
		}
		return store.QueueStats{}
	}
	if s := stats(); s.Delayed != 1 || s.Ready != 0 || s.InFlight != 0 || s.Dead != 0 {
		t.Fatalf("stats during the backoff: %+v, want 1 delayed", s)
	}
	// The second attempt, once the backoff is over.
	got, err := e.s.ClaimMany(e.ctx, []store.ClaimRequest{{Topic: e.topic, Subscription: "default", Consumer: "w", Max: 1,
		Lease: time.Minute, Token: e.ids.Next(), MaxAttempts: 5, Now: now.Add(2 * time.Hour)}})
	if err != nil || len(got[0]) != 1 || got[0][0].Attempt != 2 {
		t.Fatalf("claim after the backoff: %+v, %v; want the delivery at attempt 2", got, err)
	}
	if r := nack(got[0][0]); r.Status != store.Dead {
		t.Fatalf("nack at max attempts: %+v, want dead", r)
	}
	if n, err := e.s.CountDead(e.ctx, e.topic, "default"); err != nil || n != 1 {
		t.Fatalf("dead letters: %d, %v; want 1", n, err)
	}
	if s := stats(); s.Dead != 1 || s.Ready+s.Delayed+s.InFlight != 0 {
		t.Fatalf("stats after dying: %+v, want 1 dead", s)
	}
}
