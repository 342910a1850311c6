package delivery

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/store"
)

type bed struct {
	clock *clock
	table *memTable
	m     *Manager
}

func newBed(t *testing.T, cfg Config) *bed {
	t.Helper()
	c := newClock()
	tb := newMemTable(c)
	return newRouter(t, c, tb, cfg)
}

// newRouter is another router (manager) over the same table.
func newRouter(t *testing.T, c *clock, tb *memTable, cfg Config) *bed {
	t.Helper()
	m := New(cfg, c.now, nil)
	m.SetClusters(map[string]Cluster{"c1": tableCluster{tb}})
	return &bed{clock: c, table: tb, m: m}
}

var unit = Unit{Cluster: "c1", Topic: "t", Subscription: "s"}

func size(*store.Message) int { return 100 }

func spec(consumer string) ClaimSpec {
	return ClaimSpec{Consumer: consumer, Lease: 30 * time.Second, MaxAttempts: 3}
}

// claim is what a router's claim does on one unit.
func (b *bed) claim(t *testing.T, n int, sp ClaimSpec) []Claimed {
	t.Helper()
	ctx := context.Background()
	o := b.take(t)
	cs, err := o.Reserve(ctx, n, sp)
	if err != nil {
		t.Fatalf("reserve: %v", err)
	}
	got, err := o.Take(ctx, cs, sp, 0, true, size)
	if err != nil {
		t.Fatalf("take: %v", err)
	}
	return got
}

// tick moves the clock and runs what the manager's loop would have run
// meanwhile (renewals; expiries are run by the tests that want them).
func (b *bed) tick(d time.Duration) {
	b.clock.add(d)
	b.m.upkeep()
}

func (b *bed) owner(t *testing.T) *Owner {
	t.Helper()
	o, _, err := b.m.Route(context.Background(), unit, false, 0)
	if err != nil || o == nil {
		t.Fatalf("no owner: %v", err)
	}
	return o
}

// fill stores n ready messages of priority 0 without an order key for
// the unit and answers their ids in claim order.
func (b *bed) fill(n int) []uint64 {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = b.table.add("t", "s", 0, "", 0)
	}
	return ids
}

// take makes this router the unit's owner, as a claim does.
func (b *bed) take(t *testing.T) *Owner {
	t.Helper()
	o, _, err := b.m.Route(context.Background(), unit, true, 0)
	if err != nil || o == nil {
		t.Fatalf("route: %v, %v", o, err)
	}
	return o
}

func opOf(c Claimed) Op { return Op{MessageID: c.Message.ID, Token: c.Token} }

func ids(cs []Claimed) []uint64 {
	var out []uint64
	for _, c := range cs {
		out = append(out, c.Message.ID)
	}
	return out
}

// A first attempt is handed out from memory: nothing is written until its
// ack, which deletes the delivery in one flush and is answered after it.
func TestFirstAttemptWritesNothingUntilItsAck(t *testing.T) {
	b := newBed(t, Config{})
	a := b.table.add("t", "s", 0, "", 0)
	c := b.table.add("t", "s", 0, "", 0)
	got := b.claim(t, 10, spec("w"))
	if !slices.Equal(ids(got), []uint64{a, c}) || !got[0].Memory || got[0].Attempt != 1 {
		t.Fatalf("claimed %v (memory %v, attempt %d)", ids(got), got[0].Memory, got[0].Attempt)
	}
	if n := b.table.count("flush") + b.table.count("durable"); n != 0 {
		t.Fatalf("%d writes for a claim, want none", n)
	}
	if again := b.claim(t, 10, spec("w2")); len(again) != 0 {
		t.Fatalf("leased deliveries handed out again: %v", ids(again))
	}
	o := b.owner(t)
	res := o.Ack(context.Background(), []Op{opOf(got[0]), opOf(got[0])})
	if res[0].Status != domain.LeaseOK || res[1].Status != domain.LeaseNotFound || !res[1].Held {
		t.Fatalf("ack: %+v", res)
	}
	if b.table.get(a, "s") != nil || b.table.count("flush") != 1 {
		t.Fatalf("ack not flushed once (%d flushes)", b.table.count("flush"))
	}
	if res := o.Ack(context.Background(), []Op{opOf(got[0])}); res[0].Held {
		t.Fatalf("an acked lease is still held: %+v", res)
	}
	if res := o.Ack(context.Background(), []Op{{MessageID: c, Token: got[1].Token + 2}}); res[0].Held {
		t.Fatalf("a wrong token matched: %+v", res)
	}
	if held, _ := b.m.InFlight(); held != 1 {
		t.Fatalf("%d leases in memory, want 1", held)
	}
}

