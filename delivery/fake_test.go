package delivery

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

// The owner's tests run against memTable, an in-memory stand-in for one
// cluster's primary with the answers store.Store gives on MariaDB for what
// owners ask (the store's own tests check the statements there), on a
// clock the test moves.

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type row struct {
	msg       *store.Message
	sub       string
	attempts  int
	token     uint64
	lockedBy  string
	available time.Time
	dead      bool
	parked    bool
	errorCode string
}

type ownerRow struct {
	owner, addr         string
	epoch               uint64
	leaseUntil, horizon time.Time
	// released: the lease no longer names its owner (ReleaseOwner), so
	// the owner's renewals leave it alone, as store's do.
	released bool
}

type memTable struct {
	clock *clock
	mu    sync.Mutex
	rows  map[[2]any]*row // (message id, subscription)
	own   map[[2]string]*ownerRow
	// calls counts store calls by name.
	calls   map[string]int
	flushed []store.OwnedFlush
	events  []string // "acked 12", "nacked 12", "dead 12", "expired 12"
	fail    error    // every call fails with it while set
	// failNext makes the next n calls of a name fail (errInjected).
	failNext map[string]int
	skipped  []int // the size of each skipping scan's skip set
	// onScan, when set, runs (once) as a scan starts, before it reads:
	// what another request does while a scan is on its way.
	onScan func()
}

func newMemTable(c *clock) *memTable {
	return &memTable{clock: c, rows: map[[2]any]*row{}, own: map[[2]string]*ownerRow{}, calls: map[string]int{}, failNext: map[string]int{}}
}

var _ Store = (*memTable)(nil)

var nextID uint64 = 1000

// add stores a message on topic t for sub with priority, order key and
// availability delay.
func (m *memTable) add(topic, sub string, prio int, orderKey string, delay time.Duration) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	nextID++
	msg := &store.Message{ID: nextID, Topic: topic, Key: fmt.Sprint("k", nextID), OrderKey: orderKey, Priority: prio,
		Payload: []byte(`{}`), PayloadJSON: true, VShard: uint16(nextID % 1024)}
	m.rows[[2]any{msg.ID, sub}] = &row{msg: msg, sub: sub, available: m.clock.now().Add(delay)}
	return msg.ID
}

// errInjected is the error of a call failNext fails.
var errInjected = errors.New("injected failure")

func (m *memTable) call(name string) error {
	m.calls[name]++
	if m.failNext[name] > 0 {
		m.failNext[name]--
		return errInjected
	}
	return m.fail
}

// ownerOf is a copy of (topic, sub)'s owner row.
func (m *memTable) ownerOf(topic, sub string) ownerRow {
	m.mu.Lock()
	defer m.mu.Unlock()
	return *m.own[[2]string{topic, sub}]
}

func (m *memTable) count(name string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[name]
}

