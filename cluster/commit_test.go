package cluster

import (
	"context"
	"errors"
	"github.com/shardmq/shardmq/cluster/clustertest"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/store"
)

func item(id uint64, key string) store.ProduceItem {
	return store.ProduceItem{
		Msg:           &store.Message{ID: id, Topic: "t", Key: key, PayloadJSON: true, Payload: []byte("1"), CreatedAt: idgen.Time(id)},
		Hash:          make([]byte, 16),
		AvailableAt:   time.Now(),
		Subscriptions: []string{"default"},
	}
}

// One item that the database refuses (here: an id already taken) fails
// alone; its neighbours in the same group commit are stored, and nothing of
// the refused item is.
func TestCommitterIsolatesAFailingItem(t *testing.T) {
	t.Parallel()
	st := clustertest.NewStore()
	ids := idgen.New(nil)
	c := newCommitter("c1", direct{st}, CommitConfig{Committers: 1}.WithDefaults())
	defer c.Stop()
	a := ids.Next()
	items := []store.ProduceItem{item(a, "a"), item(ids.Next(), "b"), item(a, "clash"), item(ids.Next(), "d")}
	resp := c.submit(context.Background(), items)
	for i, want := range []bool{true, true, false, true} {
		ok := resp.Errs[i] == nil && resp.Results[i].Status == store.Created
		if ok != want {
			t.Errorf("item %d (%s): created=%v err=%v, want created=%v", i, items[i].Msg.Key, ok, resp.Errs[i], want)
		}
	}
	if !errors.Is(resp.Errs[2], clustertest.ErrTakenID) {
		t.Errorf("the failing item's error: %v", resp.Errs[2])
	}
	if c.splits.Load() == 0 {
		t.Fatal("the batch was not split")
	}
	if _, ok := st.Keys["t\x00clash"]; ok {
		t.Fatal("the failing item's key was registered: half-applied")
	}
}

// A batch that fails because the cluster is unavailable is not split: every
// item gets the error at once, in one transaction's time.
func TestCommitterDoesNotSplitOnAnOutage(t *testing.T) {
	t.Parallel()
	fc := newFakeCaller()
	fc.down.Store(true)
	c := newCommitter("c1", fc, CommitConfig{Committers: 1}.WithDefaults())
	defer c.Stop()
	ids := idgen.New(nil)
	resp := c.submit(context.Background(), []store.ProduceItem{item(ids.Next(), "a"), item(ids.Next(), "b")})
	for i, err := range resp.Errs {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("item %d: %v, want unavailable", i, err)
		}
	}
	if c.splits.Load() != 0 || fc.calls(OpProduce) != 1 {
		t.Fatalf("splits %d, produce calls %d: an outage must not be split", c.splits.Load(), fc.calls(OpProduce))
	}
}

// A stopped committer still answers what was queued, and refuses new work.
func TestCommitterStopAnswersEveryone(t *testing.T) {
	t.Parallel()
	st := clustertest.NewStore()
	ids := idgen.New(nil)
	c := newCommitter("c1", direct{st}, CommitConfig{Committers: 2}.WithDefaults())
	resp := c.submit(context.Background(), []store.ProduceItem{item(ids.Next(), "x")})
	if resp.Errs[0] != nil {
		t.Fatal(resp.Errs[0])
	}
	// A request queued behind a held transaction is answered by the
	// drain on stop.
	hold, held := make(chan struct{}), make(chan struct{}, 4)
	st.Gate = func(string) { held <- struct{}{}; <-hold }
	first := make(chan Produced, 1)
	go func() { first <- c.submit(context.Background(), []store.ProduceItem{item(ids.Next(), "y")}) }()
	<-held
	queued := make(chan Produced, 1)
	go func() { queued <- c.submit(context.Background(), []store.ProduceItem{item(ids.Next(), "z")}) }()
	testtime.Until(t, "one request queued", func() bool { n, _ := c.batch.Queued(); return n == 1 })
	stopped := make(chan struct{})
	go func() { c.Stop(); close(stopped) }()
	close(hold)
	if r := <-first; r.Errs[0] != nil {
		t.Fatalf("held request: %v", r.Errs[0])
	}
	if r := <-queued; r.Errs[0] != nil {
		t.Fatalf("queued request not committed by the drain: %v", r.Errs[0])
	}
	<-stopped
	c.Stop() // twice is fine
	resp = c.submit(context.Background(), []store.ProduceItem{item(ids.Next(), "w")})
	if resp.Errs[0] == nil {
		t.Fatal("a stopped committer accepted work")
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
// wait. The linger is a minute and a batch is full at 8 messages: a
// lingering batch is filled to start it, so no step of the test depends
// on how fast a busy machine runs the goroutines that join it, and a
// lone request that waited for the linger would take a minute, not the
// 30 s allowed.
func TestCommitterLingersOnlyWhenBusy(t *testing.T) {
	t.Parallel()
	g := &gateStore{started: make(chan int, 16), release: make(chan struct{}), quit: make(chan struct{})}
	c := newCommitter("c1", direct{g}, CommitConfig{Committers: 1, Linger: time.Minute, LingerAfter: 4, MaxMessages: 8}.WithDefaults())
	// Cleanups run last-in first-out: the gate opens before stop waits.
	t.Cleanup(c.Stop)
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
	startsAtOnce := func(want int) {
		t.Helper()
		select {
		case n := <-g.started:
			if n != want {
				t.Fatalf("batch of %d items, want %d", n, want)
			}
		case <-time.After(30 * time.Second): // half the linger
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
	testtime.Until(t, "5 requests are queued", func() bool { n, _ := c.batch.Queued(); return n == 5 })
	finish(1)
	// The next batch begins with those 5 and lingers: 3 more requests
	// sent now join it instead of waiting for a transaction of their own
	// (and fill it: it starts).
	submit(3)
	if n := <-g.started; n != 8 {
		t.Fatalf("busy batch: %d items, want the 5 queued and the 3 sent while it lingered", n)
	}
	finish(8)
	// The batch after a backlog lingers too, even when it begins alone:
	// requests sent while it lingers join it.
	testtime.Until(t, "the busy batch is over", func() bool { return !c.batch.Busy() })
	first := make(chan struct{})
	go func() {
		c.submit(ctx, []store.ProduceItem{item(100, "k")})
		close(first)
	}()
	testtime.Until(t, "the request is queued", func() bool { n, _ := c.batch.Queued(); return n == 1 })
	select {
	case n := <-g.started:
		t.Fatalf("the batch after the busy one started at once with %d items: it did not linger", n)
	case <-time.After(300 * time.Millisecond): // lingering (for a minute)
	}
	submit(7)
	if n := <-g.started; n != 8 {
		t.Fatalf("batch after the busy one: %d items, want 8 (it lingered for the 7 sent after it began)", n)
	}
	finish(7)
	<-first
	// That batch began without a backlog: quiet again.
	submit(1)
	startsAtOnce(1)
	finish(1)
}
