package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
// (fakeCluster) and of the store operations behind it (memStore), so they
// need no database and run in milliseconds. What the fakes promise is what
// the broker relies on from store.Store; the store's own suite checks the
// real thing on MariaDB, and server's end-to-end tests the whole path.

// memStore keeps one cluster's messages and deliveries in memory.
type memStore struct {
	mu       sync.Mutex
	keys     map[string]*store.Message // topic\x00key → holder
	ids      map[uint64]bool
	dels     map[delKey]*memDelivery
	events   []store.Event
	batches  []int // items per Produce call, in order
	claims   [][]store.ClaimRequest
	acks     [][]store.Lease
	released []store.Lease
	owners   map[[2]string]*memOwner
	flushes  int

	// gate, when set, is called at the start of Produce and ClaimMany
	// (tests hold a call there).
	gate func(op string)
}

type delKey struct {
	id  uint64
	sub string
}

type memDelivery struct {
	msg      *store.Message
	sub      string
	token    uint64
	until    time.Time // lease expiry; zero: ready
	attempts int
	dead     bool
}

var _ Store = (*memStore)(nil)

func newMemStore() *memStore {
	return &memStore{keys: map[string]*store.Message{}, ids: map[uint64]bool{}, dels: map[delKey]*memDelivery{}}
}

// errTakenID is the refusal of a batch that reuses a message id, as the
// database refuses a duplicate primary key: not an outage.
var errTakenID = errors.New("duplicate message id")

// Produce registers keys, answers duplicates and conflicts, and refuses the
// whole batch (applying nothing) when an item reuses an id or carries
// headers longer than their column — as one transaction does.
func (m *memStore) Produce(ctx context.Context, items []store.ProduceItem) ([]store.ProduceResult, error) {
	if m.gate != nil {
		m.gate(OpProduce)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches = append(m.batches, len(items))
	seen := map[uint64]bool{}
	for _, it := range items {
		if m.ids[it.Msg.ID] || seen[it.Msg.ID] {
			return nil, fmt.Errorf("%w %d", errTakenID, it.Msg.ID)
		}
		seen[it.Msg.ID] = true
		if len(it.Msg.Headers) > store.MaxHeadersBytes {
			return nil, fmt.Errorf("%w: headers of %d bytes", store.ErrInvalidData, len(it.Msg.Headers))
		}
	}
	out := make([]store.ProduceResult, len(items))
	for i, it := range items {
		k := it.Msg.Topic + "\x00" + it.Msg.Key
		if h, ok := m.keys[k]; ok {
			st := store.Conflict
			if string(h.Payload) == string(it.Msg.Payload) {
				st = store.Duplicate
			}
			out[i] = store.ProduceResult{Status: st, ID: h.ID, VShard: h.VShard}
			continue
		}
		m.keys[k] = it.Msg
		m.ids[it.Msg.ID] = true
		for _, sub := range it.Subscriptions {
			m.dels[delKey{it.Msg.ID, sub}] = &memDelivery{msg: it.Msg, sub: sub}
		}
		out[i] = store.ProduceResult{Status: store.Created, ID: it.Msg.ID}
	}
	return out, nil
}

// PeekClaimable lists what ClaimMany would take now, in its order
// (oldest first), locking nothing.
func (m *memStore) PeekClaimable(ctx context.Context, topic, sub string, now time.Time, max int, dead bool, errorCode string, exclude []uint16) ([]store.ClaimHead, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []store.ClaimHead
	for _, d := range m.dels {
		if !d.dead && !d.until.After(now) && d.msg.Topic == topic && d.sub == sub && !slices.Contains(exclude, d.msg.VShard) {
			out = append(out, store.ClaimHead{Priority: d.msg.Priority, MessageID: d.msg.ID})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].MessageID < out[j].MessageID })
	return out[:min(len(out), max)], nil
}

// ClaimMany leases ready deliveries, oldest first, each request its own.
func (m *memStore) ClaimMany(ctx context.Context, reqs []store.ClaimRequest) ([][]store.Claimed, error) {
	if m.gate != nil {
		m.gate(OpClaim)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.claims = append(m.claims, slices.Clone(reqs))
	var ready []*memDelivery
	for _, d := range m.dels {
		if !d.dead && !d.until.After(reqs[0].Now) && d.msg.Topic == reqs[0].Topic && d.sub == reqs[0].Subscription &&
			!slices.Contains(reqs[0].ExcludeVShards, d.msg.VShard) {
			ready = append(ready, d)
		}
	}
	sort.Slice(ready, func(i, j int) bool { return ready[i].msg.ID < ready[j].msg.ID })
	out := make([][]store.Claimed, len(reqs))
	for i, r := range reqs {
		for len(out[i]) < r.Max && len(ready) > 0 {
			d := ready[0]
			ready = ready[1:]
			d.token, d.until = r.Token, r.Now.Add(r.Lease)
			d.attempts++
			out[i] = append(out[i], store.Claimed{Message: d.msg, Attempt: d.attempts, Token: d.token, LeaseExpires: d.until})
		}
	}
	return out, nil
}

// held finds the delivery a lease names and says whether the lease holds it.
func (m *memStore) held(l store.Lease) (*memDelivery, store.LeaseStatus) {
	d, ok := m.dels[delKey{l.MessageID, l.Subscription}]
	switch {
	case !ok:
		return nil, store.LeaseNotFound
	case d.token != l.Token || d.until.IsZero():
		return d, store.LeaseLost
	}
	return d, store.LeaseOK
}

func (m *memStore) AckMany(ctx context.Context, groups []store.AckGroup, now time.Time) []store.AckResult {
	out := make([]store.AckResult, len(groups))
	for i, g := range groups {
		out[i].Statuses, out[i].Err = m.Ack(ctx, g.Leases, now)
	}
	return out
}

func (m *memStore) Ack(ctx context.Context, leases []store.Lease, now time.Time) ([]store.LeaseStatus, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.acks = append(m.acks, slices.Clone(leases))
	out := make([]store.LeaseStatus, len(leases))
	for i, l := range leases {
		_, out[i] = m.held(l)
		if out[i] == store.LeaseOK {
			delete(m.dels, delKey{l.MessageID, l.Subscription})
		}
	}
	return out, nil
}

func (m *memStore) Nack(ctx context.Context, items []store.NackItem, policy func(topic, sub string) store.RetryPolicy, rnd func() float64, now time.Time) ([]store.NackResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]store.NackResult, len(items))
	for i, it := range items {
		d, st := m.held(it.Lease)
		switch st {
		case store.LeaseNotFound:
			out[i].Status = store.NackNotFound
		case store.LeaseLost:
			out[i].Status = store.NackLeaseLost
		default:
			if d.attempts >= policy(d.msg.Topic, d.sub).MaxAttempts {
				d.dead, d.until = true, time.Time{}
				out[i].Status = store.Dead
				continue
			}
			d.until = now.Add(time.Second)
			d.token = 0
			out[i] = store.NackResult{Status: store.RetryScheduled, NextAttemptAt: d.until}
		}
	}
	return out, nil
}

