package broker

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/store"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 1}, func(b *testbed.Bed) { bed = b }))
}

func openStore(t *testing.T) *store.Store {
	t.Helper()
	ctx := context.Background()
	name := testbed.TestDatabase(t, bed, "t_broker_")
	st, err := store.Open(ctx, bed.Clusters[0].Primary.DSN(name), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	return st
}

func item(id uint64, key string) store.ProduceItem {
	return store.ProduceItem{
		Msg:           &store.Message{ID: id, Topic: "t", Key: key, PayloadJSON: true, Payload: []byte("1"), CreatedAt: idgen.Time(id)},
		Hash:          PayloadHash([]byte("1")),
		AvailableAt:   time.Now(),
		Subscriptions: []string{"default"},
	}
}

// One item that the database refuses (here: an id already taken) fails
// alone; its neighbours in the same group commit are stored.
func TestCommitterIsolatesAFailingItem(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	ids := idgen.New(nil)
	c := newCommitter("c1", direct{st}, CommitConfig{Committers: 1}.withDefaults())
	defer c.stop()
	a := ids.Next()
	items := []store.ProduceItem{item(a, "a"), item(ids.Next(), "b"), item(a, "clash"), item(ids.Next(), "d")}
	resp := c.submit(context.Background(), items)
	for i, want := range []bool{true, true, false, true} {
		ok := resp.errs[i] == nil && resp.res[i].Status == store.Created
		if ok != want {
			t.Errorf("item %d (%s): created=%v err=%v, want created=%v", i, items[i].Msg.Key, ok, resp.errs[i], want)
		}
	}
	if c.splits.Load() == 0 {
		t.Fatal("the batch was not split")
	}
	var n int
	st.DB().QueryRow("SELECT COUNT(*) FROM message_key WHERE msg_key = 'clash'").Scan(&n)
	if n != 0 {
		t.Fatal("the failing item's key was registered: half-applied")
	}
}

// A stopped committer still answers what was queued, and refuses new work.
func TestCommitterStopAnswersEveryone(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	ids := idgen.New(nil)
	c := newCommitter("c1", direct{st}, CommitConfig{Committers: 2}.withDefaults())
	resp := c.submit(context.Background(), []store.ProduceItem{item(ids.Next(), "x")})
	if resp.errs[0] != nil {
		t.Fatal(resp.errs[0])
	}
	c.stop()
	c.stop() // twice is fine
	resp = c.submit(context.Background(), []store.ProduceItem{item(ids.Next(), "y")})
	if resp.errs[0] == nil {
		t.Fatal("a stopped committer accepted work")
	}
}

func BenchmarkFingerprintKey(b *testing.B) {
	p := []byte(`{"order":42,"amount":"19.90","currency":"EUR"}`)
	for i := 0; i < b.N; i++ {
		FingerprintKey("orders", "tx-9", p)
	}
}

func BenchmarkReceiptRoundTrip(b *testing.B) {
	r := Receipt{VShard: 517, Topic: "orders"}
	r.MessageID, r.Token, r.Subscription = 385432089608519680, 0xdeadbeef, "billing"
	for i := 0; i < b.N; i++ {
		if _, err := DecodeReceipt(r.Encode()); err != nil {
			b.Fatal(err)
		}
	}
}

func TestReceiptRoundTripAndTampering(t *testing.T) {
	t.Parallel()
	r := Receipt{VShard: 1023, Topic: "orders.v2"}
	r.MessageID, r.Token, r.Subscription, r.Ordered = 385432089608519680, 0xdeadbeef, "billing", true
	got, err := DecodeReceipt(r.Encode())
	if err != nil || got != r {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, r)
	}
	for _, bad := range []string{"", "AQ", "!!!", r.Encode()[:20], "AgA" + r.Encode()[3:]} {
		if _, err := DecodeReceipt(bad); err == nil {
			t.Errorf("DecodeReceipt(%q) accepted", bad)
		}
	}
}

// gateStore is a Store whose Produce blocks until released and records
// each batch's size; every other method is left unimplemented.
type gateStore struct {
	Store
	started chan int      // a batch of n items began
	release chan struct{} // lets one batch finish
	quit    chan struct{} // closed at cleanup: lets every batch finish
}

func (g *gateStore) Produce(ctx context.Context, items []store.ProduceItem) ([]store.ProduceResult, error) {
	g.started <- len(items)
	select {
	case <-g.release:
	case <-g.quit:
	}
	return make([]store.ProduceResult, len(items)), nil
}

