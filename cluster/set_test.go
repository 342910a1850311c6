package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/store"
)

// A set opens a cluster's primary once, keeps it (and its Cluster) while
// its DSN stays, hands a changed primary's calls over to the successor,
// retires a cluster that left only on Retain, and changes nothing when a
// new primary fails its check.
func TestSetFollowsThePrimaries(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 1, NoReplicas: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	dsn := func() string {
		var b [4]byte
		rand.Read(b[:])
		name := "t_set_" + hex.EncodeToString(b[:])
		if err := testbed.CreateDatabase(ctx, own, name); err != nil {
			t.Fatal(err)
		}
		return own.Clusters[0].Primary.DSN(name)
	}
	breakers := circuit.NewSet(circuit.Config{})
	set := NewSet(SetConfig{Options: func(string) store.Options { return store.Options{} }, Breaker: breakers.For})
	t.Cleanup(set.Close)
	writable := func(context.Context, string, *store.Store) error { return nil }
	on := func(c Caller) (st Store) {
		t.Helper()
		if err := c.Do(ctx, OpStats, func(_ context.Context, s Store) error { st = s; return nil }); err != nil {
			t.Fatalf("call: %v", err)
		}
		return st
	}

	a := dsn()
	first, err := set.Update(ctx, map[string]string{"c1": a}, writable)
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := set.Conn("c1")
	again, err := set.Update(ctx, map[string]string{"c1": a}, writable)
	if err != nil || again["c1"] != first["c1"] {
		t.Fatalf("same primary again: %v, cluster kept %v", err, again["c1"] == first["c1"])
	}

	refused := errors.New("read-only")
	if _, err := set.Update(ctx, map[string]string{"c1": dsn()}, func(context.Context, string, *store.Store) error { return refused }); !errors.Is(err, refused) {
		t.Fatalf("a primary that fails its check: %v", err)
	}
	if c, _ := set.Conn("c1"); c != c1 || c1.Primary.Retired() {
		t.Fatal("a failed update changed the primary in use")
	}

	switched, err := set.Update(ctx, map[string]string{"c1": dsn()}, writable)
	if err != nil {
		t.Fatal(err)
	}
	c2, _ := set.Conn("c1")
	if switched["c1"] == first["c1"] || !c1.Primary.Retired() {
		t.Fatal("a changed primary kept its cluster, or the old call point was not retired")
	}
	if got := on(c1.Primary); got != Store(c2.Store) {
		t.Fatal("a call on the old primary's call point did not go to the successor")
	}

	if _, err := set.Update(ctx, map[string]string{}, writable); err != nil {
		t.Fatal(err)
	}
	if len(set.Stores()) != 0 || c2.Primary.Retired() {
		t.Fatal("a cluster that left is still in use, or retired before Retain")
	}
	set.Retain()
	if !c2.Primary.Retired() {
		t.Fatal("Retain did not retire the cluster that left")
	}
	if err := c2.Primary.Do(ctx, OpStats, func(context.Context, Store) error { return nil }); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a call on a cluster that left: %v, want unavailable", err)
	}
}
