package circuit

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

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
