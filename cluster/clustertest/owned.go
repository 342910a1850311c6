package clustertest

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/shardmq/shardmq/store"
)

// What owners need of Store (delivery.Store), in memory: the same
// answers the store gives on MariaDB for the cases the broker's tests
// drive (the store's suite checks the real statements).

type memOwner struct {
	owner, addr         string
	epoch               uint64
	leaseUntil, horizon time.Time
}

func (m *Store) owned() map[[2]string]*memOwner {
	if m.owners == nil {
		m.owners = map[[2]string]*memOwner{}
	}
	return m.owners
}

func (m *Store) ScanClaimable(ctx context.Context, topic, sub string, now time.Time, after *store.ClaimCursor, limit int, exclude []uint16) ([]store.Candidate, error) {
	if m.Gate != nil {
		m.Gate("claim")
	}
	m.Mu.Lock()
	defer m.Mu.Unlock()
	var out []store.Candidate
	for _, d := range m.Dels {
		if d.dead || d.until.After(now) || d.msg.Topic != topic || d.sub != sub || slices.Contains(exclude, d.msg.VShard) {
			continue
		}
		c := store.Candidate{MessageID: d.msg.ID, VShard: d.msg.VShard, Priority: d.msg.Priority, OrderKey: d.msg.OrderKey,
			Attempts: d.attempts, ClaimToken: d.token}
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

func (m *Store) ScanClaimableSkipping(ctx context.Context, topic, sub string, now time.Time, after *store.ClaimCursor, limit int, exclude []uint16, skip map[uint64]bool) (store.Scan, error) {
	rows, err := m.ScanClaimable(ctx, topic, sub, now, after, limit, exclude)
	if err != nil {
		return store.Scan{}, err
	}
	return store.ScanOf(rows, skip), nil
}

func (m *Store) OrderHeads(ctx context.Context, topic, sub string, keys []string) (map[string]uint64, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	out := map[string]uint64{}
	for _, d := range m.Dels {
		if d.dead || d.msg.Topic != topic || d.sub != sub || !slices.Contains(keys, d.msg.OrderKey) {
			continue
		}
		if h, ok := out[d.msg.OrderKey]; !ok || d.msg.ID < h {
			out[d.msg.OrderKey] = d.msg.ID
		}
	}
	return out, nil
}

func (m *Store) Messages(ctx context.Context, ids []uint64) (map[uint64]*store.Message, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	out := map[uint64]*store.Message{}
	for _, d := range m.Dels {
		if slices.Contains(ids, d.msg.ID) {
			out[d.msg.ID] = d.msg
		}
	}
	return out, nil
}

func (m *Store) stale(u store.OwnedUnit) bool {
	o := m.owned()[[2]string{u.Topic, u.Subscription}]
	return o == nil || o.epoch != u.Epoch
}

func (m *Store) ClaimDurable(ctx context.Context, unit store.OwnedUnit, req store.ClaimRequest, ids []uint64) ([]store.Claimed, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	if m.stale(unit) {
		return nil, store.ErrStaleOwner
	}
	m.claims = append(m.claims, []store.ClaimRequest{req})
	var out []store.Claimed
	for _, id := range ids {
		d, ok := m.Dels[delKey{id, req.Subscription}]
		if !ok || d.dead || d.until.After(req.Now) {
			continue
		}
		d.attempts++
		d.token, d.until = req.Token, req.Now.Add(req.Lease)
		out = append(out, store.Claimed{Message: d.msg, Attempt: d.attempts, Token: d.token, LeaseExpires: d.until})
	}
	return out, nil
}

func (m *Store) FlushOwned(ctx context.Context, batch []store.OwnedFlush, now time.Time) ([]store.OwnedResult, error) {
	if m.Gate != nil {
		m.Gate("ack")
	}
	m.Mu.Lock()
	defer m.Mu.Unlock()
	m.flushes++
	out := make([]store.OwnedResult, len(batch))
	for i, f := range batch {
		if m.stale(f.Unit) {
			out[i].Stale = true
			continue
		}
		sub := f.Unit.Subscription
		r := &out[i]
		r.Acks = make([]bool, len(f.Acks))
		var leases []store.Lease
		for j, a := range f.Acks {
			k := delKey{a.MessageID, sub}
			if _, ok := m.Dels[k]; ok {
				delete(m.Dels, k)
				r.Acks[j] = true
				leases = append(leases, store.Lease{MessageID: a.MessageID, Subscription: sub})
			}
		}
		if len(leases) > 0 {
			m.Acks = append(m.Acks, leases)
		}
		r.Nacks = make([]bool, len(f.Nacks))
		for j, n := range f.Nacks {
			d, ok := m.Dels[delKey{n.MessageID, sub}]
			if !ok || d.dead {
				continue
			}
			r.Nacks[j] = true
			d.attempts = max(d.attempts, n.Attempt)
			d.token = 0
			if n.Dead {
				d.dead, d.until = true, time.Time{}
			} else {
				d.until = n.RetryAt
			}
		}
		r.Leases = make([]bool, len(f.Leases))
		for j, l := range f.Leases {
			d, ok := m.Dels[delKey{l.MessageID, sub}]
			if !ok || d.dead {
				continue
			}
			r.Leases[j] = true
			d.attempts = max(d.attempts, l.Attempt)
			d.token, d.until = l.Token, l.Expires
		}
	}
	return out, nil
}

func (m *Store) AcquireOwner(ctx context.Context, topic, sub, owner, addr string, ttl time.Duration) (store.OwnerGrant, store.OwnerRecord, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	now := time.Now()
	k := [2]string{topic, sub}
	o := m.owned()[k]
	if o == nil {
		m.owned()[k] = &memOwner{owner: owner, addr: addr, epoch: 1, leaseUntil: now.Add(ttl), horizon: now}
		return store.OwnerGrant{Epoch: 1, WaitUntil: now, ServerNow: now, LeaseUntil: now.Add(ttl)}, store.OwnerRecord{}, nil
	}
	if o.leaseUntil.After(now) && o.owner != owner {
		return store.OwnerGrant{}, store.OwnerRecord{Topic: topic, Subscription: sub, Owner: o.owner, Addr: o.addr, Epoch: o.epoch,
			LeaseUntil: o.leaseUntil, Horizon: o.horizon, Live: true}, store.ErrOwned
	}
	wait := o.horizon
	if wait.Before(now) {
		wait = now
	}
	o.owner, o.addr, o.epoch, o.leaseUntil = owner, addr, o.epoch+1, now.Add(ttl)
	return store.OwnerGrant{Epoch: o.epoch, WaitUntil: wait, ServerNow: now, LeaseUntil: o.leaseUntil}, store.OwnerRecord{}, nil
}

func (m *Store) RenewOwners(ctx context.Context, owner string, ttl, horizon time.Duration) ([]store.OwnedUnit, time.Time, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	now := time.Now()
	var out []store.OwnedUnit
	for k, o := range m.owned() {
		if o.owner != owner {
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

func (m *Store) ReleaseOwner(ctx context.Context, topic, sub, owner string, epoch uint64, leasesInTable bool) error {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	o := m.owned()[[2]string{topic, sub}]
	if o == nil || o.owner != owner || o.epoch != epoch {
		return nil
	}
	now := time.Now()
	o.leaseUntil = now
	if leasesInTable {
		o.horizon = now
	}
	return nil
}

func (m *Store) Owners(ctx context.Context) ([]store.OwnerRecord, error) {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	now := time.Now()
	var out []store.OwnerRecord
	for k, o := range m.owned() {
		out = append(out, store.OwnerRecord{Topic: k[0], Subscription: k[1], Owner: o.owner, Addr: o.addr, Epoch: o.epoch,
			LeaseUntil: o.leaseUntil, Horizon: o.horizon, Live: o.leaseUntil.After(now)})
	}
	return out, nil
}

func (m *Store) Beat(ctx context.Context, router, addr string, within time.Duration) ([]store.Member, time.Time, error) {
	now := time.Now()
	return []store.Member{{Router: router, Addr: addr, SeenAt: now, SchemaVersion: store.SchemaVersion()}}, now, nil
}

func (m *Store) LeaveMembers(ctx context.Context, router string, older time.Duration) error {
	return nil
}
