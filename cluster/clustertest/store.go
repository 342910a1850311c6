// Package clustertest holds an in-memory fake of the store operations the
// router runs on a cluster (cluster.Store), for tests that need no
// database. The contract suite in package cluster holds it to what the
// real store (store.Store on MariaDB) does, so that it cannot drift.
package clustertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/shardmq/shardmq/store"
)

// Store keeps one cluster's messages and deliveries in memory.
//
// Its fields are for tests to inspect, under Mu.
type Store struct {
	Mu       sync.Mutex
	Keys     map[string]*store.Message // topic\x00key → holder
	ids      map[uint64]bool
	Dels     map[delKey]*memDelivery
	events   []store.Event
	Batches  []int // items per Produce call, in order
	claims   [][]store.ClaimRequest
	Acks     [][]store.Lease
	released []store.Lease
	owners   map[[2]string]*memOwner
	flushes  int

	// Gate, when set, is called at the start of Produce ("produce"),
	// ClaimMany ("claim") and FlushOwned ("ack"): tests hold a call
	// there.
	Gate func(op string)
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

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{Keys: map[string]*store.Message{}, ids: map[uint64]bool{}, Dels: map[delKey]*memDelivery{}}
}

// ErrTakenID is the refusal of a batch that reuses a message id, as the
// database refuses a duplicate primary key: not an outage.
var ErrTakenID = errors.New("duplicate message id")

