package ordersvc_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/client/inbox"
	"github.com/shardmq/shardmq/client/outbox"
	"github.com/shardmq/shardmq/examples/orders/ordersvc"
	"github.com/shardmq/shardmq/internal/routertest"
	"github.com/shardmq/shardmq/internal/testbed"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 2, Replicas: 1}, func(b *testbed.Bed) { bed = b }))
}

// faults decides at random whether a step crashes, and counts crashes per
// point.
type faults struct {
	mu     sync.Mutex
	rng    *rand.Rand
	counts map[string]*atomic.Int64
}

func newFaults(seed uint64) *faults {
	return &faults{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), counts: map[string]*atomic.Int64{}}
}

func (f *faults) point(name string, p float64, crash error) func() error {
	f.mu.Lock()
	n := &atomic.Int64{}
	f.counts[name] = n
	f.mu.Unlock()
	return func() error {
		f.mu.Lock()
		hit := f.rng.Float64() < p
		f.mu.Unlock()
		if hit {
			n.Add(1)
			return crash
		}
		return nil
	}
}

func (f *faults) intn(n int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.IntN(n)
}

// countingPublisher counts the router's duplicate answers: re-publishes
// of rows whose relay crashed between publish and mark.
type countingPublisher struct {
	p          *client.Producer
	duplicates *atomic.Int64
}

func (c countingPublisher) SendMany(ctx context.Context, topic string, msgs []client.Message) []client.SendResult {
	out := c.p.SendMany(ctx, topic, msgs)
	for _, r := range out {
		if r.Err == nil && r.Status == client.StatusDuplicate {
			c.duplicates.Add(1)
		}
	}
	return out
}

func openDB(t *testing.T, prefix string) *sql.DB {
	t.Helper()
	name := testbed.TestDatabase(t, bed, prefix)
	db, err := sql.Open("mysql", bed.Clusters[0].Primary.DSN(name)+"?interpolateParams=true")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(32)
	t.Cleanup(func() { db.Close() })
	return db
}