// Claims take the highest priority first, then the oldest, and never a
// delivery before its time.
func TestPriorityThenAgeAndDelay(t *testing.T) {
	b := newBed(t, Config{})
	low := b.table.add("t", "s", 1, "", 0)
	high := b.table.add("t", "s", 9, "", 0)
	later := b.table.add("t", "s", 9, "", time.Minute)
	low2 := b.table.add("t", "s", 1, "", 0)
	first := b.claim(t, 10, spec("w"))
	if got := ids(first); !slices.Equal(got, []uint64{high, low, low2}) {
		t.Fatalf("claimed %v, want %v", got, []uint64{high, low, low2})
	}
	ops := make([]Op, len(first))
	for i, c := range first {
		ops[i] = opOf(c)
	}
	b.owner(t).Ack(context.Background(), ops)
	b.tick(2 * time.Minute)
	if got := ids(b.claim(t, 10, spec("w"))); !slices.Equal(got, []uint64{later}) {
		t.Fatalf("after its delay: %v, want %v", got, []uint64{later})
	}
}

// A scan from the head with leases in flight reads only the positions
// of those leases (it skips them) and still finds what became claimable
// behind the cursor, in claim order.
func TestScanFromTheHeadSkipsLeasesInFlight(t *testing.T) {
	b := newBed(t, Config{})
	var plain []uint64
	for range 5 {
		plain = append(plain, b.table.add("t", "s", 0, "", 0))
	}
	first := b.claim(t, 3, spec("w"))
	if !slices.Equal(ids(first), plain[:3]) {
		t.Fatalf("first claim %v, want %v", ids(first), plain[:3])
	}
	urgent := b.table.add("t", "s", 9, "", 10*time.Second)
	b.tick(11 * time.Second) // within the first claim's leases of 30s
	got := b.claim(t, 10, spec("w"))
	if want := []uint64{urgent, plain[3], plain[4]}; !slices.Equal(ids(got), want) {
		t.Fatalf("claimed %v, want %v", ids(got), want)
	}
	b.table.mu.Lock()
	defer b.table.mu.Unlock()
	if !slices.Contains(b.table.skipped, 3) {
		t.Fatalf("skipping scans' skip sets %v, want one of the 3 leases in flight", b.table.skipped)
	}
}

// A nack of a first attempt schedules the retry in one flush; the retry is
// claimed durably, its attempt counted in the table first; at max
// attempts a nack kills it.
func TestNackRetriesDurablyThenDies(t *testing.T) {
	b := newBed(t, Config{})
	id := b.table.add("t", "s", 0, "", 0)
	got := b.claim(t, 1, spec("w"))
	policy := func() store.RetryPolicy {
		return store.RetryPolicy{MaxAttempts: 2, Initial: time.Second, Max: time.Second}
	}
	res := b.owner(t).Nack(context.Background(), []Op{{MessageID: id, Token: got[0].Token, ErrorCode: "E"}}, policy, func() float64 { return 0.5 })
	if res[0].NackStatus != domain.NackRetryScheduled || res[0].NextAttemptAt.IsZero() {
		t.Fatalf("nack: %+v", res[0])
	}
	if r := b.table.get(id, "s"); r.attempts != 1 || !r.available.After(b.clock.now()) {
		t.Fatalf("row after nack: %+v", r)
	}
	if again := b.claim(t, 1, spec("w")); len(again) != 0 {
		t.Fatal("retried before its backoff")
	}
	b.tick(2 * time.Second)
	sp := spec("w")
	sp.MaxAttempts = 2
	retry := b.claim(t, 1, sp)
	if len(retry) != 1 || retry[0].Memory || retry[0].Attempt != 2 || b.table.get(id, "s").attempts != 2 {
		t.Fatalf("retry: %+v, row %+v", retry, b.table.get(id, "s"))
	}
	// The retry's lease is durable: the owner does not hold it; the
	// table's path (not modelled here) answers for it.
	if res := b.owner(t).Nack(context.Background(), []Op{{MessageID: id, Token: retry[0].Token}}, policy, nil); res[0].Held {
		t.Fatalf("a durable lease answered from memory: %+v", res[0])
	}
	// A subscription allowing one attempt kills on the first nack.
	id2 := b.table.add("t", "s", 0, "", 0)
	got = b.claim(t, 1, spec("w"))
	if got[0].Message.ID != id2 {
		t.Fatalf("claimed %d, want %d", got[0].Message.ID, id2)
	}
	one := func() store.RetryPolicy { return store.RetryPolicy{MaxAttempts: 1} }
	if res := b.owner(t).Nack(context.Background(), []Op{opOf(got[0])}, one, nil); res[0].NackStatus != domain.NackDead {
		t.Fatalf("nack at max attempts: %+v", res[0])
	}
	if r := b.table.get(id2, "s"); !r.dead || r.attempts != 1 {
		t.Fatalf("row after a dead nack: %+v", r)
	}
}

