package loadtest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// Direct is the baseline: the same logical work as the router, done by a
// hand-tuned client straight on the cluster primaries through package
// store — the same schema and statements (message_key, message_store and
// one delivery per subscription in one transaction per cluster, multi-row
// statements of the request's batch, one round trip per statement through
// interpolateParams), the same durability (commit on the primary), the
// same vshard routing, and no HTTP, JSON or request coalescing.
type Direct struct {
	m        *routing.Map
	clusters []string
	stores   map[string]*store.Store
	ids      *idgen.Gen
	policy   store.RetryPolicy
	rr       atomic.Uint64

	mu   sync.Mutex
	subs map[string][]string // topic → subscriptions; absent: default
}

var _ Target = (*Direct)(nil)

// OpenDirect connects to every primary of top. The schema must already be
// there (the router migrates it when it starts).
func OpenDirect(ctx context.Context, top *topology.Topology, opts store.Options) (*Direct, error) {
	d := &Direct{m: top.Map, clusters: top.Map.Clusters(), stores: map[string]*store.Store{}, ids: idgen.New(nil),
		policy: store.RetryPolicy{}.WithDefaults(), subs: map[string][]string{}}
	opts.IDs = d.ids
	for _, name := range d.clusters {
		c, ok := top.Clusters[name]
		if !ok {
			d.Close()
			return nil, fmt.Errorf("baseline: shard map names cluster %s, which the topology does not list", name)
		}
		st, err := store.Open(ctx, c.Primary, opts)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("baseline: cluster %s: %w", name, err)
		}
		d.stores[name] = st
	}
	return d, nil
}

// Close closes the pools.
func (d *Direct) Close() {
	for _, st := range d.stores {
		st.Close()
	}
}

// Name implements Target.
func (d *Direct) Name() string { return "baseline" }

// Subscribe implements Target: the baseline writes one delivery per
// subscription it is told of.
func (d *Direct) Subscribe(_ context.Context, topic string, subs []string, maxAttempts int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.subs[topic] = append([]string(nil), subs...)
	sort.Strings(d.subs[topic])
	if maxAttempts > 0 {
		d.policy.MaxAttempts = maxAttempts
	}
	return nil
}

func (d *Direct) subscriptions(topic string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.subs[topic]; ok {
		return s
	}
	return []string{"default"}
}

func (d *Direct) cluster(v shard.ID) string {
	name, _ := d.m.Lookup(v)
	return name
}

// Produce implements Target: one store transaction per cluster, run
// concurrently, as the router does for one request.
func (d *Direct) Produce(ctx context.Context, topic string, msgs []Message) ([]ProduceResult, error) {
	subs := d.subscriptions(topic)
	now := time.Now().UTC()
	res := make([]ProduceResult, len(msgs))
	groups := map[string][]int{}
	items := make([]store.ProduceItem, len(msgs))
	for i, m := range msgs {
		v := shard.Of(shard.Key(m.OrderKey, m.Key))
		id := d.ids.Next()
		h := sha256.Sum256(m.Payload)
		items[i] = store.ProduceItem{
			Msg: &store.Message{ID: id, VShard: uint16(v), Topic: topic, Key: m.Key, OrderKey: m.OrderKey,
				PayloadJSON: true, Payload: m.Payload, CreatedAt: idgen.Time(id)},
			Hash: h[:16], AvailableAt: now, Subscriptions: subs,
		}
		res[i].VShard = int(v)
		name := d.cluster(v)
		groups[name] = append(groups[name], i)
	}
	var wg sync.WaitGroup
	for name, idx := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := make([]store.ProduceItem, len(idx))
			for j, i := range idx {
				batch[j] = items[i]
			}
			out, err := d.stores[name].Produce(ctx, batch)
			for j, i := range idx {
				if err != nil {
					res[i].Status, res[i].Code = "unavailable", "unavailable"
					continue
				}
				res[i].Status, res[i].ID = out[j].Status.String(), out[j].ID
			}
		}()
	}
	wg.Wait()
	return res, nil
}

// Claim implements Target like the router's claim: clusters in rotation
// from a moving start until max is filled, and when nothing is ready a
// re-poll with a backoff from 20 ms to 500 ms until the wait is over.
func (d *Direct) Claim(ctx context.Context, req ClaimRequest) ([]Delivery, error) {
	deadline := time.Now().Add(req.Wait)
	poll := 20 * time.Millisecond
	for {
		out, err := d.claimOnce(ctx, req)
		if len(out) > 0 || err != nil {
			return out, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil
		}
		if ctxwait.Sleep(ctx, min(poll, left)) != nil {
			return nil, nil
		}
		poll = min(2*poll, 500*time.Millisecond)
	}
}

