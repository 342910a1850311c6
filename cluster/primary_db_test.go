package cluster

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/store"
)

// openDB creates a fresh database on inst and opens a migrated store on it.
func openDB(t *testing.T, b *testbed.Bed, inst *testbed.Instance, ids *idgen.Gen) (*store.Store, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	var rnd [4]byte
	rand.Read(rnd[:])
	name := "t_cluster_" + hex.EncodeToString(rnd[:])
	if err := testbed.CreateDatabase(ctx, b, name); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, inst.DSN(name), store.Options{IDs: ids})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", inst.DSN(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		db.Exec("DROP DATABASE " + name)
		db.Close()
	})
	return st, db
}

func nextItem(ids *idgen.Gen, key string) store.ProduceItem {
	id := ids.Next()
	return store.ProduceItem{
		Msg:           &store.Message{ID: id, VShard: 1, Topic: "t", Key: key, PayloadJSON: true, Payload: []byte(`1`), CreatedAt: idgen.Time(id)},
		Hash:          make([]byte, 16),
		AvailableAt:   time.Now().UTC(),
		Subscriptions: []string{"default"},
	}
}

// A killed endpoint opens its breaker; calls then fail at once with
// ErrUnavailable; after OpenFor a probe finds it back and it closes.
func TestBreakerOpensOnDeadEndpointAndRecovers(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 1, NoReplicas: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	ids := idgen.New(nil)
	st, _ := openDB(t, own, own.Clusters[0].Primary, ids)
	var changes []string
	set := circuit.NewSet(circuit.Config{Failures: 3, OpenFor: 200 * time.Millisecond, CallTimeout: time.Second,
		OnStateChange: func(_, from, to string) { changes = append(changes, from+"→"+to) }})
	var observed opLog
	guard := NewPrimary(st, set.For(own.Clusters[0].Primary.Addr()))
	sh := Observe(guard, observed.observe)
	if _, err := produce(ctx, sh, []store.ProduceItem{nextItem(ids, "a")}); err != nil {
		t.Fatal(err)
	}
	if err := own.Kill(own.Clusters[0].Primary); err != nil {
		t.Fatal(err)
	}
	for i := 0; guard.Breaker().State() != "open"; i++ {
		if _, err := produce(ctx, sh, []store.ProduceItem{nextItem(ids, "b")}); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("produce on a dead primary: %v", err)
		}
		if i > 10 {
			t.Fatal("breaker did not open")
		}
	}
	// Refused by the open breaker, without reaching the store (no wall
	// time asserted: the machine may be busy; circuit.ErrOpen says who answered).
	_, err = produce(ctx, sh, []store.ProduceItem{nextItem(ids, "c")})
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, circuit.ErrOpen) {
		t.Fatalf("open breaker: %v", err)
	}
	if s := set.States(); len(s) != 1 || s[0].State != "open" {
		t.Fatalf("states = %+v", s)
	}
	if err := own.Restart(ctx, own.Clusters[0].Primary); err != nil {
		t.Fatal(err)
	}
	testtime.Until(t, "a produce on the restarted primary", func() bool {
		_, err := produce(ctx, sh, []store.ProduceItem{nextItem(ids, "d")})
		return err == nil
	})
	if guard.Breaker().State() != "closed" {
		t.Fatalf("breaker %s after a successful probe", guard.Breaker().State())
	}
	// Every call was observed, refused ones included, each with its outcome.
	calls, failed := observed.counts(OpProduce)
	if calls < 5 || failed < 4 || calls-failed < 2 {
		t.Fatalf("observer saw %d produce calls, %d failed", calls, failed)
	}
	t.Logf("transitions: %v", changes)
}

// produce runs a produce through c's call point.
func produce(ctx context.Context, c Caller, items []store.ProduceItem) (res []store.ProduceResult, err error) {
	err = c.Do(ctx, OpProduce, func(ctx context.Context, s Store) (err error) {
		res, err = s.Produce(ctx, items)
		return err
	})
	return res, err
}

// opLog records what a Cluster's observer is told.
type opLog struct {
	mu    sync.Mutex
	calls map[string][2]int // op → calls, failed
}

func (l *opLog) observe(op string, _ time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.calls == nil {
		l.calls = map[string][2]int{}
	}
	c := l.calls[op]
	c[0]++
	if err != nil {
		c[1]++
	}
	l.calls[op] = c
}

func (l *opLog) counts(op string) (calls, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[op][0], l.calls[op][1]
}