// A batch that begins with LingerAfter requests queued, and the batch
// after it, wait up to Linger for more, so requests that arrive meanwhile
// share their transaction; on a quiet cluster a lone request does not
// wait.
func TestCommitterLingersOnlyWhenBusy(t *testing.T) {
	t.Parallel()
	g := &gateStore{started: make(chan int, 16), release: make(chan struct{}), quit: make(chan struct{})}
	c := newCommitter("c1", direct{g}, CommitConfig{Committers: 1, Linger: time.Second, LingerAfter: 4}.withDefaults())
	// Cleanups run last-in first-out: the gate opens before stop waits.
	t.Cleanup(c.stop)
	t.Cleanup(func() { close(g.quit) })
	ctx := context.Background()
	done := make(chan struct{}, 32)
	submit := func(n int) {
		for i := 0; i < n; i++ {
			go func() {
				c.submit(ctx, []store.ProduceItem{item(uint64(i+1), "k")})
				done <- struct{}{}
			}()
		}
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
		}
	}
	startsAtOnce := func(want int) {
		t.Helper()
		select {
		case n := <-g.started:
			if n != want {
				t.Fatalf("batch of %d items, want %d", n, want)
			}
		case <-time.After(500 * time.Millisecond): // half the linger
			t.Fatal("a lone request on a quiet cluster waited for the linger")
		}
	}
	finish := func(requests int) {
		g.release <- struct{}{}
		for i := 0; i < requests; i++ {
			<-done
		}
	}

	// Quiet: a lone request starts at once.
	submit(1)
	startsAtOnce(1)
	// While it runs, 5 requests queue up (≥ LingerAfter).
	submit(5)
	until("5 requests are queued", func() bool { return len(c.in) == 5 })
	finish(1)
	// The next batch begins with those 5 and lingers: 3 more requests
	// sent now join it instead of waiting for a transaction of their own.
	submit(3)
	if n := <-g.started; n != 8 {
		t.Fatalf("busy batch: %d items, want the 5 queued and the 3 sent while it lingered", n)
	}
	finish(8)
	// The batch after a backlog lingers too, even when it begins alone:
	// a request sent once the first is taken joins it.
	first := &produceReq{items: []store.ProduceItem{item(100, "k")}, done: make(chan produceResp, 1)}
	c.queued.Add(1) // as submit does
	c.in <- first
	until("the request is taken", func() bool { return len(c.in) == 0 })
	select {
	case n := <-g.started:
		t.Fatalf("the batch after the busy one started at once with %d items: it did not linger", n)
	case <-time.After(300 * time.Millisecond): // lingering (for 1 s)
	}
	submit(1)
	if n := <-g.started; n != 2 {
		t.Fatalf("batch after the busy one: %d items, want 2 (it lingered)", n)
	}
	finish(1)
	<-first.done
	// That batch began without a backlog: quiet again.
	submit(1)
	startsAtOnce(1)
	finish(1)
}

// An item the database refuses for its own values (headers one byte longer
// than their BLOB column) fails alone with store.ErrInvalidData, which
// Produce answers "rejected", never "unavailable": a retry cannot succeed.
func TestCommitterKeepsInvalidDataApart(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	ids := idgen.New(nil)
	c := newCommitter("c1", direct{st}, CommitConfig{Committers: 1}.withDefaults())
	defer c.stop()
	bad := item(ids.Next(), "too-long-headers")
	bad.Msg.Headers = make([]byte, store.MaxHeadersBytes+1)
	items := []store.ProduceItem{item(ids.Next(), "a"), bad, item(ids.Next(), "c")}
	resp := c.submit(context.Background(), items)
	if resp.errs[0] != nil || resp.errs[2] != nil {
		t.Fatalf("neighbours failed: %v, %v", resp.errs[0], resp.errs[2])
	}
	if err := resp.errs[1]; !errors.Is(err, store.ErrInvalidData) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("over-long headers: %v, want store.ErrInvalidData", err)
	}
	fits := item(ids.Next(), "headers-filling-the-column")
	fits.Msg.Headers = make([]byte, store.MaxHeadersBytes)
	if resp := c.submit(context.Background(), []store.ProduceItem{fits}); resp.errs[0] != nil {
		t.Fatalf("headers of exactly the column's size: %v", resp.errs[0])
	}
}

// direct is a Cluster that runs every call on s as it is.
type direct struct{ s Store }

func (d direct) Do(ctx context.Context, _ string, fn func(context.Context, Store) error) error {
	return fn(ctx, d.s)
}