// Extend moves a lease in memory without a write; a lease that runs out
// is written to the table as a lapsed durable lease, whose next claim
// counts the lost attempt.
func TestExtendAndExpiry(t *testing.T) {
	b := newBed(t, Config{})
	a := b.table.add("t", "s", 0, "", 0)
	c := b.table.add("t", "s", 0, "", 0)
	got := b.claim(t, 2, spec("w"))
	b.tick(20 * time.Second)
	o := b.owner(t)
	if res := o.Extend(context.Background(), []Op{opOf(got[0])}, time.Minute); res[0].Status != domain.LeaseOK ||
		!res[0].Expires.Equal(b.clock.now().Add(time.Minute)) {
		t.Fatalf("extend: %+v", res[0])
	}
	if n := b.table.count("flush"); n != 0 {
		t.Fatalf("%d flushes for an extend", n)
	}
	b.tick(15 * time.Second) // c's lease (30s) ran out; a's was extended
	o.expire(b.clock.now())
	testtime.Until(t, "one delivery in flight", func() bool { return o.InFlight() == 1 })
	r := b.table.get(c, "s")
	if r.token != got[1].Token || r.attempts != 1 || r.lockedBy != "w" {
		t.Fatalf("lapsed lease written as %+v", r)
	}
	if r := b.table.get(a, "s"); r.token != 0 {
		t.Fatalf("extended lease written: %+v", r)
	}
	// The next claim counts the lapsed attempt (durably) and hands c out
	// as its second.
	again := b.claim(t, 5, spec("w2"))
	if len(again) != 1 || again[0].Message.ID != c || again[0].Attempt != 2 || again[0].Memory {
		t.Fatalf("after expiry: %+v", again)
	}
	if !slices.Contains(b.table.events, "expired "+itoa(c)) {
		t.Fatalf("no lease_expired for %d: %v", c, b.table.events)
	}
}

// An ordered subscription hands out one delivery per order key at a time,
// in produce order; other keys go on.
func TestOrderedOneInFlightPerKey(t *testing.T) {
	b := newBed(t, Config{})
	a1 := b.table.add("t", "s", 0, "A", 0)
	a2 := b.table.add("t", "s", 9, "A", 0) // a higher priority never overtakes its key
	b1 := b.table.add("t", "s", 0, "B", 0)
	sp := spec("w")
	sp.Ordered = true
	got := b.claim(t, 10, sp)
	if !slices.Equal(ids(got), []uint64{a1, b1}) {
		t.Fatalf("claimed %v, want %v", ids(got), []uint64{a1, b1})
	}
	testtime.Until(t, "the subscription parked", func() bool { r := b.table.get(a2, "s"); return r.parked })
	if again := b.claim(t, 10, sp); len(again) != 0 {
		t.Fatalf("second of a key handed out while its head is in flight: %v", ids(again))
	}
	o := b.owner(t)
	if res := o.Ack(context.Background(), []Op{opOf(got[0])}); res[0].Status != domain.LeaseOK {
		t.Fatalf("ack: %+v", res[0])
	}
	if next := b.claim(t, 10, sp); !slices.Equal(ids(next), []uint64{a2}) {
		t.Fatalf("after the head's ack: %v, want %v", ids(next), []uint64{a2})
	}
}

