package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// The owned consume path (docs/consume.md, "Owners"). The router that owns
// a unit — a subscription on one cluster, recorded in delivery_owner —
// hands out first attempts from its memory: the claim writes nothing. What
// happens to them afterwards is written here, in flushes that carry many
// units' outcomes in one transaction, each unit fenced by its epoch:
// acks (delete, `acked` event, status), nacks (retry or dead letter, their
// events), leases written to the table (on expiry, hand-over or a
// cut-over; from then on they are durable leases, fenced by their claim
// token as before) and parking behind an ordered key's head. A retry's
// claim is durable (ClaimDurable): its attempt is counted in the table
// before the consumer sees it.

// ErrStaleOwner: the unit's epoch in delivery_owner is not the caller's —
// another router took it over — so nothing was written.
var ErrStaleOwner = errors.New("delivery owner epoch is stale")

// OwnedAck is an ack of a lease held in an owner's memory.
type OwnedAck struct {
	MessageID uint64
	VShard    uint16
	OrderKey  string
	// Ordered: finishing it lets the next delivery of its order key go.
	Ordered   bool
	Consumer  string
	Attempt   int
	ClaimedAt time.Time
	RequestID string
}

// OwnedNack is a nack of a lease held in an owner's memory, decided by the
// owner: a dead letter, or a retry at RetryAt.
type OwnedNack struct {
	OwnedAck
	ErrorCode, Error string
	Dead             bool
	RetryAt          time.Time
}

// OwnedLease is a lease held in an owner's memory, to be written into the
// table as a durable lease.
type OwnedLease struct {
	MessageID          uint64
	VShard             uint16
	Token              uint64
	Consumer           string
	Attempt            int
	ClaimedAt, Expires time.Time
}

// OwnedPark is a delivery an ordered claim found behind its key's head.
type OwnedPark struct {
	MessageID uint64
	OrderKey  string
}

// OwnedFlush is one unit's share of a flush.
type OwnedFlush struct {
	Unit   OwnedUnit
	Acks   []OwnedAck
	Nacks  []OwnedNack
	Leases []OwnedLease
	Park   []OwnedPark
}

// OwnedResult is a unit's outcome: Stale when its epoch was not current
// (nothing of it was written); else, per item in order, whether its
// delivery was there to act on (false: gone — its subscription deleted,
// purged, or moved).
type OwnedResult struct {
	Stale  bool
	Acks   []bool
	Nacks  []bool
	Leases []bool
}

// errFlushRecount: an ack's delete found fewer rows than it named; the
// flush runs again reading which are there.
var errFlushRecount = errors.New("flush: a delivery is gone; recount")

// FlushOwned writes several units' outcomes in one transaction (see
// OwnedFlush). When the transaction fails, err says why and nothing was
// written; results are then nil, except that ErrOutcomeUnknown says it
// may have been written: its COMMIT went unanswered (a fast flush found
// to have committed answers as one that did, see lostCommit). A
// batch of acks alone, the common case, takes a path of fewer round
// trips (owned_fast.go) with the same outcomes, locks and answers.
func (s *Store) FlushOwned(ctx context.Context, batch []OwnedFlush, now time.Time) ([]OwnedResult, error) {
	out, path, err := s.flushOwned(ctx, batch, now, true)
	var lost *lostCommit
	if path == flushFast && errors.As(err, &lost) && lost.committed(ctx, s.db) {
		return allAcked(batch), nil
	}
	return out, err
}

// flushPath says which way a flush went (tests check it).
type flushPath int

const (
	// flushGeneral: the general path (flushIn) alone: not a batch of acks
	// alone, or not asked to try the fast path.
	flushGeneral flushPath = iota
	// flushFast: the fast path wrote the flush.
	flushFast
	// flushRefused: the fast path's fence or epoch probe refused it; the
	// general path answered (a FenceError, or which units are stale).
	flushRefused
	// flushRecount: the fast path found a delivery gone; the general
	// path's careful pass answered.
	flushRecount
)

// flushOwned is FlushOwned, trying the fast path first when fast is set.
func (s *Store) flushOwned(ctx context.Context, batch []OwnedFlush, now time.Time, fast bool) ([]OwnedResult, flushPath, error) {
	path := flushGeneral
	if fast && fastFlushable(ctx, batch) {
		out, p, err := s.flushAcksFast(ctx, batch, now)
		if err != nil {
			return nil, p, err
		}
		if p == flushFast {
			return out, p, nil
		}
		path = p
	}
	out, err := s.flushInTx(ctx, batch, now, path == flushRecount)
	return out, path, err
}