func (m *memTable) get(id uint64, sub string) *row {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.rows[[2]any{id, sub}]
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

func (m *memTable) ScanClaimable(ctx context.Context, topic, sub string, now time.Time, after *store.ClaimCursor, limit int, exclude []uint16) ([]store.Candidate, error) {
	m.mu.Lock()
	hook := m.onScan
	m.onScan = nil
	m.mu.Unlock()
	if hook != nil {
		hook()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call("scan"); err != nil {
		return nil, err
	}
	var out []store.Candidate
	for _, r := range m.rows {
		if r.dead || r.parked || r.available.After(now) || r.msg.Topic != topic || r.sub != sub || slices.Contains(exclude, r.msg.VShard) {
			continue
		}
		c := store.Candidate{MessageID: r.msg.ID, VShard: r.msg.VShard, Priority: r.msg.Priority, OrderKey: r.msg.OrderKey,
			Attempts: r.attempts, ClaimToken: r.token}
		if after != nil && !(c.Priority < after.Priority || c.Priority == after.Priority && c.MessageID > after.MessageID) {
			continue
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Priority != out[j].Priority {
			return out[i].Priority > out[j].Priority
		}
		return out[i].MessageID < out[j].MessageID
	})
	return out[:min(len(out), limit)], nil
}

func (m *memTable) ScanClaimableSkipping(ctx context.Context, topic, sub string, now time.Time, after *store.ClaimCursor, limit int, exclude []uint16, skip map[uint64]bool) (store.Scan, error) {
	m.mu.Lock()
	m.skipped = append(m.skipped, len(skip))
	m.mu.Unlock()
	rows, err := m.ScanClaimable(ctx, topic, sub, now, after, limit, exclude)
	if err != nil {
		return store.Scan{}, err
	}
	return store.ScanOf(rows, skip), nil
}

func (m *memTable) heads(topic, sub string) map[string]uint64 {
	out := map[string]uint64{}
	for _, r := range m.rows {
		if r.dead || r.msg.Topic != topic || r.sub != sub || r.msg.OrderKey == "" {
			continue
		}
		if h, ok := out[r.msg.OrderKey]; !ok || r.msg.ID < h {
			out[r.msg.OrderKey] = r.msg.ID
		}
	}
	return out
}

func (m *memTable) OrderHeads(ctx context.Context, topic, sub string, keys []string) (map[string]uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call("heads"); err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for k, h := range m.heads(topic, sub) {
		if slices.Contains(keys, k) {
			out[k] = h
		}
	}
	return out, nil
}

func (m *memTable) Messages(ctx context.Context, ids []uint64) (map[uint64]*store.Message, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call("messages"); err != nil {
		return nil, err
	}
	out := map[uint64]*store.Message{}
	for _, r := range m.rows {
		if slices.Contains(ids, r.msg.ID) {
			out[r.msg.ID] = r.msg
		}
	}
	return out, nil
}

func (m *memTable) stale(u store.OwnedUnit) bool {
	o := m.own[[2]string{u.Topic, u.Subscription}]
	return o == nil || o.epoch != u.Epoch
}

// ClaimDurable is store.ClaimDurable: a lapsed lease counts as expired (dead
// at MaxAttempts); the others are leased with the attempt counted.
func (m *memTable) ClaimDurable(ctx context.Context, unit store.OwnedUnit, req store.ClaimRequest, ids []uint64) ([]store.Claimed, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call("durable"); err != nil {
		return nil, err
	}
	if m.stale(unit) {
		return nil, store.ErrStaleOwner
	}
	var out []store.Claimed
	for _, id := range ids {
		r := m.rows[[2]any{id, req.Subscription}]
		if r == nil || r.dead || r.parked || r.available.After(req.Now) {
			continue
		}
		if r.token != 0 {
			m.events = append(m.events, fmt.Sprint("expired ", id))
			if r.attempts >= req.MaxAttempts {
				r.dead, r.token, r.errorCode = true, 0, "lease_expired"
				m.events = append(m.events, fmt.Sprint("dead ", id))
				continue
			}
		}
		r.attempts++
		r.token, r.lockedBy, r.available = req.Token, req.Consumer, req.Now.Add(req.Lease)
		out = append(out, store.Claimed{Message: r.msg, Attempt: r.attempts, Token: r.token, LeaseExpires: r.available})
	}
	return out, nil
}

func (m *memTable) FlushOwned(ctx context.Context, batch []store.OwnedFlush, now time.Time) ([]store.OwnedResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call("flush"); err != nil {
		return nil, err
	}
	m.flushed = append(m.flushed, batch...)
	out := make([]store.OwnedResult, len(batch))
	for i, f := range batch {
		if m.stale(f.Unit) {
			out[i].Stale = true
			continue
		}
		u := f.Unit
		heads := m.heads(u.Topic, u.Subscription)
		for _, p := range f.Park {
			if h, ok := heads[p.OrderKey]; ok && h != p.MessageID {
				m.rows[[2]any{p.MessageID, u.Subscription}].parked = true
			}
		}
		unpark := func(key string) {
			delete(heads, key)
			heads = m.heads(u.Topic, u.Subscription)
			if h, ok := heads[key]; ok {
				if r := m.rows[[2]any{h, u.Subscription}]; r.parked {
					r.parked, r.available = false, now
				}
			}
		}
		r := &out[i]
		r.Acks = make([]bool, len(f.Acks))
		for j, a := range f.Acks {
			k := [2]any{a.MessageID, u.Subscription}
			if _, ok := m.rows[k]; ok {
				delete(m.rows, k)
				r.Acks[j] = true
				m.events = append(m.events, fmt.Sprint("acked ", a.MessageID))
				if a.Ordered && a.OrderKey != "" {
					unpark(a.OrderKey)
				}
			}
		}
		r.Nacks = make([]bool, len(f.Nacks))
		for j, n := range f.Nacks {
			row := m.rows[[2]any{n.MessageID, u.Subscription}]
			if row == nil || row.dead {
				continue
			}
			r.Nacks[j] = true
			row.attempts = max(row.attempts, n.Attempt)
			row.token, row.lockedBy, row.errorCode = 0, "", n.ErrorCode
			m.events = append(m.events, fmt.Sprint("nacked ", n.MessageID))
			if n.Dead {
				row.dead = true
				m.events = append(m.events, fmt.Sprint("dead ", n.MessageID))
				if n.Ordered && n.OrderKey != "" {
					unpark(n.OrderKey)
				}
				continue
			}
			row.available = n.RetryAt
		}
		r.Leases = make([]bool, len(f.Leases))
		for j, l := range f.Leases {
			row := m.rows[[2]any{l.MessageID, u.Subscription}]
			if row == nil || row.dead {
				continue
			}
			r.Leases[j] = true
			row.attempts = max(row.attempts, l.Attempt)
			row.token, row.lockedBy, row.available = l.Token, l.Consumer, l.Expires
		}
	}
	return out, nil
}

func (m *memTable) AcquireOwner(ctx context.Context, topic, sub, owner, addr string, ttl time.Duration) (store.OwnerGrant, store.OwnerRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call("acquire"); err != nil {
		return store.OwnerGrant{}, store.OwnerRecord{}, err
	}
	now := m.clock.now()
	k := [2]string{topic, sub}
	o := m.own[k]
	if o == nil {
		m.own[k] = &ownerRow{owner: owner, addr: addr, epoch: 1, leaseUntil: now.Add(ttl), horizon: now}
		return store.OwnerGrant{Epoch: 1, WaitUntil: now, ServerNow: now, LeaseUntil: now.Add(ttl)}, store.OwnerRecord{}, nil
	}
	if o.leaseUntil.After(now) && o.owner != owner {
		return store.OwnerGrant{}, store.OwnerRecord{Topic: topic, Subscription: sub, Owner: o.owner, Addr: o.addr, Epoch: o.epoch, Live: true}, store.ErrOwned
	}
	wait := o.horizon
	if wait.Before(now) {
		wait = now
	}
	o.owner, o.addr, o.epoch, o.leaseUntil, o.released = owner, addr, o.epoch+1, now.Add(ttl), false
	return store.OwnerGrant{Epoch: o.epoch, WaitUntil: wait, ServerNow: now, LeaseUntil: o.leaseUntil}, store.OwnerRecord{}, nil
}

func (m *memTable) RenewOwners(ctx context.Context, owner string, ttl, horizon time.Duration) ([]store.OwnedUnit, time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call("renew"); err != nil {
		return nil, time.Time{}, err
	}
	now := m.clock.now()
	var out []store.OwnedUnit
	for k, o := range m.own {
		if o.owner != owner || o.released {
			continue
		}
		o.leaseUntil = now.Add(ttl)
		if h := now.Add(horizon); h.After(o.horizon) {
			o.horizon = h
		}
		out = append(out, store.OwnedUnit{Topic: k[0], Subscription: k[1], Epoch: o.epoch})
	}
	return out, now, nil
}

func (m *memTable) ReleaseOwner(ctx context.Context, topic, sub, owner string, epoch uint64, leasesInTable bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call("release"); err != nil {
		return err
	}
	o := m.own[[2]string{topic, sub}]
	if o == nil || o.owner != owner || o.epoch != epoch {
		return nil
	}
	now := m.clock.now()
	o.leaseUntil, o.released = now, true
	if leasesInTable {
		o.horizon = now
	}
	return nil
}

func (m *memTable) Owners(ctx context.Context) ([]store.OwnerRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call("owners"); err != nil {
		return nil, err
	}
	now := m.clock.now()
	var out []store.OwnerRecord
	for k, o := range m.own {
		out = append(out, store.OwnerRecord{Topic: k[0], Subscription: k[1], Owner: o.owner, Addr: o.addr, Epoch: o.epoch,
			LeaseUntil: o.leaseUntil, Horizon: o.horizon, Live: o.leaseUntil.After(now)})
	}
	return out, nil
}

func (m *memTable) Beat(ctx context.Context, router, addr string, within time.Duration) ([]store.Member, time.Time, error) {
	m.mu.Lock()
	m.calls["beat "+router]++
	m.mu.Unlock()
	now := m.clock.now()
	return []store.Member{{Router: router, Addr: addr, SeenAt: now, SchemaVersion: store.SchemaVersion()}}, now, nil
}

func (m *memTable) LeaveMembers(ctx context.Context, router string, older time.Duration) error {
	m.mu.Lock()
	m.calls["leave "+router]++
	m.mu.Unlock()
	return nil
}

// tableCluster is a Cluster over a memTable.
type tableCluster struct{ t *memTable }

func (c tableCluster) Do(ctx context.Context, op string, fn func(context.Context, Store) error) error {
	return fn(ctx, c.t)
}

// leaseIDs lists the ids of the leases the owner holds in memory.
func (o *Owner) leaseIDs() []uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []uint64
	for id := range o.leases {
		out = append(out, id)
	}
	return out
}
