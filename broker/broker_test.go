package broker

import (
	"context"
	"errors"
	"fmt"
	"github.com/shardmq/shardmq/cluster"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardmq/shardmq/delivery"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

func shardOf(key string) shard.ID { return shard.Of(shard.Key("", key)) }

// keysOn returns n keys whose vshards c1 (first) and c2 serve.
func keysOn(n int) (c1, c2 []string) {
	for i := 0; len(c1) < n || len(c2) < n; i++ {
		k := fmt.Sprintf("k-%d", i)
		if shardOf(k) < 512 {
			if len(c1) < n {
				c1 = append(c1, k)
			}
		} else if len(c2) < n {
			c2 = append(c2, k)
		}
	}
	return c1, c2
}

func msgs(keys ...string) []Message {
	out := make([]Message, len(keys))
	for i, k := range keys {
		out[i] = Message{Key: k, Payload: []byte(`"` + k + `"`), PayloadJSON: true}
	}
	return out
}

// Each item goes to the cluster serving its vshard, one group commit per
// cluster, and is answered in request order; a known key is answered from
// the recent-keys cache without a round trip.
func TestProduceRoutesEachItemToItsCluster(t *testing.T) {
	t.Parallel()
	f := setup(t, Config{})
	ctx := context.Background()
	on1, on2 := keysOn(3)
	keys := []string{on1[0], on2[0], on1[1], on2[1], on1[2], on2[2]}
	res, err := f.b.Produce(ctx, "t", msgs(keys...), DurabilityPrimary)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != domain.ProduceCreated || r.Key != keys[i] || r.VShard != shardOf(keys[i]) || r.ID == 0 {
			t.Errorf("item %d: %+v", i, r)
		}
		if _, ok := f.cluster(keys[i]).st.Keys["t\x00"+keys[i]]; !ok {
			t.Errorf("key %s is not on the cluster serving vshard %d", keys[i], r.VShard)
		}
	}
	if f.c1.calls(cluster.OpProduce) != 1 || f.c2.calls(cluster.OpProduce) != 1 {
		t.Fatalf("produce calls: c1 %d, c2 %d; want one group commit each", f.c1.calls(cluster.OpProduce), f.c2.calls(cluster.OpProduce))
	}
	// Sent again: duplicates, and a changed payload a conflict, all from
	// the cache.
	again := msgs(on1[0], on2[0])
	again[1].Payload = []byte(`"other"`)
	res2, err := f.b.Produce(ctx, "t", again, DurabilityPrimary)
	if err != nil {
		t.Fatal(err)
	}
	if res2[0].Status != "duplicate" || res2[0].ID != res[0].ID || res2[1].Status != "conflict" || res2[1].ID != res[1].ID {
		t.Fatalf("re-sent: %+v", res2)
	}
	if f.c1.calls(cluster.OpProduce) != 1 || f.c2.calls(cluster.OpProduce) != 1 {
		t.Fatal("the recent-keys cache did not answer the re-sent keys")
	}
}

// A cluster that is down makes only its own items unavailable; an item the
// database refuses for its values is rejected, never unavailable.
func TestProduceFailureStaysWithItsItems(t *testing.T) {
	t.Parallel()
	f := setup(t, Config{})
	f.c2.down.Store(true)
	on1, on2 := keysOn(2)
	in := msgs(on1[0], on2[0], on1[1])
	in[2].Headers = []byte(`{"h":"` + strings.Repeat("x", store.MaxHeadersBytes) + `"}`)
	res, err := f.b.Produce(context.Background(), "t", in, DurabilityPrimary)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"created", "unavailable", "rejected"}
	for i, r := range res {
		if string(r.Status) != want[i] {
			t.Errorf("item %d: %s (%v), want %s", i, r.Status, r.Err, want[i])
		}
	}
	if !errors.Is(res[1].Err, store.ErrUnavailable) || !errors.Is(res[2].Err, store.ErrInvalidData) {
		t.Fatalf("errors: %v; %v", res[1].Err, res[2].Err)
	}
}

