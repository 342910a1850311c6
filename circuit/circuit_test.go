package circuit

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/store"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 2, Replicas: 1}, func(b *testbed.Bed) { bed = b }))
}

// openDB creates a fresh database on inst and opens a migrated store on it.
func openDB(t *testing.T, b *testbed.Bed, inst *testbed.Instance, ids *idgen.Gen) (*store.Store, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	var rnd [4]byte
	rand.Read(rnd[:])
	name := "t_circuit_" + hex.EncodeToString(rnd[:])
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

func item(ids *idgen.Gen, key string) store.ProduceItem {
	id := ids.Next()
	return store.ProduceItem{
		Msg:           &store.Message{ID: id, VShard: 1, Topic: "t", Key: key, PayloadJSON: true, Payload: []byte(`1`), CreatedAt: idgen.Time(id)},
		Hash:          make([]byte, 16),
		AvailableAt:   time.Now().UTC(),
		Subscriptions: []string{"default"},
	}
}

func count(t *testing.T, db *sql.DB, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM message_store WHERE msg_key = ?", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestAnswersThatAreNotOutagesKeepTheBreakerClosed(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ids := idgen.New(nil)
	st, _ := openDB(t, bed, bed.Clusters[0].Primary, ids)
	b := NewSet(Config{Failures: 2}).For("ep")
	for i := 0; i < 5; i++ {
		err := b.Do(context.Background(), func(ctx context.Context) error {
			_, err := st.Trace(ctx, "t", "no-such-key", time.Now())
			return err
		})
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("trace: %v", err)
		}
	}
	if b.State() != "closed" {
		t.Fatalf("breaker %s after not-found answers", b.State())
	}
	// A caller that gives up does not count either.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 5; i++ {
		b.Do(ctx, func(ctx context.Context) error { return st.Ping(ctx) })
	}
	if b.State() != "closed" {
		t.Fatalf("breaker %s after cancelled calls", b.State())
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
	set := NewSet(Config{Failures: 3, OpenFor: 200 * time.Millisecond, CallTimeout: time.Second,
		OnStateChange: func(_, from, to string) { changes = append(changes, from+"→"+to) }})
	var observed opLog
	sh := NewCluster(st, set.For(own.Clusters[0].Primary.Addr()), observed.observe)
	if _, err := produce(ctx, sh, []store.ProduceItem{item(ids, "a")}); err != nil {
		t.Fatal(err)
	}
	if err := own.Kill(own.Clusters[0].Primary); err != nil {
		t.Fatal(err)
	}
	for i := 0; sh.Breaker().State() != "open"; i++ {
		if _, err := produce(ctx, sh, []store.ProduceItem{item(ids, "b")}); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("produce on a dead primary: %v", err)
		}
		if i > 10 {
			t.Fatal("breaker did not open")
		}
	}
	start := time.Now()
	_, err = produce(ctx, sh, []store.ProduceItem{item(ids, "c")})
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, ErrOpen) || time.Since(start) > 10*time.Millisecond {
		t.Fatalf("open breaker: %v after %v", err, time.Since(start))
	}
	if s := set.States(); len(s) != 1 || s[0].State != "open" {
		t.Fatalf("states = %+v", s)
	}
	if err := own.Restart(ctx, own.Clusters[0].Primary); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := produce(ctx, sh, []store.ProduceItem{item(ids, "d")})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not recovered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if sh.Breaker().State() != "closed" {
		t.Fatalf("breaker %s after a successful probe", sh.Breaker().State())
	}
	// Every call was observed, refused ones included, each with its outcome.
	calls, failed := observed.counts(broker.OpProduce)
	if calls < 5 || failed < 4 || calls-failed < 2 {
		t.Fatalf("observer saw %d produce calls, %d failed", calls, failed)
	}
	t.Logf("transitions: %v", changes)
}

// Retire hands an endpoint over: a call blocked on the old endpoint is
// cancelled and runs once on the successor, later calls go there directly.
func TestRetireRetriesInFlightCallOnSuccessor(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	ids := idgen.New(nil)
	oldSt, oldDB := openDB(t, bed, bed.Clusters[0].Primary, ids)
	newSt, newDB := openDB(t, bed, bed.Clusters[1].Primary, ids)
	set := NewSet(Config{})
	oldSh, newSh := NewCluster(oldSt, set.For("old"), nil), NewCluster(newSt, set.For("new"), nil)

	// Hold the dedup row of "k" on the old endpoint so the produce blocks.
	tx, err := oldDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("INSERT INTO message_key (topic, msg_key, vshard, message_id, payload_hash, created_at) VALUES ('t', 'k', 1, 1, ?, NOW())", make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		res, err := produce(ctx, oldSh, []store.ProduceItem{item(ids, "k")})
		if err == nil && res[0].Status != store.Created {
			err = errors.New("not created: " + res[0].Status.String())
		}
		done <- err
	}()
	// Wait until the produce is blocked on the row lock.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		err := oldDB.QueryRow(`SELECT COUNT(*) FROM information_schema.INNODB_TRX x JOIN information_schema.PROCESSLIST p ON p.ID = x.trx_mysql_thread_id
WHERE x.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()`).Scan(&n)
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("produce never blocked (last check: %v)", err)
		}
		select {
		case err := <-done:
			t.Fatalf("produce finished while the key's row was held: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	oldSh.Retire(newSh)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("in-flight produce after retire: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight produce not handed over")
	}
	if count(t, newDB, "k") != 1 {
		t.Fatal("the retried produce is not on the successor")
	}
	if _, err := produce(ctx, oldSh, []store.ProduceItem{item(ids, "later")}); err != nil || count(t, newDB, "later") != 1 || count(t, oldDB, "later") != 0 {
		t.Fatalf("a call on the retired endpoint did not go to the successor: %v", err)
	}
	gone := NewCluster(oldSt, set.For("gone"), nil)
	gone.Retire(nil)
	if _, err := produce(ctx, gone, []store.ProduceItem{item(ids, "x")}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("retired without successor: %v", err)
	}
}

// produce runs a produce through c's call point.
func produce(ctx context.Context, c *Cluster, items []store.ProduceItem) (res []store.ProduceResult, err error) {
	err = c.Do(ctx, broker.OpProduce, func(ctx context.Context, s broker.Store) (err error) {
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