// The router's cap on leases in memory hands out fewer first attempts
// and counts what it held back.
func TestCapOnLeasesInMemory(t *testing.T) {
	b := newBed(t, Config{MaxInFlight: 3})
	for range 5 {
		b.table.add("t", "s", 0, "", 0)
	}
	if got := b.claim(t, 5, spec("w")); len(got) != 3 {
		t.Fatalf("claimed %d over a cap of 3", len(got))
	}
	if held, refused := b.m.InFlight(); held != 3 || refused != 2 {
		t.Fatalf("held %d refused %d", held, refused)
	}
	if got := b.claim(t, 5, spec("w")); len(got) != 0 {
		t.Fatalf("claimed %d at the cap", len(got))
	}
}

// An owner whose unit another router took writes nothing more: its flush
// is refused by the epoch, its acks answer lease_lost, and it is dropped.
func TestStaleOwnerWritesNothing(t *testing.T) {
	b := newBed(t, Config{})
	id := b.table.add("t", "s", 0, "", 0)
	got := b.claim(t, 1, spec("w"))
	o := b.owner(t)
	// Another router takes the unit (as after this one's lease ran out).
	b.table.mu.Lock()
	b.table.own[[2]string{"t", "s"}].epoch++
	b.table.mu.Unlock()
	res := o.Ack(context.Background(), []Op{opOf(got[0])})
	if res[0].Status != domain.LeaseLost {
		t.Fatalf("ack by a stale owner: %+v", res[0])
	}
	if b.table.get(id, "s") == nil {
		t.Fatal("a stale owner's ack deleted the delivery")
	}
	if _, err := o.Reserve(context.Background(), 1, spec("w")); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("a lost owner reserved: %v", err)
	}
	if held, _ := b.m.InFlight(); held != 0 {
		t.Fatalf("%d leases still counted", held)
	}
}

// A router that takes a unit after its owner crashed hands nothing out
// before the crashed owner's horizon: the leases it held in memory may
// run until then. After it, they are redelivered as new attempts.
func TestTakeoverWaitsForTheHorizon(t *testing.T) {
	a := newBed(t, Config{Router: "a", LeaseTTL: 10 * time.Second})
	id := a.table.add("t", "s", 0, "", 0)
	got := a.claim(t, 1, spec("w"))
	if len(got) != 1 {
		t.Fatal("nothing claimed")
	}
	// a dies (no hand-over); b arrives after a's lease ran out.
	a.clock.add(11 * time.Second)
	b := newRouter(t, a.clock, a.table, Config{Router: "b"})
	if early := b.claim(t, 1, spec("w2")); len(early) != 0 {
		t.Fatalf("redelivered at %v, before a's lease of 30s could end", a.clock.now())
	}
	b.tick(25 * time.Second) // past 30s + the horizon's margins
	late := b.claim(t, 1, spec("w2"))
	if len(late) != 1 || late[0].Message.ID != id {
		t.Fatalf("not redelivered after the horizon: %+v", late)
	}
}

// A router that hands its units over (shutting down) writes its leases
// into the table, so the next owner starts at once and their receipts
// stay valid there.
func TestHandOverWritesLeasesOut(t *testing.T) {
	a := newBed(t, Config{Router: "a"})
	id := a.table.add("t", "s", 0, "", 0)
	other := a.table.add("t", "s", 0, "", 0)
	got := a.claim(t, 1, spec("w"))
	a.m.Stop()
	r := a.table.get(id, "s")
	if r.token != got[0].Token || !r.available.Equal(got[0].LeaseExpires) {
		t.Fatalf("lease not written out: %+v", r)
	}
	b := newRouter(t, a.clock, a.table, Config{Router: "b"})
	next := b.claim(t, 5, spec("w2"))
	if !slices.Equal(ids(next), []uint64{other}) {
		t.Fatalf("next owner claimed %v, want only %d at once", ids(next), other)
	}
}