// Produce requests that arrive while a cluster's transaction runs are
// committed together in its next transaction.
func TestProduceGroupCommitsConcurrentRequests(t *testing.T) {
	t.Parallel()
	f := setupWith(t, Config{}, cluster.Config{Commit: cluster.CommitConfig{Committers: 1, Linger: -1}})
	on1, _ := keysOn(9)
	hold, held := make(chan struct{}), make(chan struct{}, 16)
	f.c1.st.Gate = func(string) { held <- struct{}{}; <-hold }
	ctx := context.Background()
	var wg sync.WaitGroup
	produce := func(key string) {
		wg.Go(func() {
			res, err := f.b.Produce(ctx, "t", msgs(key), DurabilityPrimary)
			if err != nil || res[0].Status != "created" {
				t.Errorf("%s: %+v %v", key, res, err)
			}
		})
	}
	produce(on1[0])
	<-held // the first transaction runs
	for _, k := range on1[1:] {
		produce(k)
	}
	// All 8 wait in the committer's queue.
	testtime.Until(t, "eight requests queued, none committed", func() bool { return f.b.CommitStats()["c1"].Transactions == 0 && queued(f.b, "c1") == 8 })
	close(hold)
	wg.Wait()
	f.c1.st.Mu.Lock()
	batches := append([]int(nil), f.c1.st.Batches...)
	f.c1.st.Mu.Unlock()
	if len(batches) != 2 || batches[0] != 1 || batches[1] != 8 {
		t.Fatalf("transactions carried %v items, want [1 8]", batches)
	}
	if s := f.b.CommitStats()["c1"]; s.Transactions != 2 || s.Messages != 9 {
		t.Fatalf("commit stats %+v", s)
	}
}

// queued is how many messages wait for cluster's committers.
func queued(b *Broker, cluster string) int64 {
	return b.CommitStats()[cluster].Queued
}

