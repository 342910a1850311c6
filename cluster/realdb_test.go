//go:build dbbench

// Built only with -tags dbbench (make bench): the rest of the broker's
// tests run on in-memory fakes and need no database.
package cluster

import (
	"context"
	"os"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/store"
)

// The acker's tests and benchmark run against real MariaDB (a test bed).
var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 1}, func(b *testbed.Bed) { bed = b }))
}

func openStore(t testing.TB) *store.Store {
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