// flushInTx is the general path: flushIn in a transaction of inTx, run
// again carefully (reading which deliveries are there) when an ack's
// delivery is gone, or carefully from the start when careful is set.
func (s *Store) flushInTx(ctx context.Context, batch []OwnedFlush, now time.Time, careful bool) ([]OwnedResult, error) {
	var out []OwnedResult
	var died []OwnedUnit
	for {
		err := s.inTx(ctx, txAttempts, s.retryHook("flush"), func(tx *sql.Tx) error {
			var err error
			died = died[:0]
			out, err = s.flushIn(ctx, tx, batch, now, careful, func(u OwnedUnit) { died = append(died, u) })
			return err
		})
		if errors.Is(err, errFlushRecount) && !careful {
			careful = true
			continue
		}
		if err != nil {
			return nil, err
		}
		break
	}
	for _, u := range died {
		s.counted(u.Topic, u.Subscription, EventDeadLettered, 1)
	}
	return out, nil
}

func (s *Store) flushIn(ctx context.Context, tx *sql.Tx, batch []OwnedFlush, now time.Time, careful bool, onDeath func(OwnedUnit)) ([]OwnedResult, error) {
	units := make([]OwnedUnit, len(batch))
	for i, f := range batch {
		units[i] = f.Unit
	}
	stale, err := ownerFence(ctx, tx, units)
	if err != nil {
		return nil, err
	}
	out := make([]OwnedResult, len(batch))
	var events []Event
	var dead []uint64
	var acked []unitAck
	var unpark []delivery
	for i, f := range batch {
		u := f.Unit
		if stale[u] {
			out[i].Stale = true
			continue
		}
		// Parking first: an ack below that finishes the head un-parks
		// what this parks.
		if err := s.parkBehind(ctx, tx, u, f.Park); err != nil {
			return nil, err
		}
		r := &out[i]
		r.Acks = make([]bool, len(f.Acks))
		if len(f.Acks) > 0 {
			ids := make([]uint64, len(f.Acks))
			for j, a := range f.Acks {
				ids[j] = a.MessageID
			}
			there := map[uint64]bool{}
			if careful {
				if there, err = lockLive(ctx, tx, u.Subscription, ids); err != nil {
					return nil, err
				}
				var keep []uint64
				for _, id := range ids {
					if there[id] {
						keep = append(keep, id)
					}
				}
				ids = keep
			}
			if len(ids) > 0 {
				// Order rows first, in the order a head read locks.
				var keyed []uint64
				for _, a := range f.Acks {
					if a.OrderKey != "" && (!careful || there[a.MessageID]) {
						keyed = append(keyed, a.MessageID)
					}
				}
				if len(keyed) > 0 {
					if err := deleteOrderRows(ctx, tx, u.Subscription, keyed); err != nil {
						return nil, err
					}
				}
				n, err := deleteOwned(ctx, tx, u.Subscription, ids)
				if err != nil {
					return nil, err
				}
				if int(n) != len(ids) {
					return nil, errFlushRecount
				}
			}
			for j, a := range f.Acks {
				if careful && !there[a.MessageID] {
					continue
				}
				r.Acks[j] = true
				d := delivery{messageID: a.MessageID, vshard: a.VShard, subscription: u.Subscription, topic: u.Topic, orderKey: a.OrderKey}
				acked = append(acked, unitAck{d, a})
				if a.Ordered && a.OrderKey != "" {
					unpark = append(unpark, d)
				}
			}
		}
		r.Nacks = make([]bool, len(f.Nacks))
		for j, n := range f.Nacks {
			d := delivery{messageID: n.MessageID, vshard: n.VShard, subscription: u.Subscription, topic: u.Topic, orderKey: n.OrderKey}
			var ok bool
			if n.Dead {
				ok, err = killOwned(ctx, tx, u.Subscription, n.MessageID, n.Attempt, now, n.ErrorCode, n.Error)
			} else {
				ok, err = retryOwned(ctx, tx, u.Subscription, n.MessageID, n.Attempt, n.RetryAt, n.ErrorCode, n.Error)
			}
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			r.Nacks[j] = true
			nacked := s.event(now, d, EventNacked, n.Consumer, n.Attempt, n.ErrorCode, n.Error)
			nacked.ClaimedAt, nacked.RequestID = n.ClaimedAt, n.RequestID
			events = append(events, nacked)
			if n.Dead {
				ev := s.event(now, d, EventDeadLettered, n.Consumer, n.Attempt, n.ErrorCode, n.Error)
				ev.RequestID = n.RequestID
				events = append(events, ev)
				dead = append(dead, n.MessageID)
				onDeath(u)
				if n.Ordered && n.OrderKey != "" {
					unpark = append(unpark, d)
				}
				continue
			}
			ev := s.event(now, d, EventRetryScheduled, n.Consumer, n.Attempt, n.ErrorCode, "")
			ev.RequestID = n.RequestID
			events = append(events, ev)
		}
		if r.Leases, err = materializeOwnedAll(ctx, tx, u.Subscription, f.Leases); err != nil {
			return nil, err
		}
	}
	if err := s.unparkNext(ctx, tx, unpark, now); err != nil {
		return nil, err
	}
	evs, err := s.finishAcks(ctx, tx, acked, now)
	if err != nil {
		return nil, err
	}
	if err := insertEvents(ctx, tx, append(events, evs...)); err != nil {
		return nil, err
	}
	if len(dead) > 0 {
		if err := markDead(ctx, tx, dead, now); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// unitAck is an ack a flush deleted the delivery of.
type unitAck struct {
	d delivery
	a OwnedAck
}

// finishAcks writes what acks leave besides the deleted deliveries. The
// final ack of a message — no delivery of it left, the common case — is
// written on its row in the update that marks it consumed (markAcked, one
// update per group of acks that share their subscription, consumer,
// attempt, claim time and request); the others, and a final ack whose
// row the update did not change (gone, or consumed already), are the
// `acked` trace events it returns.
func (s *Store) finishAcks(ctx context.Context, tx *sql.Tx, acked []unitAck, now time.Time) ([]Event, error) {
	if len(acked) == 0 {
		return nil, nil
	}
	ids := make([]uint64, len(acked))
	for i, x := range acked {
		ids[i] = x.a.MessageID
	}
	left, err := withDeliveries(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	p := s.planAcks(acked, left, now)
	events := p.traced
	for _, g := range p.groups {
		n, err := markAcked(ctx, tx, g.ids, g.k, p.at)
		if err != nil {
			return nil, err
		}
		if int(n) == len(g.ids) {
			continue
		}
		evs, err := s.unmarked(ctx, tx, g, p)
		if err != nil {
			return nil, err
		}
		events = append(events, evs...)
	}
	return events, nil
}

// ackPlan is what finishAcks writes for acks once it knows which of their
// messages still have a delivery.
type ackPlan struct {
	// traced: the acks that leave a delivery of their message, as trace
	// events.
	traced []Event
	// groups: the final acks, one markAcked each.
	groups []ackGroup
	// now is the flush's time, the trace events'; at is the time
	// markAcked writes, now to the microsecond: the row's time is what
	// ackedOn compares, and the driver sends nanoseconds, which MariaDB
	// truncates and MySQL rounds.
	at, now time.Time
}

// ackGroup is final acks that share their finalAck.
type ackGroup struct {
	k    finalAck
	acks []unitAck
	ids  []uint64
}

// planAcks sorts acked (in order) into traced events and groups of final
// acks, given left, the messages that still have a delivery (which it
// changes: a second ack of a message in one flush is not final).
func (s *Store) planAcks(acked []unitAck, left map[uint64]bool, now time.Time) ackPlan {
	p := ackPlan{at: now.Truncate(time.Microsecond), now: now}
	columns := s.slotsOff.Load()
	index := map[finalAck]int{}
	// Two passes: each final ack's group first, then the groups filled
	// in slices of their size (a flush carries some hundred acks of a
	// few requests; growing the slices one ack at a time was a tenth of
	// the flush's CPU in the router).
	group := make([]int, len(acked))
	var sizes []int
	for j, x := range acked {
		if left[x.a.MessageID] {
			group[j] = -1
			p.traced = append(p.traced, s.ackedEvent(x, now))
			continue
		}
		k := finalAck{sub: x.d.subscription, consumer: x.a.Consumer, request: x.a.RequestID, attempt: x.a.Attempt, claimedAt: x.a.ClaimedAt.UTC(), columns: columns}
		i, ok := index[k]
		if !ok {
			i = len(p.groups)
			index[k] = i
			p.groups = append(p.groups, ackGroup{k: k})
			sizes = append(sizes, 0)
		}
		group[j] = i
		sizes[i]++
		left[x.a.MessageID] = true // a second ack of it in this flush is no longer final
	}
	for i := range p.groups {
		p.groups[i].acks = make([]unitAck, 0, sizes[i])
		p.groups[i].ids = make([]uint64, 0, sizes[i])
	}
	for j, x := range acked {
		if i := group[j]; i >= 0 {
			g := &p.groups[i]
			g.acks = append(g.acks, x)
			g.ids = append(g.ids, x.a.MessageID)
		}
	}
	return p
}

// unmarked is the trace events of those of g's acks whose row markAcked
// did not change (it changed fewer rows than g has).
func (s *Store) unmarked(ctx context.Context, q queryer, g ackGroup, p ackPlan) ([]Event, error) {
	on, err := ackedOn(ctx, q, g.ids, g.k, p.at)
	if err != nil {
		return nil, err
	}
	var events []Event
	for _, x := range g.acks {
		if !on[x.a.MessageID] {
			events = append(events, s.ackedEvent(x, p.now))
		}
	}
	return events, nil
}

// ackedEvent is x's `acked` trace event.
func (s *Store) ackedEvent(x unitAck, now time.Time) Event {
	ev := s.event(now, x.d, EventAcked, x.a.Consumer, x.a.Attempt, "", "")
	ev.ClaimedAt, ev.RequestID = x.a.ClaimedAt, x.a.RequestID
	return ev
}

// parkBehind parks those of ps that are still not the head of their order
// key. The heads are read with a shared lock: an ack of a head running
// at the same time either finishes first (its successor is then the head
// and is not parked) or waits for this transaction and un-parks it.
func (s *Store) parkBehind(ctx context.Context, tx *sql.Tx, u OwnedUnit, ps []OwnedPark) error {
	if len(ps) == 0 {
		return nil
	}
	seen := map[string]bool{}
	var keys []string
	for _, p := range ps {
		if !seen[p.OrderKey] {
			seen[p.OrderKey] = true
			keys = append(keys, p.OrderKey)
		}
	}
	heads, err := s.lockOrderHeads(ctx, tx, u.Topic, u.Subscription, keys)
	if err != nil {
		return err
	}
	var park []uint64
	for _, p := range ps {
		if h, ok := heads[p.OrderKey]; ok && h != p.MessageID {
			park = append(park, p.MessageID)
		}
	}
	if len(park) == 0 {
		return nil
	}
	return parkDeliveries(ctx, tx, u.Subscription, park)
}

// ClaimDurable leases the deliveries ids of req's subscription that are
// still claimable, as a claim always did: in one transaction, the attempt
// counted and the lease (req.Token) written before the consumer sees it,
// a lapsed lease traced lease_expired or dead at MaxAttempts. The owner
// uses it for every delivery that is not on its first attempt, so that a
// message that keeps failing dies after MaxAttempts whatever happens to
// owners. unit's epoch fences it (ErrStaleOwner).
func (s *Store) ClaimDurable(ctx context.Context, unit OwnedUnit, req ClaimRequest, ids []uint64) ([]Claimed, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	out, err := s.claimWith(ctx, []ClaimRequest{req}, func(tx *sql.Tx) ([]delivery, error) {
		stale, err := ownerFence(ctx, tx, []OwnedUnit{unit})
		if err != nil {
			return nil, err
		}
		if stale[unit] {
			return nil, ErrStaleOwner
		}
		return lockClaimable(ctx, tx, req.Topic, req.Subscription, ids, req.Now)
	})
	if err != nil {
		return nil, fmt.Errorf("durable claim: %w", err)
	}
	return out[0], nil
}

// Messages reads messages by id with their bodies (an owner's claim reads
// the bodies of what it hands out).
func (s *Store) Messages(ctx context.Context, ids []uint64) (map[uint64]*Message, error) {
	out, err := selectMessages(ctx, s.db, ids)
	if err != nil {
		return nil, fmt.Errorf("read message bodies: %w", translate(err))
	}
	return out, nil
}
