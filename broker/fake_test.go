package broker

import (
	"context"
	"fmt"
	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/cluster/clustertest"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/subscription"
)

// The broker's tests run against in-memory fakes of the cluster call point
// (fakeCluster) and of the store operations behind it (clustertest.Store), so they
// need no database and run in milliseconds. What the fakes promise is what
// the broker relies on from store.Store; the store's own suite checks the
// real thing on MariaDB, and server's end-to-end tests the whole path.

// fakeCluster is a cluster's call point over a clustertest.Store. While down, every
// call fails unavailable without reaching the store, as an open breaker
// answers. It counts calls by operation.
type fakeCluster struct {
	st   *clustertest.Store
	down atomic.Bool
	mu   sync.Mutex
	ops  map[string]int
}

var _ cluster.Caller = (*fakeCluster)(nil)

func newFakeCluster() *fakeCluster {
	return &fakeCluster{st: clustertest.NewStore(), ops: map[string]int{}}
}

func (c *fakeCluster) Do(ctx context.Context, op string, fn func(context.Context, cluster.Store) error) error {
	c.mu.Lock()
	c.ops[op]++
	c.mu.Unlock()
	if c.down.Load() {
		return fmt.Errorf("%w: cluster down (test)", store.ErrUnavailable)
	}
	return fn(ctx, c.st)
}

func (c *fakeCluster) calls(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops[op]
}

// direct is a call point that runs every call on s as it is.
type direct struct{ s cluster.Store }

func (d direct) Do(ctx context.Context, _ string, fn func(context.Context, cluster.Store) error) error {
	return fn(ctx, d.s)
}

// fixedSubs is a subscription registry with a fixed set of subscriptions.
type fixedSubs struct {
	mu   sync.Mutex
	subs map[[2]string]subscription.Subscription
}

var _ Subscriptions = (*fixedSubs)(nil)

func newFixedSubs(subs ...subscription.Subscription) *fixedSubs {
	f := &fixedSubs{subs: map[[2]string]subscription.Subscription{}}
	for _, s := range subs {
		if s.CreatedAt.IsZero() {
			s.CreatedAt = time.Unix(1, 0) // stored, not implicit
		}
		f.subs[[2]string{s.Topic, s.Name}] = s.WithDefaults()
	}
	return f
}

func (f *fixedSubs) ForProduce(_ context.Context, topic string) ([]string, error) {
	var out []string
	for _, s := range f.List(topic) {
		out = append(out, s.Name)
	}
	if len(out) == 0 {
		out = []string{subscription.Default}
	}
	return out, nil
}

func (f *fixedSubs) Get(_ context.Context, topic, name string) (subscription.Subscription, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.subs[[2]string{topic, name}]
	return s, ok, nil
}

func (f *fixedSubs) Put(_ context.Context, s subscription.Subscription) (subscription.Subscription, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, had := f.subs[[2]string{s.Topic, s.Name}]
	f.subs[[2]string{s.Topic, s.Name}] = s
	return s, !had, nil
}

func (f *fixedSubs) Delete(_ context.Context, topic, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[[2]string{topic, name}]; !ok {
		return subscription.ErrNotFound
	}
	delete(f.subs, [2]string{topic, name})
	return nil
}

func (f *fixedSubs) List(topic string) []subscription.Subscription {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []subscription.Subscription
	for _, s := range f.subs {
		if topic == "" || s.Topic == topic {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// twoClusters is a broker over c1 (vshards 0–511) and c2 (512–1023), with
// subscription "s" on topic "t".
type fixture struct {
	b      *Broker
	table  *routing.Table
	c1, c2 *fakeCluster
}

func setup(t *testing.T, cfg Config) *fixture {
	return setupWith(t, cfg, cluster.Config{})
}

// setupWith is setup with the clusters' group commits tuned by ccfg.
func setupWith(t *testing.T, cfg Config, ccfg cluster.Config) *fixture {
	t.Helper()
	m, err := routing.NewMap(1, []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: 1023, Cluster: "c2"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{table: routing.NewTable(m), c1: newFakeCluster(), c2: newFakeCluster()}
	subs := newFixedSubs(subscription.Subscription{Topic: "t", Name: "s", MaxAttempts: 2})
	clusters := map[string]Cluster{"c1": cluster.New("c1", f.c1, ccfg), "c2": cluster.New("c2", f.c2, ccfg)}
	f.b = New(cfg, f.table, clusters, subs, nil, idgen.New(nil), nil, nil)
	t.Cleanup(f.b.Close)
	return f
}

// cluster is the fake serving key's vshard.
func (f *fixture) cluster(key string) *fakeCluster {
	name, _ := f.table.Load().Lookup(shardOf(key))
	if name == "c1" {
		return f.c1
	}
	return f.c2
}