// TestCrashesYieldOnePointsChangePerOrder places 2,000 orders while relays
// and consumers crash at random at every point where a crash matters —
// after the business commit and before the publish, between the publish
// and the mark, after the inbox claim, between the handler's commit and
// the ack — and are killed and replaced every few hundred milliseconds
// (their contexts cancelled mid-step). Every order must yield exactly one
// points change.
func TestCrashesYieldOnePointsChangePerOrder(t *testing.T) {
	testbed.Need(t)
	const orders = 2000
	r := routertest.Start(t, bed, routertest.Options{})
	ordersDB, pointsDB := openDB(t, "t_orders_"), openDB(t, "t_points_")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := ordersvc.MigrateOrders(ctx, ordersDB); err != nil {
		t.Fatal(err)
	}
	if err := ordersvc.MigratePoints(ctx, pointsDB); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil)) // crashes make warnings by the hundred
	c, err := client.New(client.Config{URL: r.URL, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Every lapse counts as an attempt: allow many before a delivery dies.
	if err := c.PutSubscription(ctx, ordersvc.Topic, ordersvc.Subscription, client.Subscription{MaxAttempts: 1000,
		Backoff: &client.Backoff{InitialMS: 10, MaxMS: 200, Multiplier: 2}}); err != nil {
		t.Fatal(err)
	}

	seed := uint64(time.Now().UnixNano())
	t.Logf("fault seed %d", seed)
	f := newFaults(seed)
	beforePublish := f.point("relay: after the business commit, before publish", 0.15, outbox.ErrCrash)
	beforeMark := f.point("relay: between publish and mark", 0.15, outbox.ErrCrash)
	afterClaim := f.point("consumer: after the inbox claim, before the business commit", 0.02, inbox.ErrCrash)
	afterCommit := f.point("consumer: between the handler's commit and the ack", 0.04, inbox.ErrCrash)
	var republished atomic.Int64
	var kills atomic.Int64

	// Relays and consumers, each replaced by a new one ("process") at
	// random moments; the old one is stopped mid-step.
	newRelay := func(i int) (stop func()) {
		p, err := c.NewProducer(client.ProducerConfig{MaxAttempts: 3, InitialBackoff: 20 * time.Millisecond})
		if err != nil {
			t.Error(err)
			return func() {}
		}
		rl := outbox.NewRelay(ordersDB, countingPublisher{p, &republished}, outbox.RelayConfig{
			Name: fmt.Sprintf("relay-%d", i), Batch: 20, Logger: quiet, Lease: 400 * time.Millisecond, Idle: 20 * time.Millisecond,
			MaxAttempts: 1000, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
			Faults: outbox.FaultHooks{BeforePublish: beforePublish, BeforeMark: beforeMark}})
		rctx, kill := context.WithCancel(ctx)
		rl.Start(rctx)
		// A kill: the cycle in progress is cancelled mid-step.
		return func() { kill(); rl.Stop(); p.Close(context.Background()) }
	}
	newConsumer := func(i int) (stop func()) {
		in := inbox.New(pointsDB, inbox.Config{Name: fmt.Sprintf("points-%d", i), Lock: 600 * time.Millisecond, Logger: quiet,
			Faults: inbox.FaultHooks{AfterClaim: afterClaim, AfterCommit: afterCommit}})
		cn, err := c.NewConsumer(client.ConsumerConfig{Topic: ordersvc.Topic, Subscription: ordersvc.Subscription,
			Name: fmt.Sprintf("points-%d", i), Concurrency: 8, Visibility: 600 * time.Millisecond, Wait: 200 * time.Millisecond},
			in.Handler(ordersvc.ApplyAward))
		if err != nil {
			t.Error(err)
			return func() {}
		}
		if err := cn.Start(ctx); err != nil {
			t.Error(err)
		}
		return func() {
			// A kill: no grace, running handlers are cancelled mid-step.
			dead, cancel := context.WithCancel(context.Background())
			cancel()
			cn.Stop(dead)
		}
	}
	supervise := func(start func(int) func(), n int, done <-chan struct{}, wg *sync.WaitGroup) {
		defer wg.Done()
		stops := make([]func(), n)
		next := 0
		for i := range stops {
			stops[i] = start(next)
			next++
		}
		defer func() {
			for _, s := range stops {
				s()
			}
		}()
		for {
			t := time.NewTimer(time.Duration(200+f.intn(500)) * time.Millisecond)
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
			}
			i := f.intn(n)
			stops[i]()
			kills.Add(1)
			stops[i] = start(next)
			next++
		}
	}
	stopWorkers := make(chan struct{})
	var workers sync.WaitGroup
	workers.Add(2)
	go supervise(newRelay, 2, stopWorkers, &workers)
	go supervise(newConsumer, 2, stopWorkers, &workers)

	// The order service: 8 clients placing orders.
	var placed sync.WaitGroup
	var next atomic.Int64
	for range 8 {
		placed.Go(func() {
			for ctx.Err() == nil {
				n := next.Add(1)
				if n > orders {
					return
				}
				if _, err := ordersvc.PlaceOrder(ctx, ordersDB, n%97, 100+n); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	placed.Wait()

	var tally ordersvc.Tally
	for {
		tally, err = ordersvc.Count(ctx, ordersDB, pointsDB)
		if err != nil {
			t.Fatal(err)
		}
		if tally.Missing == 0 || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling the databases for the end of the run
	}
	close(stopWorkers)
	workers.Wait()

	// Rows whose relay crashed between publish and mark are still pending:
	// a healthy relay publishes them again (the router answers duplicate,
	// no second delivery) and marks them; then nothing may have changed.
	p, err := c.NewProducer(client.ProducerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	final := outbox.NewRelay(ordersDB, countingPublisher{p, &republished}, outbox.RelayConfig{Name: "final", Logger: quiet})
	for {
		if _, err := final.UnlockExpired(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := final.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		counts, err := outbox.Count(ctx, ordersDB)
		if err != nil {
			t.Fatal(err)
		}
		if counts.Pending == 0 || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond) // waiting for the crashed relays' leases to expire
	}
	// What is left on the subscription (deliveries of crashed consumers,
	// come back after their lease) must all be duplicates now.
	clean := inbox.New(pointsDB, inbox.Config{Name: "drain", Logger: quiet})
	for ctx.Err() == nil {
		ds, err := c.Claim(ctx, client.ClaimRequest{Topic: ordersvc.Topic, Subscription: ordersvc.Subscription, Max: 100,
			Visibility: 10 * time.Second, Wait: 1500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			break // longer than any lease of the run: nothing is left
		}
		for _, d := range ds {
			o, err := clean.Handle(ctx, d, func(ctx context.Context, tx *sql.Tx) error { return ordersvc.ApplyAward(ctx, d, tx) })
			if err != nil || o != inbox.Duplicate {
				t.Errorf("left-over delivery %s: outcome %d, %v; want a duplicate", d.Key, o, err)
			}
		}
	}
	tally, err = ordersvc.Count(context.Background(), ordersDB, pointsDB)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(tally)
	for name, n := range f.counts {
		t.Logf("crashes %s: %d", name, n.Load())
		if n.Load() == 0 {
			t.Errorf("no crash injected at %q: the run proved nothing there", name)
		}
	}
	t.Logf("relays and consumers killed and replaced: %d; re-publishes answered duplicate: %d", kills.Load(), republished.Load())
	if tally.Orders != orders || tally.Changes != orders || tally.Duplicates != 0 || tally.Missing != 0 {
		t.Fatalf("%v, missing %d: want %d orders with exactly one points change each", tally, tally.Missing, orders)
	}
	if republished.Load() == 0 {
		t.Error("no re-publish was answered duplicate: the publish-then-crash path was not exercised")
	}
	counts, err := outbox.Count(context.Background(), ordersDB)
	if err != nil {
		t.Fatal(err)
	}
	if counts.Published != orders || counts.Dead != 0 {
		t.Errorf("outbox %+v, want every row published", counts)
	}
}