func (d *Direct) claimOnce(ctx context.Context, req ClaimRequest) ([]Delivery, error) {
	start := int(d.rr.Add(1))
	var out []Delivery
	failed := 0
	var last error
	for k := 0; k < len(d.clusters) && len(out) < req.Max; k++ {
		name := d.clusters[(start+k)%len(d.clusters)]
		got, err := d.stores[name].Claim(ctx, store.ClaimRequest{Topic: req.Topic, Subscription: req.Subscription, Consumer: req.Consumer,
			Max: req.Max - len(out), Lease: req.Lease, Token: rand.Uint64() | 1, MaxAttempts: d.policy.MaxAttempts, Now: time.Now().UTC()})
		if err != nil {
			failed++
			last = err
			continue
		}
		for _, c := range got {
			m := c.Message
			out = append(out, Delivery{Key: m.Key, ID: m.ID, VShard: int(m.VShard), Attempt: c.Attempt, ProducedAt: m.CreatedAt, Payload: m.Payload,
				Receipt: Receipt{vshard: int(m.VShard), lease: store.Lease{MessageID: m.ID, Subscription: req.Subscription, Token: c.Token}}})
		}
	}
	if len(out) == 0 && failed == len(d.clusters) {
		return nil, &RequestError{Code: "unavailable", Message: last.Error()}
	}
	return out, nil
}

// byCluster groups indexes of receipts by the cluster of their vshard.
func (d *Direct) byCluster(receipts []Receipt) map[string][]int {
	g := map[string][]int{}
	for i, r := range receipts {
		name := d.cluster(shard.ID(r.vshard))
		g[name] = append(g[name], i)
	}
	return g
}

// Ack implements Target: one store transaction per cluster, concurrently,
// by the router's statements (store.AckMany, one group: the baseline does
// not coalesce requests).
func (d *Direct) Ack(ctx context.Context, receipts []Receipt) ([]string, error) {
	out := make([]string, len(receipts))
	var g errgroup.Group
	for name, idx := range d.byCluster(receipts) {
		g.Go(func() error {
			leases := make([]store.Lease, len(idx))
			for j, i := range idx {
				leases[j] = receipts[i].lease
			}
			res := d.stores[name].AckMany(ctx, []store.AckGroup{{Leases: leases}}, time.Now().UTC())[0]
			st, err := res.Statuses, res.Err
			for j, i := range idx {
				if err != nil {
					out[i] = "unavailable"
					continue
				}
				out[i] = st[j].String()
			}
			return nil
		})
	}
	g.Wait()
	return out, nil
}

// Nack implements Target.
func (d *Direct) Nack(ctx context.Context, items []NackItem) ([]string, error) {
	receipts := make([]Receipt, len(items))
	for i, it := range items {
		receipts[i] = it.Receipt
	}
	out := make([]string, len(items))
	policy := func(string, string) store.RetryPolicy { return d.policy }
	var g errgroup.Group
	for name, idx := range d.byCluster(receipts) {
		g.Go(func() error {
			batch := make([]store.NackItem, len(idx))
			for j, i := range idx {
				batch[j] = store.NackItem{Lease: items[i].Receipt.lease, ErrorCode: items[i].Code, Error: "load test nack", RetryAfter: items[i].RetryAfter}
			}
			res, err := d.stores[name].Nack(ctx, batch, policy, rand.Float64, time.Now().UTC())
			for j, i := range idx {
				if err != nil {
					out[i] = "unavailable"
					continue
				}
				out[i] = res[j].Status.String()
			}
			return nil
		})
	}
	g.Wait()
	return out, nil
}

// Lookup reports which message id holds key on topic, reading the dedup
// registry on the key's primary; found is false when no message holds it.
func (d *Direct) Lookup(ctx context.Context, topic, key, orderKey string) (id uint64, found bool, err error) {
	name := d.cluster(shard.Of(shard.Key(orderKey, key)))
	id, err = d.stores[name].LookupKey(ctx, topic, key)
	if errors.Is(err, store.ErrNotFound) {
		return 0, false, nil
	}
	return id, err == nil, err
}
