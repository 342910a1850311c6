package retention

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 2, Replicas: 1}, func(b *testbed.Bed) { bed = b }))
}

// clock is a test clock that only moves when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// fixture: two hot clusters (c1 holds vshards 0-511, c2 512-1023) and an
// archive cluster, each a database of its own, and a job on a test clock.
type fixture struct {
	clock *clock
	ids   *idgen.Gen
	hot   map[string]*store.Store
	arch  *store.Store
	job   *Job
	dir   string
}

func setup(t testing.TB, start time.Time, cfg Config) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{clock: &clock{t: start}, hot: map[string]*store.Store{}, dir: t.TempDir()}
	f.ids = idgen.New(f.clock.Now)
	hotDB := testbed.TestDatabase(t, bed, "t_ret_hot_")
	archDB := testbed.TestDatabase(t, bed, "t_ret_arch_")
	open := func(dsn string) *store.Store {
		st, err := store.Open(ctx, dsn, store.Options{IDs: f.ids})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if err := st.Migrate(ctx, start); err != nil {
			t.Fatal(err)
		}
		return st
	}
	f.hot["c1"] = open(bed.Clusters[0].Primary.DSN(hotDB))
	f.hot["c2"] = open(bed.Clusters[1].Primary.DSN(hotDB))
	f.arch = open(bed.Clusters[1].Primary.DSN(archDB))
	cfg.Now = f.clock.Now
	cfg.ColdDir = f.dir
	cfg.Pause = -1
	if cfg.RangeSize == 0 {
		cfg.RangeSize = 256
	}
	job, err := New(cfg, Deps{Hot: func() map[string]*store.Store { return f.hot }, Archive: func() *store.Store { return f.arch }})
	if err != nil {
		t.Fatal(err)
	}
	f.job = job
	return f
}

// cluster is where vshard v lives in the fixture.
func cluster(v shard.ID) string {
	if v < 512 {
		return "c1"
	}
	return "c2"
}

type produced struct {
	key, cluster string
	id           uint64
	vshard       uint16
}

// produce stores a message with key at the clock's time on its cluster.
func (f *fixture) produce(t *testing.T, topic, key, txID string) produced {
	t.Helper()
	v := shard.Of(shard.Key("", key))
	id := f.ids.Next()
	item := store.ProduceItem{Msg: &store.Message{ID: id, VShard: uint16(v), Topic: topic, Key: key, TransactionID: txID, PayloadJSON: true,
		Payload: []byte(fmt.Sprintf(`{"key":%q}`, key)), CreatedAt: idgen.Time(id)}, Hash: make([]byte, 16),
		AvailableAt: f.clock.Now(), Subscriptions: []string{"default"}}
	res, err := f.hot[cluster(v)].Produce(context.Background(), []store.ProduceItem{item})
	if err != nil || res[0].Status != store.Created {
		t.Fatalf("produce %s: %v %+v", key, err, res)
	}
	return produced{key: key, cluster: cluster(v), id: id, vshard: uint16(v)}
}

// consumeAll claims and acks every ready delivery of topic at the clock's
// time, on every cluster, and returns how many.
func (f *fixture) consumeAll(t *testing.T, topic string) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	for _, st := range f.hot {
		for {
			got, err := st.Claim(ctx, store.ClaimRequest{Topic: topic, Subscription: "default", Consumer: "w1", Max: 100,
				Lease: time.Minute, Token: 77, MaxAttempts: 5, Now: f.clock.Now()})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 {
				break
			}
			leases := make([]store.Lease, len(got))
			for i, c := range got {
				leases[i] = store.Lease{MessageID: c.Message.ID, Subscription: "default", Token: c.Token}
			}
			sts, err := st.Ack(ctx, leases, f.clock.Now())
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range sts {
				if s != store.LeaseOK {
					t.Fatalf("ack: %v", sts)
				}
			}
			n += len(got)
		}
	}
	return n
}

// sums is the count and checksum of the messages and events of month m
// (by message) wherever they are: on the hot clusters, or archived.
type sums struct {
	messages, events int64
	msgSum, evSum    string
}

func (f *fixture) archiveSums(t *testing.T, m time.Time) sums {
	t.Helper()
	sp := store.Span{From: m, To: m.AddDate(0, 1, 0), VFrom: 0, VTo: 1023, ByMessage: true}
	a, err := f.arch.TierSums(context.Background(), store.TableArchiveMessages, sp)
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.arch.TierSums(context.Background(), store.TableArchiveTrace, sp)
	if err != nil {
		t.Fatal(err)
	}
	var s sums
	s.messages, s.msgSum = total(a)
	s.events, s.evSum = total(b)
	return s
}

