package broker

import (
	"context"
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
	c := newCommitter("c1", st, CommitConfig{Committers: 1}.withDefaults())
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
	c := newCommitter("c1", st, CommitConfig{Committers: 2}.withDefaults())
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

// gateShard is a Shard whose Produce blocks until released and records
// each batch's size; every other method is left unimplemented.
type gateShard struct {
	Shard
	started chan int      // a batch of n items began
	release chan struct{} // lets one batch finish
}

func (g *gateShard) Produce(ctx context.Context, items []store.ProduceItem) ([]store.ProduceResult, error) {
	g.started <- len(items)
	<-g.release
	return make([]store.ProduceResult, len(items)), nil
}

// A batch that begins with LingerAfter requests queued (or follows a batch
// of that many) waits up to Linger for more, so requests that arrive just
// after it began share its transaction; on a quiet cluster a lone request
// does not wait.
func TestCommitterLingersOnlyWhenBusy(t *testing.T) {
	t.Parallel()
	g := &gateShard{started: make(chan int, 16), release: make(chan struct{})}
	c := newCommitter("c1", g, CommitConfig{Committers: 1, Linger: 300 * time.Millisecond, LingerAfter: 4}.withDefaults())
	defer c.stop()
	ctx := context.Background()
	submit := func(n int, done chan<- struct{}) {
		for i := 0; i < n; i++ {
			go func() {
				c.submit(ctx, []store.ProduceItem{item(uint64(i+1), "k")})
				done <- struct{}{}
			}()
		}
	}
	done := make(chan struct{}, 32)

	// A lone request starts at once, although Linger is long.
	submit(1, done)
	if n := <-g.started; n != 1 {
		t.Fatalf("first batch: %d items, want 1", n)
	}
	// While it runs, 5 requests queue up (≥ LingerAfter).
	submit(5, done)
	for c.queued.Load() < 5 {
		time.Sleep(time.Millisecond)
	}
	g.release <- struct{}{}
	<-done
	// The next batch begins with those 5 and lingers: 3 more requests
	// sent now join it instead of waiting for a transaction of their own.
	submit(3, done)
	if n := <-g.started; n != 8 {
		t.Fatalf("busy batch: %d items, want the 5 queued and the 3 sent while it lingered", n)
	}
	g.release <- struct{}{}
	for i := 0; i < 8; i++ {
		<-done
	}
	// The load stops: the first lone request still lingers once (the last
	// batch was large, its callers may be on their way back) ...
	submit(1, done)
	if n := <-g.started; n != 1 {
		t.Fatalf("batch after the busy one: %d items, want 1", n)
	}
	g.release <- struct{}{}
	<-done
	// ... and the next one starts at once again.
	submit(1, done)
	select {
	case n := <-g.started:
		if n != 1 {
			t.Fatalf("quiet batch: %d items, want 1", n)
		}
	case <-time.After(250 * time.Millisecond):
		t.Fatal("a lone request on a quiet cluster waited for the linger")
	}
	g.release <- struct{}{}
	<-done
}