func (m *memStore) Extend(ctx context.Context, leases []store.Lease, lease time.Duration, now time.Time) ([]store.LeaseStatus, time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]store.LeaseStatus, len(leases))
	for i, l := range leases {
		var d *memDelivery
		if d, out[i] = m.held(l); out[i] == store.LeaseOK {
			d.until = now.Add(lease)
		}
	}
	return out, now.Add(lease), nil
}

func (m *memStore) Release(ctx context.Context, leases []store.Lease, countAttempt bool, now time.Time) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, l := range leases {
		if d, st := m.held(l); st == store.LeaseOK {
			d.until, d.token = time.Time{}, 0
			m.released = append(m.released, l)
			n++
		}
	}
	return n, nil
}

func (m *memStore) CountDead(ctx context.Context, topic, sub string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, d := range m.dels {
		if d.dead && d.msg.Topic == topic && d.sub == sub {
			n++
		}
	}
	return n, nil
}

func (m *memStore) Stats(ctx context.Context, now time.Time) ([]store.QueueStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	by := map[[2]string]*store.QueueStats{}
	for _, d := range m.dels {
		k := [2]string{d.msg.Topic, d.sub}
		if by[k] == nil {
			by[k] = &store.QueueStats{Topic: d.msg.Topic, Subscription: d.sub}
		}
		switch {
		case d.dead:
			by[k].Dead++
		case d.until.After(now):
			by[k].InFlight++
		default:
			by[k].Ready++
		}
	}
	var out []store.QueueStats
	for _, s := range by {
		out = append(out, *s)
	}
	return out, nil
}

func (m *memStore) AppendEvents(ctx context.Context, evs []store.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, evs...)
	return nil
}

// The rarer operations are not used by these tests; a call fails the test
// loudly.
func (m *memStore) ListDead(context.Context, string, string, string, uint64, int, int, time.Time) ([]store.DeadLetter, map[uint64]*store.Message, bool, error) {
	panic("memStore.ListDead")
}
func (m *memStore) Redrive(context.Context, store.RedriveRequest) (int64, error) {
	panic("memStore.Redrive")
}
func (m *memStore) DeadByCode(context.Context, store.RedriveRequest) (map[string]int64, error) {
	panic("memStore.DeadByCode")
}
func (m *memStore) PurgeDead(context.Context, string, string, string) (int64, error) {
	panic("memStore.PurgeDead")
}

func (m *memStore) DeleteDead(context.Context, string, string, []uint64) (int64, error) {
	panic("memStore.DeleteDead")
}
func (m *memStore) ArchiveDead(context.Context, string, string, time.Time, time.Time) (int64, error) {
	panic("memStore.ArchiveDead")
}
func (m *memStore) DropSubscription(context.Context, string, string, time.Time) (int64, error) {
	panic("memStore.DropSubscription")
}
func (m *memStore) Unpark(context.Context, string, string, time.Time) (int64, error) {
	panic("memStore.Unpark")
}

// fakeCluster is a cluster's call point over a memStore. While down, every
// call fails unavailable without reaching the store, as an open breaker
// answers. It counts calls by operation.
type fakeCluster struct {
	st   *memStore
	down atomic.Bool
	mu   sync.Mutex
	ops  map[string]int
}

var _ Cluster = (*fakeCluster)(nil)

func newFakeCluster() *fakeCluster { return &fakeCluster{st: newMemStore(), ops: map[string]int{}} }

func (c *fakeCluster) Do(ctx context.Context, op string, fn func(context.Context, Store) error) error {
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

// direct is a Cluster that runs every call on s as it is.
type direct struct{ s Store }

func (d direct) Do(ctx context.Context, _ string, fn func(context.Context, Store) error) error {
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
	t.Helper()
	m, err := routing.NewMap(1, []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: 1023, Cluster: "c2"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{table: routing.NewTable(m), c1: newFakeCluster(), c2: newFakeCluster()}
	subs := newFixedSubs(subscription.Subscription{Topic: "t", Name: "s", MaxAttempts: 2})
	f.b = New(cfg, f.table, map[string]Cluster{"c1": f.c1, "c2": f.c2}, subs, nil, idgen.New(nil), nil, nil)
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