// A hand-over whose release fails leaves the unit's lease naming this
// router, which every renewal renews: the router retries the release
// before its next renewal, so the unit passes on instead of staying with
// a router that no longer serves it (a livelock seen in a loaded run:
// each router forwarded the unit's claims to the other).
func TestFailedReleaseIsRetriedBeforeTheRenewal(t *testing.T) {
	a := newBed(t, Config{Router: "a", Addr: "a:1"})
	a.table.add("t", "s", 0, "", 0)
	other := a.table.add("t", "s", 0, "", 0)
	a.claim(t, 1, spec("w"))
	owners := a.m.Owners("c1")
	if len(owners) != 1 {
		t.Fatalf("%d owners, want 1", len(owners))
	}
	a.table.mu.Lock()
	a.table.failNext["release"] = 1
	a.table.mu.Unlock()
	a.m.handOver(context.Background(), owners[0])
	if n := len(a.m.Owners("c1")); n != 0 {
		t.Fatalf("%d owners after the hand-over, want 0", n)
	}
	a.tick(time.Second)
	a.m.upkeep()
	row := a.table.ownerOf("t", "s")
	if row.leaseUntil.After(a.clock.now()) {
		t.Fatalf("the renewal after a failed release kept the unit's lease: %+v (now %v)", row, a.clock.now())
	}
	b := newRouter(t, a.clock, a.table, Config{Router: "b", Addr: "b:1"})
	if next := b.claim(t, 5, spec("w2")); !slices.Equal(ids(next), []uint64{other}) {
		t.Fatalf("next owner claimed %v, want %d at once", ids(next), other)
	}
	if n := a.table.count("release"); n != 2 {
		t.Fatalf("%d releases, want 2 (the failed one, then its retry)", n)
	}
}

// A unit dropped from memory without a release (its cluster's call point
// changed) still has a lease naming this router, which the renewal on the
// new call point renews: the router releases it, so that the unit passes
// on after its horizon instead of staying with nobody serving it.
func TestRenewalReleasesAUnitItDoesNotServe(t *testing.T) {
	a := newBed(t, Config{Router: "a", Addr: "a:1"})
	a.table.add("t", "s", 0, "", 0)
	a.claim(t, 1, spec("w"))
	a.m.SetClusters(map[string]Cluster{"c1": &tableCluster{a.table}}) // the same cluster at a new call point
	if n := len(a.m.Owners("c1")); n != 0 {
		t.Fatalf("%d owners on the new call point, want 0", n)
	}
	a.tick(time.Second)
	a.m.upkeep()
	row := a.table.ownerOf("t", "s")
	if !row.released || row.leaseUntil.After(a.clock.now()) {
		t.Fatalf("a unit nobody serves stayed leased to its router: %+v (now %v)", row, a.clock.now())
	}
	if n := a.table.count("release"); n != 1 {
		t.Fatalf("%d releases, want 1", n)
	}
	a.m.upkeep() // released: not renewed, not released again
	if n := a.table.count("release"); n != 1 {
		t.Fatalf("%d releases after the next renewal, want still 1", n)
	}
}

