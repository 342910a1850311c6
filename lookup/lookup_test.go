package lookup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

// primariesOnly serves every cluster from its primary.
type primariesOnly map[string]*store.Store

func (p primariesOnly) Primary(c string) (Target, bool) {
	st, ok := p[c]
	return Target{Conn: direct{st}, Endpoint: c}, ok
}

// direct reads a store as it is, with no breaker.
type direct struct{ r Reader }

func (d direct) Do(ctx context.Context, fn func(context.Context, Reader) error) error {
	return fn(ctx, d.r)
}
func (p primariesOnly) Replica(string) (Target, bool)    { return Target{}, false }
func (p primariesOnly) AnyReplica(string) (Target, bool) { return Target{}, false }

// A cluster that cannot be read is named, not silently left out.
func TestScatterNamesClustersThatDidNotAnswer(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	bed, err := testbed.Start(ctx, testbed.Spec{Clusters: 2, NoReplicas: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bed.Stop() })
	name := testbed.TestDatabase(t, bed, "t_lookup_")
	ids := idgen.New(nil)
	ep := primariesOnly{}
	for _, c := range bed.Clusters {
		st, err := store.Open(ctx, c.Primary.DSN(name), store.Options{IDs: ids, MaxOpen: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if err := st.Migrate(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
		ep[c.Name] = st
	}
	m, err := routing.NewMap(1, []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: shard.Count - 1, Cluster: "c2"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	table := routing.NewTable(m)
	// One message with tx-1 on each cluster.
	keys := map[string]string{}
	for i := 0; len(keys) < 2; i++ {
		k := "k" + string(rune('a'+i))
		c, _ := m.Lookup(shard.Of(k))
		if _, ok := keys[c]; ok {
			continue
		}
		keys[c] = k
		id := ids.Next()
		_, err := ep[c].Produce(ctx, []store.ProduceItem{{Msg: &store.Message{ID: id, VShard: uint16(shard.Of(k)), Topic: "t", Key: k,
			TransactionID: "tx-1", PayloadJSON: true, Payload: []byte(`1`), CreatedAt: idgen.Time(id)}, Hash: make([]byte, 16),
			AvailableAt: time.Now(), Subscriptions: []string{"default"}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	s := New(Config{ClusterTimeout: time.Second}, ep, table)
	res, err := s.Transaction(ctx, "tx-1")
	if err != nil || len(res.Messages) != 2 || len(res.Unanswered) != 0 || res.Sources[0].Fallback != FallbackNoReplica {
		t.Fatalf("healthy: %+v, %v", res, err)
	}
	tr, err := s.Trace(ctx, "t", keys["c2"], "")
	if err != nil || tr.ReadFrom != FromPrimary || tr.Cluster != "c2" {
		t.Fatalf("trace: %+v, %v", tr, err)
	}

	if err := bed.Kill(bed.Clusters[1].Primary); err != nil {
		t.Fatal(err)
	}
	res, err = s.Transaction(ctx, "tx-1")
	if err != nil || len(res.Messages) != 1 || res.Messages[0].Cluster != "c1" || len(res.Unanswered) != 1 || res.Unanswered[0].Cluster != "c2" {
		t.Fatalf("with c2 down: %+v, %v", res, err)
	}
	miss, err := s.MissingTransactions(ctx, []string{"tx-1", "tx-2"})
	if err != nil || len(miss.Unanswered) != 1 || miss.Found["tx-1"] != 1 || len(miss.Missing) != 1 || miss.Missing[0] != "tx-2" {
		t.Fatalf("missing with c2 down: %+v, %v", miss, err)
	}
	if _, err := s.Trace(ctx, "t", keys["c2"], ""); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("trace on the dead cluster: %v", err)
	}
	if _, err := s.Trace(ctx, "t", keys["c1"], ""); err != nil {
		t.Fatalf("trace on the live cluster: %v", err)
	}
}