func (f *fixture) hotSums(t *testing.T, m time.Time) sums {
	t.Helper()
	sp := store.Span{From: m, To: m.AddDate(0, 1, 0), VFrom: 0, VTo: 1023, ByMessage: true}
	all := [2]map[uint16]store.MoveBucket{{}, {}}
	for _, st := range f.hot {
		for i, table := range []string{store.TableMessages, store.TableTrace} {
			got, err := st.TierSums(context.Background(), table, sp)
			if err != nil {
				t.Fatal(err)
			}
			for v, b := range got {
				all[i][v] = b
			}
		}
	}
	var s sums
	s.messages, s.msgSum = total(all[0])
	s.events, s.evSum = total(all[1])
	return s
}

func partitionNames(t *testing.T, st *store.Store, table string) map[string]bool {
	t.Helper()
	parts, err := st.Partitions(context.Background(), table)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range parts {
		out[p.Name] = true
	}
	return out
}

func date(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 12, 0, 0, 0, time.UTC) }

// TestPartitionsAheadAfterClockJump: the router was away past the last
// month partition; inserts of that month still succeed (into pmax), and
// the upkeep gives the month its partition and moves the rows there.
func TestPartitionsAheadAfterClockJump(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	f := setup(t, date(2025, 1, 10), Config{AheadMonths: 3})
	st := f.hot["c1"]
	if got := partitionNames(t, st, store.TableMessages); !got["p202504"] || got["p202505"] {
		t.Fatalf("migration partitions: %v", got)
	}
	f.clock.Set(date(2025, 9, 15)) // past p202504
	var keys []produced
	for i := 0; len(keys) < 5; i++ {
		if p := f.produce(t, "jump", fmt.Sprintf("k%d", i), ""); p.cluster == "c1" {
			keys = append(keys, p)
		}
	}
	if err := st.AppendEvents(ctx, []store.Event{{ID: f.ids.Next(), At: f.clock.Now(), MessageID: keys[0].id, VShard: keys[0].vshard,
		Subscription: "default", Type: store.EventNacked}}); err != nil {
		t.Fatal(err)
	}
	if n, err := st.CountPartition(ctx, store.TableMessages, "pmax"); err != nil || n != 5 {
		t.Fatalf("before upkeep, pmax holds %d messages (%v), want 5", n, err)
	}
	if err := f.job.Partitions(ctx); err != nil {
		t.Fatal(err)
	}
	for _, table := range store.PartitionedTables {
		got := partitionNames(t, st, table)
		for _, m := range []string{"p202505", "p202508", "p202509", "p202512", "pmax"} {
			if !got[m] {
				t.Errorf("%s lacks %s after upkeep: %v", table, m, got)
			}
		}
		if got["p202601"] {
			t.Errorf("%s has p202601, more than 3 months ahead", table)
		}
	}
	for table, want := range map[string]int64{store.TableMessages: 5, store.TableTrace: 1} {
		if n, _ := st.CountPartition(ctx, table, "p202509"); n != want {
			t.Errorf("%s p202509 holds %d rows, want %d", table, n, want)
		}
		if n, _ := st.CountPartition(ctx, table, "pmax"); n != 0 {
			t.Errorf("%s pmax holds %d rows after upkeep, want 0", table, n)
		}
	}
	items := f.job.Status().Jobs[JobPartitions].Items
	if err := f.job.Partitions(ctx); err != nil {
		t.Fatal(err)
	}
	if again := f.job.Status().Jobs[JobPartitions].Items; again != items {
		t.Errorf("a second pass created %d more partitions", again-items)
	}
	// A month later the next month is added.
	f.clock.Set(date(2025, 10, 1))
	if err := f.job.Partitions(ctx); err != nil {
		t.Fatal(err)
	}
	if !partitionNames(t, st, store.TableMessages)["p202601"] {
		t.Error("p202601 not created once it was 3 months ahead")
	}
}

// TestOnlyTheLeaderRuns: a router that does not lead runs no pass, and
// refuses restores, whoever asks.
func TestOnlyTheLeaderRuns(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	f := setup(t, date(2025, 1, 10), Config{})
	f.job.deps.Leading = func() bool { return false }
	f.clock.Set(date(2025, 9, 15))
	if err := f.job.RunOnce(ctx); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("RunOnce on a follower: %v", err)
	}
	if err := f.job.Partitions(ctx); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("Partitions on a follower: %v", err)
	}
	if _, err := f.job.Restore(ctx, date(2024, 3, 1)); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("Restore on a follower: %v", err)
	}
	if partitionNames(t, f.hot["c1"], store.TableMessages)["p202505"] {
		t.Fatal("a follower created partitions")
	}
	if st := f.job.Status(); st.Leading || st.Jobs[JobPartitions].Runs != 0 {
		t.Fatalf("status of a follower: %+v", st)
	}
	f.job.deps.Leading = func() bool { return true }
	if err := f.job.Partitions(ctx); err != nil || !partitionNames(t, f.hot["c1"], store.TableMessages)["p202505"] {
		t.Fatalf("the leader did not create partitions: %v", err)
	}
}
