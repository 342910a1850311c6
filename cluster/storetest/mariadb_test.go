package storetest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/store"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 1}, func(b *testbed.Bed) { bed = b }))
}

// The real store on MariaDB keeps the contract: the suite's reference.
func TestMariaDB(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	name := testbed.TestDatabase(t, bed, "t_contract_")
	st, err := store.Open(ctx, bed.Clusters[0].Primary.DSN(name), store.Options{IDs: idgen.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx, time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	Run(t, st)
}
