package broker

import (
	"context"
	"errors"
	"github.com/shardmq/shardmq/cluster"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
)

// fakeStore stands for a cluster in tests that never reach it.
type fakeStore struct{ cluster.Store }

func frozenMap(t *testing.T, version int64, frozen bool) *routing.Map {
	t.Helper()
	m, err := routing.NewMap(version, []routing.Range{{From: 0, To: 9, Cluster: "c1", Frozen: frozen}, {From: 10, To: 1023, Cluster: "c1"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func frozenBroker(t *testing.T, cfg Config) (*Broker, *routing.Table) {
	t.Helper()
	table := routing.NewTable(frozenMap(t, 1, true))
	b := New(cfg, table, map[string]Cluster{"c1": cluster.New("c1", direct{fakeStore{}}, cluster.Config{})}, nil, nil, idgen.New(nil), nil, nil)
	t.Cleanup(b.Close)
	return b, table
}

// An item of a frozen vshard is held without a pin until the map changes,
// then served; items of serving vshards go at once.
func TestDispatchHoldsFrozenUntilTheMapChanges(t *testing.T) {
	t.Parallel()
	b, table := frozenBroker(t, Config{FrozenWait: time.Minute})
	var ran atomic.Int32
	done := make(chan []error, 1)
	go func() {
		done <- b.dispatch(context.Background(), []shard.ID{5, 500}, nil, func(_ context.Context, name string, _ *clusterConn, idx []int, _ func() func()) {
			ran.Add(int32(len(idx)))
		})
	}()
	testtime.Until(t, "the frozen item held and the serving one run", func() bool { return b.FrozenStats().Held == 1 && ran.Load() == 1 })
	if v := b.Applied(); v != 1 {
		t.Fatalf("Applied while a request is held: %d, want 1 (held requests pin nothing)", v)
	}
	table.Store(frozenMap(t, 2, false))
	errs := <-done
	if errs[0] != nil || errs[1] != nil || ran.Load() != 2 {
		t.Fatalf("after the unfreeze: errs %v, ran %d", errs, ran.Load())
	}
	if s := b.FrozenStats(); s.Held != 0 || s.HeldTotal != 1 || s.TimedOut != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A hold ends after FrozenWait as unavailable; past FrozenMaxHeld held
// requests, more are answered unavailable at once.
func TestDispatchTimesOutAndCapsHeldRequests(t *testing.T) {
	t.Parallel()
	b, _ := frozenBroker(t, Config{FrozenWait: 200 * time.Millisecond, FrozenMaxHeld: 1})
	never := func(context.Context, string, *clusterConn, []int, func() func()) {
		t.Error("ran an item of a frozen vshard")
	}
	first := make(chan []error, 1)
	go func() { first <- b.dispatch(context.Background(), []shard.ID{1}, nil, never) }()
	testtime.Until(t, "the frozen item held", func() bool { return b.FrozenStats().Held == 1 })
	errs := b.dispatch(context.Background(), []shard.ID{2}, nil, never)
	if !errors.Is(errs[0], ErrUnavailable) || b.FrozenStats().Overflow != 1 {
		t.Fatalf("over the cap: %v, stats %+v", errs, b.FrozenStats())
	}
	if errs := <-first; !errors.Is(errs[0], ErrUnavailable) {
		t.Fatalf("after FrozenWait: %v", errs)
	}
	if s := b.FrozenStats(); s.TimedOut != 1 || s.Held != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Applied vouches only for a map no operation in flight still routes with.
func TestAppliedWaitsForOperationsInFlight(t *testing.T) {
	t.Parallel()
	b, table := frozenBroker(t, Config{})
	table.Store(frozenMap(t, 2, false))
	changed := b.AppliedChanged()
	var late func()
	errs := b.dispatch(context.Background(), []shard.ID{500}, nil, func(_ context.Context, _ string, _ *clusterConn, _ []int, keep func() func()) {
		table.Store(frozenMap(t, 3, true))
		if v := b.Applied(); v != 2 {
			t.Errorf("Applied during a write routed with map 2: %d", v)
		}
		late = keep() // a write that may still land after the call
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if v := b.Applied(); v != 2 {
		t.Fatalf("Applied while a late write is pending: %d, want 2", v)
	}
	late()
	<-changed
	if v := b.Applied(); v != 3 {
		t.Fatalf("Applied after the write: %d, want 3", v)
	}
}