// Consumers of one subscription that claim at the same time get
// deliveries of their own, each under its own claim token, and the unit's
// owner scans the table one claim at a time.
func TestConcurrentClaimsNeverShareADelivery(t *testing.T) {
	t.Parallel()
	f := setup(t, Config{})
	ctx := context.Background()
	on1, _ := keysOn(10)
	if _, err := f.b.Produce(ctx, "t", msgs(on1...), DurabilityPrimary); err != nil {
		t.Fatal(err)
	}
	f.c2.down.Store(true) // every claim goes to c1 alone
	var scanning, most atomic.Int32
	f.c1.st.Gate = func(op string) {
		if op == cluster.OpClaim {
			n := scanning.Add(1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(time.Millisecond)
			scanning.Add(-1)
		}
	}
	const consumers = 5
	got := make(chan []Delivery, consumers)
	for i := 0; i < consumers; i++ {
		go func() {
			ds, err := f.b.Claim(ctx, ClaimRequest{Topic: "t", Subscription: "s", Consumer: fmt.Sprintf("c%d", i), Max: 2, Lease: time.Minute})
			if err != nil {
				t.Error(err)
			}
			got <- ds
		}()
	}
	seen := map[uint64]string{}
	tokens := map[uint64]bool{}
	for i := 0; i < consumers; i++ {
		ds := <-got
		if len(ds) != 2 {
			t.Fatalf("a consumer got %d deliveries, want 2", len(ds))
		}
		for _, d := range ds {
			r, err := f.b.DecodeReceipt(d.Receipt)
			if err != nil {
				t.Fatal(err)
			}
			if other, ok := seen[d.Message.ID]; ok {
				t.Fatalf("message %d delivered twice (%s and %s)", d.Message.ID, other, d.Receipt)
			}
			seen[d.Message.ID] = d.Receipt
			if r.Token != d.Token || d.Attempt != 1 {
				t.Fatalf("receipt token %x, lease %x, attempt %d", r.Token, d.Token, d.Attempt)
			}
			tokens[r.Token] = true
		}
	}
	if len(tokens) != consumers {
		t.Fatalf("%d claim tokens for %d claims", len(tokens), consumers)
	}
	if most.Load() != 1 {
		t.Fatalf("%d scans of the unit ran at once, want 1", most.Load())
	}
}

// Acks and nacks go to the cluster of each receipt's vshard, one call per
// cluster, and are answered per item in request order; a cluster that is
// down answers only its own items unavailable.
func TestAckAndNackGoToEachReceiptsCluster(t *testing.T) {
	t.Parallel()
	f := setup(t, Config{})
	ctx := context.Background()
	on1, on2 := keysOn(2)
	if _, err := f.b.Produce(ctx, "t", msgs(on1[0], on2[0], on1[1], on2[1]), DurabilityPrimary); err != nil {
		t.Fatal(err)
	}
	ds, err := f.b.Claim(ctx, ClaimRequest{Topic: "t", Subscription: "s", Consumer: "w", Max: 10, Lease: time.Minute})
	if err != nil || len(ds) != 4 {
		t.Fatalf("claimed %d: %v", len(ds), err)
	}
	byCluster := map[*fakeCluster][]Receipt{}
	for _, d := range ds {
		r, err := f.b.DecodeReceipt(d.Receipt)
		if err != nil {
			t.Fatal(err)
		}
		c := f.cluster(d.Message.Key)
		byCluster[c] = append(byCluster[c], r)
	}
	// Interleave the clusters' receipts: answers come back in this order.
	acks := []Receipt{byCluster[f.c1][0], byCluster[f.c2][0], byCluster[f.c1][1]}
	res := f.b.Ack(ctx, append(acks, acks[0]))
	for i, want := range []string{"ok", "ok", "ok", "not_found"} {
		if string(res[i].Status) != want {
			t.Errorf("ack %d: %s (%v), want %s", i, res[i].Status, res[i].Err, want)
		}
	}
	if f.c1.calls(delivery.OpFlush) != 1 || f.c2.calls(delivery.OpFlush) != 1 {
		t.Fatalf("flushes: c1 %d, c2 %d; want one per cluster", f.c1.calls(delivery.OpFlush), f.c2.calls(delivery.OpFlush))
	}
	f.c1.st.Mu.Lock()
	if len(f.c1.st.Acks) != 1 || len(f.c1.st.Acks[0]) != 2 {
		t.Errorf("c1 acked %v, want its 2 leases in one flush (the receipt given twice answered by the owner)", f.c1.st.Acks)
	}
	f.c1.st.Mu.Unlock()

	// c2's last lease is nacked while c2 is down; c1 has none left.
	f.c2.down.Store(true)
	nres := f.b.Nack(ctx, []NackItem{{Receipt: byCluster[f.c2][1], ErrorCode: "e"}, {Receipt: byCluster[f.c1][0], ErrorCode: "e"}})
	if nres[0].Status != "unavailable" || !errors.Is(nres[0].Err, store.ErrUnavailable) || nres[1].Status != "not_found" {
		t.Fatalf("nack: %+v", nres)
	}
	f.c2.down.Store(false)
	nres = f.b.Nack(ctx, []NackItem{{Receipt: byCluster[f.c2][1], ErrorCode: "e"}})
	if nres[0].Status != "retry_scheduled" || nres[0].NextAttemptAt.IsZero() {
		t.Fatalf("nack on c2: %+v", nres)
	}
	// Extend answers the lease lost: the nack ended it.
	if ext := f.b.Extend(ctx, []Receipt{byCluster[f.c2][1]}, time.Minute); ext[0].Status != "lease_lost" {
		t.Fatalf("extend after nack: %+v", ext)
	}
}

// A claim whose caller gave up while it was leasing gives back what it
// took at once: ready again, the attempt not counted.
func TestAbandonedClaimReleasesItsLeases(t *testing.T) {
	t.Parallel()
	f := setup(t, Config{})
	on1, _ := keysOn(3)
	if _, err := f.b.Produce(context.Background(), "t", msgs(on1...), DurabilityPrimary); err != nil {
		t.Fatal(err)
	}
	f.c2.down.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	f.c1.st.Gate = func(op string) {
		if op == cluster.OpClaim {
			cancel() // the caller leaves while its claim runs
		}
	}
	if ds, err := f.b.Claim(ctx, ClaimRequest{Topic: "t", Subscription: "s", Consumer: "w", Max: 3, Lease: time.Minute}); !errors.Is(err, context.Canceled) || ds != nil {
		t.Fatalf("abandoned claim: %v, %v", ds, err)
	}
	f.c1.st.Mu.Lock()
	f.c1.st.Gate = nil
	f.c1.st.Mu.Unlock()
	ds, err := f.b.Claim(context.Background(), ClaimRequest{Topic: "t", Subscription: "s", Consumer: "w2", Max: 3, Lease: time.Minute})
	if err != nil || len(ds) != 3 {
		t.Fatalf("claim after the abandoned one: %d, %v; want the 3 given back", len(ds), err)
	}
	for _, d := range ds {
		if d.Attempt != 1 {
			t.Fatalf("attempt %d after an abandoned claim, want 1", d.Attempt)
		}
	}
	if held, _ := f.b.Owners().InFlight(); held != 3 {
		t.Fatalf("%d leases held in memory, want 3", held)
	}
}

// A produce to a frozen vshard is held until the map serves it again, then
// committed on the cluster the new map names.
func TestProduceToFrozenVShardIsHeldUntilTheMove(t *testing.T) {
	t.Parallel()
	f := setup(t, Config{FrozenWait: time.Minute})
	on1, _ := keysOn(1)
	v := shardOf(on1[0])
	frozen, err := f.table.Load().With(2, []shard.ID{v}, "", routing.Frozen)
	if err != nil {
		t.Fatal(err)
	}
	f.table.Store(frozen)
	done := make(chan []ProduceResult, 1)
	go func() {
		res, _ := f.b.Produce(context.Background(), "t", msgs(on1[0]), DurabilityPrimary)
		done <- res
	}()
	testtime.Until(t, "the frozen item held", func() bool { return f.b.FrozenStats().Held == 1 })
	if f.c1.calls(cluster.OpProduce)+f.c2.calls(cluster.OpProduce) != 0 {
		t.Fatal("a held item reached a cluster")
	}
	moved, err := frozen.With(3, []shard.ID{v}, "c2", routing.Serving)
	if err != nil {
		t.Fatal(err)
	}
	f.table.Store(moved)
	res := <-done
	if res[0].Status != "created" || f.c2.calls(cluster.OpProduce) != 1 || f.c1.calls(cluster.OpProduce) != 0 {
		t.Fatalf("after the move: %+v; produce calls c1 %d, c2 %d", res, f.c1.calls(cluster.OpProduce), f.c2.calls(cluster.OpProduce))
	}
}

// After Close, claims are refused unavailable and produces are answered
// unavailable, never left waiting.
func TestClosedBrokerRefusesWork(t *testing.T) {
	t.Parallel()
	f := setup(t, Config{})
	f.b.Close()
	f.b.Close() // twice is fine
	on1, _ := keysOn(1)
	res, err := f.b.Produce(context.Background(), "t", msgs(on1[0]), DurabilityPrimary)
	if err != nil || res[0].Status != "unavailable" {
		t.Fatalf("produce after close: %+v %v", res, err)
	}
	if _, err := f.b.Claim(context.Background(), ClaimRequest{Topic: "t", Subscription: "s", Max: 1, Lease: time.Second}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("claim after close: %v", err)
	}
}

// A self-fenced router hands out no delivery, to its own clients or to
// the claims other routers forward to it as the owner of a unit: every ack
// through it is refused while it is fenced, so a lease handed out then
// could not be acked, and the delivery would come round again until it
// was dead (seen in the partition test of a router cut off from Consul:
// 40 messages dead-lettered whose every attempt was refused its ack).
func TestSelfFencedRefusesForwardedClaims(t *testing.T) {
	t.Parallel()
	f := setup(t, Config{})
	ctx := context.Background()
	on1, _ := keysOn(3)
	if _, err := f.b.Produce(ctx, "t", msgs(on1...), DurabilityPrimary); err != nil {
		t.Fatal(err)
	}
	req := ClaimRequest{Topic: "t", Subscription: "s", Consumer: "w", Max: 3, Lease: time.Minute}
	f.b.SetSelfFenced(true)
	if ds, err := f.b.ClaimCluster(ctx, "c1", req); !errors.Is(err, ErrUnavailable) || len(ds) != 0 {
		t.Fatalf("forwarded claim on a self-fenced router: %d deliveries, %v; want unavailable", len(ds), err)
	}
	if ds, err := f.b.Claim(ctx, req); !errors.Is(err, ErrUnavailable) || len(ds) != 0 {
		t.Fatalf("claim on a self-fenced router: %d deliveries, %v; want unavailable", len(ds), err)
	}
	if held, _ := f.b.Owners().InFlight(); held != 0 {
		t.Fatalf("%d leases held in memory while self-fenced, want 0", held)
	}
	f.b.SetSelfFenced(false)
	ds, err := f.b.ClaimCluster(ctx, "c1", req)
	if err != nil || len(ds) != 3 {
		t.Fatalf("forwarded claim once registered again: %d, %v; want 3", len(ds), err)
	}
	for _, d := range ds {
		if d.Attempt != 1 {
			t.Fatalf("attempt %d, want 1: the fenced claims counted attempts", d.Attempt)
		}
	}
}