// Produce registers keys, answers duplicates and conflicts, and refuses the
// whole batch (applying nothing) when an item reuses an id or carries
// headers longer than their column — as one transaction does.
func (m *Store) Produce(ctx context.Context, items []store.ProduceItem) ([]store.ProduceResult, error) {
	if m.Gate != nil {
		m.Gate("produce")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	m.Mu.Lock()
	defer m.Mu.Unlock()
	m.Batches = append(m.Batches, len(items))
	seen := map[uint64]bool{}
	for _, it := range items {
		if m.ids[it.Msg.ID] || seen[it.Msg.ID] {
			return nil, fmt.Errorf("%w %d", ErrTakenID, it.Msg.ID)
		}
		seen[it.Msg.ID] = true
		if len(it.Msg.Headers) > store.MaxHeadersBytes {
			return nil, fmt.Errorf("%w: headers of %d bytes", store.ErrInvalidData, len(it.Msg.Headers))
		}
	}
	out := make([]store.ProduceResult, len(items))
	for i, it := range items {
		k := it.Msg.Topic + "\x00" + it.Msg.Key
		if h, ok := m.Keys[k]; ok {
			st := store.Conflict
			if string(h.Payload) == string(it.Msg.Payload) {
				st = store.Duplicate
			}
			out[i] = store.ProduceResult{Status: st, ID: h.ID, VShard: h.VShard}
			continue
		}
		m.Keys[k] = it.Msg
		m.ids[it.Msg.ID] = true
		for _, sub := range it.Subscriptions {
			m.Dels[delKey{it.Msg.ID, sub}] = &memDelivery{msg: it.Msg, sub: sub}
		}
		out[i] = store.ProduceResult{Status: store.Created, ID: it.Msg.ID}
	}
	return out, nil
}

// PeekClaimable lists what ClaimMany would take now, in its order
// (highest priority, then oldest), locking nothing.
func (m *Store) PeekClaimable(ctx context.Context, topic, sub string, now time.Time, max int, dead bool, errorCode string, exclude []uint16) ([]store.ClaimHead, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	var out []store.ClaimHead
	for _, d := range m.Dels {
		if !d.dead && !d.until.After(now) && d.msg.Topic == topic && d.sub == sub && !slices.Contains(exclude, d.msg.VShard) {
			out = append(out, store.ClaimHead{Priority: d.msg.Priority, MessageID: d.msg.ID})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Priority != out[j].Priority {
			return out[i].Priority > out[j].Priority
		}
		return out[i].MessageID < out[j].MessageID
	})
	return out[:min(len(out), max)], nil
}

// ClaimMany leases ready deliveries, highest priority then oldest first,
// each request its own.
func (m *Store) ClaimMany(ctx context.Context, reqs []store.ClaimRequest) ([][]store.Claimed, error) {
	if m.Gate != nil {
		m.Gate("claim")
	}
	m.Mu.Lock()
	defer m.Mu.Unlock()
	m.claims = append(m.claims, slices.Clone(reqs))
	var ready []*memDelivery
	for _, d := range m.Dels {
		if !d.dead && !d.until.After(reqs[0].Now) && d.msg.Topic == reqs[0].Topic && d.sub == reqs[0].Subscription &&
			!slices.Contains(reqs[0].ExcludeVShards, d.msg.VShard) {
			ready = append(ready, d)
		}
	}
	sort.Slice(ready, func(i, j int) bool {
		if ready[i].msg.Priority != ready[j].msg.Priority {
			return ready[i].msg.Priority > ready[j].msg.Priority
		}
		return ready[i].msg.ID < ready[j].msg.ID
	})
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
func (m *Store) held(l store.Lease) (*memDelivery, store.LeaseStatus) {
	d, ok := m.Dels[delKey{l.MessageID, l.Subscription}]
	switch {
	case !ok:
		return nil, store.LeaseNotFound
	case d.token != l.Token || d.until.IsZero():
		return d, store.LeaseLost
	}
	return d, store.LeaseOK
}

func (m *Store) AckMany(ctx context.Context, groups []store.AckGroup, now time.Time) []store.AckResult {
	out := make([]store.AckResult, len(groups))
	for i, g := range groups {
		out[i].Statuses, out[i].Err = m.Ack(ctx, g.Leases, now)
	}
	return out
}

func (m *Store) Ack(ctx context.Context, leases []store.Lease, now time.Time) ([]store.LeaseStatus, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	m.Acks = append(m.Acks, slices.Clone(leases))
	out := make([]store.LeaseStatus, len(leases))
	for i, l := range leases {
		_, out[i] = m.held(l)
		if out[i] == store.LeaseOK {
			delete(m.Dels, delKey{l.MessageID, l.Subscription})
		}
	}
	return out, nil
}

func (m *Store) Nack(ctx context.Context, items []store.NackItem, policy func(topic, sub string) store.RetryPolicy, rnd func() float64, now time.Time) ([]store.NackResult, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
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

func (m *Store) Extend(ctx context.Context, leases []store.Lease, lease time.Duration, now time.Time) ([]store.LeaseStatus, time.Time, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	out := make([]store.LeaseStatus, len(leases))
	for i, l := range leases {
		var d *memDelivery
		if d, out[i] = m.held(l); out[i] == store.LeaseOK {
			d.until = now.Add(lease)
		}
	}
	return out, now.Add(lease), nil
}

func (m *Store) Release(ctx context.Context, leases []store.Lease, countAttempt bool, now time.Time) (int64, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
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

func (m *Store) CountDead(ctx context.Context, topic, sub string) (int64, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	var n int64
	for _, d := range m.Dels {
		if d.dead && d.msg.Topic == topic && d.sub == sub {
			n++
		}
	}
	return n, nil
}

func (m *Store) Stats(ctx context.Context, now time.Time) ([]store.QueueStats, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	by := map[[2]string]*store.QueueStats{}
	for _, d := range m.Dels {
		k := [2]string{d.msg.Topic, d.sub}
		if by[k] == nil {
			by[k] = &store.QueueStats{Topic: d.msg.Topic, Subscription: d.sub}
		}
		switch {
		case d.dead:
			by[k].Dead++
		case d.until.After(now) && d.token == 0:
			by[k].Delayed++ // a retry's backoff
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

func (m *Store) AppendEvents(ctx context.Context, evs []store.Event) error {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	m.events = append(m.events, evs...)
	return nil
}

// The rarer operations are not used by these tests; a call fails the test
// loudly.
func (m *Store) ListDead(context.Context, string, string, string, uint64, int, int, time.Time) ([]store.DeadLetter, map[uint64]*store.Message, bool, error) {
	panic("Store.ListDead")
}
func (m *Store) Redrive(context.Context, store.RedriveRequest) (int64, error) {
	panic("Store.Redrive")
}
func (m *Store) DeadByCode(context.Context, store.RedriveRequest) (map[string]int64, error) {
	panic("Store.DeadByCode")
}
func (m *Store) PurgeDead(context.Context, string, string, string) (int64, error) {
	panic("Store.PurgeDead")
}

func (m *Store) DeleteDead(context.Context, string, string, []uint64) (int64, error) {
	panic("Store.DeleteDead")
}
func (m *Store) ArchiveDead(context.Context, string, string, time.Time, time.Time) (int64, error) {
	panic("Store.ArchiveDead")
}
func (m *Store) DropSubscription(context.Context, string, string, time.Time) (int64, error) {
	panic("Store.DropSubscription")
}
func (m *Store) Unpark(context.Context, string, string, time.Time) (int64, error) {
	panic("Store.Unpark")
}