// A router set aside (fenced) hands its units over with their leases in
// the table, stops beating as a member, leaves, and takes no unit; the
// next router serves at once (no horizon to wait for); set back, the
// router takes units again.
func TestSetAsideHandsUnitsOver(t *testing.T) {
	a := newBed(t, Config{Router: "a", Addr: "a:1"})
	id := a.table.add("t", "s", 0, "", 0)
	other := a.table.add("t", "s", 0, "", 0)
	got := a.claim(t, 1, spec("w"))
	beats := a.table.count("beat a")
	a.m.SetAside(true)
	a.m.upkeep()
	if r := a.table.get(id, "s"); r.token != got[0].Token || !r.available.Equal(got[0].LeaseExpires) {
		t.Fatalf("lease not written out on stepping aside: %+v", r)
	}
	if n := a.table.count("beat a"); n != beats {
		t.Fatalf("a router set aside beat as a member (%d beats, %d before)", n, beats)
	}
	if a.table.count("leave a") == 0 {
		t.Fatal("a router set aside did not leave the members")
	}
	if o, _, err := a.m.Route(context.Background(), unit, true, 0); o != nil || !errors.Is(err, domain.ErrUnavailable) {
		t.Fatalf("a router set aside took a unit: %v, %v", o, err)
	}
	b := newRouter(t, a.clock, a.table, Config{Router: "b", Addr: "b:1"})
	if next := b.claim(t, 5, spec("w2")); !slices.Equal(ids(next), []uint64{other}) {
		t.Fatalf("next owner claimed %v, want %d at once", ids(next), other)
	}
	b.m.Stop()
	a.m.SetAside(false)
	if again := a.claim(t, 5, spec("w3")); len(again) != 0 {
		t.Fatalf("handed out %v while the written-out lease runs", ids(again))
	}
	a.tick(31 * time.Second)
	if again := a.claim(t, 5, spec("w3")); !slices.Equal(ids(again), []uint64{id, other}) {
		t.Fatalf("after the leases: %v, want %d and %d", ids(again), id, other)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// An unordered claim reads a few claims ahead: the next claims take from
// memory without a scan, in claim order and nothing twice; what a claim
// reserved and gave back is handed out next; what became claimable
// before the cursor (a higher priority) is seen once TopScanEvery passed;
// a vshard excluded for a cut-over is not handed out from what was read.
func TestReadAheadServesClaimsWithoutScans(t *testing.T) {
	ctx := context.Background()
	b := newBed(t, Config{})
	all := b.fill(60)
	var got []uint64
	for range readAhead {
		got = append(got, ids(b.claim(t, 10, spec("w")))...)
	}
	if !slices.Equal(got, all[:40]) {
		t.Fatalf("claimed %v, want %v", got, all[:40])
	}
	if n := b.table.count("scan"); n != 1 {
		t.Fatalf("%d scans for %d claims, want 1", n, readAhead)
	}

	o := b.owner(t)
	cs, err := o.Reserve(ctx, 5, spec("w"))
	if err != nil || len(cs) != 5 {
		t.Fatalf("reserve: %v, %v", cs, err)
	}
	o.Release(cs[2:]) // as a claim over several units gives back what it did not take
	if got, err := o.Take(ctx, cs[:2], spec("w"), 0, true, size); err != nil || !slices.Equal(ids(got), all[40:42]) {
		t.Fatalf("take: %v, %v", ids(got), err)
	}
	if got := ids(b.claim(t, 5, spec("w"))); !slices.Equal(got, all[42:47]) {
		t.Fatalf("after a give-back: %v, want %v", got, all[42:47])
	}

	urgent := b.table.add("t", "s", 9, "", 0)
	if got := ids(b.claim(t, 1, spec("w"))); !slices.Equal(got, all[47:48]) {
		t.Fatalf("before TopScanEvery: %v, want %v from what was read", got, all[47:48])
	}
	b.tick(100 * time.Millisecond)
	if got := ids(b.claim(t, 2, spec("w"))); !slices.Equal(got, []uint64{urgent, all[48]}) {
		t.Fatalf("after TopScanEvery: %v, want %v", got, []uint64{urgent, all[48]})
	}

	frozen := b.table.get(all[49], "s").msg.VShard
	sp := spec("w")
	sp.Exclude = []uint16{frozen}
	got = ids(b.claim(t, 20, sp))
	if slices.Contains(got, all[49]) || !slices.Equal(got, all[50:60]) {
		t.Fatalf("with vshard %d excluded: %v, want %v", frozen, got, all[50:60])
	}
	b.tick(100 * time.Millisecond) // behind the cursor: the next scan from the head finds it
	if got := ids(b.claim(t, 20, spec("w"))); !slices.Equal(got, all[49:50]) {
		t.Fatalf("once no longer excluded: %v, want %v", got, all[49:50])
	}
	seen := map[uint64]bool{}
	for _, id := range b.owner(t).leaseIDs() {
		if seen[id] {
			t.Fatalf("%d leased twice", id)
		}
		seen[id] = true
	}
	if len(seen) != 61 {
		t.Fatalf("%d leases in memory, want 61", len(seen))
	}
}

// An ordered subscription's claims read nothing ahead: whether a key's
// next may go is decided at each claim.
func TestOrderedClaimsReadNothingAhead(t *testing.T) {
	b := newBed(t, Config{})
	for i := range 20 {
		b.table.add("t", "s", 0, "k"+strconv.Itoa(i), 0)
	}
	sp := spec("w")
	sp.Ordered = true
	for range 4 {
		if got := b.claim(t, 5, sp); len(got) != 5 {
			t.Fatalf("claimed %d, want 5", len(got))
		}
	}
	if n := b.table.count("scan"); n != 4 {
		t.Fatalf("%d scans for 4 ordered claims, want 4", n)
	}
	o := b.owner(t)
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.ahead) != 0 {
		t.Fatalf("%d read ahead for an ordered subscription", len(o.ahead))
	}
}
