package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/shardmq/shardmq/delivery"
	"github.com/shardmq/shardmq/store"
)

// The operations without batching: each is one call of the primary's call
// point, named for metrics by its Op constant.

// PeekClaimable reads, without locks, the claim order of what a claim
// would take now (claims that span clusters merge these).
func (c *Cluster) PeekClaimable(ctx context.Context, topic, sub string, now time.Time, max int, dead bool, errorCode string, exclude []uint16) (heads []store.ClaimHead, err error) {
	err = c.conn.Do(ctx, OpPeekClaim, func(ctx context.Context, s Store) (err error) {
		heads, err = s.PeekClaimable(ctx, topic, sub, now, max, dead, errorCode, exclude)
		return err
	})
	return heads, err
}

// AnyClaimable says whether a subscription has a claimable delivery,
// reading without a unit's owner.
func (c *Cluster) AnyClaimable(ctx context.Context, topic, sub string, now time.Time, exclude []uint16) (found bool, err error) {
	err = c.conn.Do(ctx, delivery.OpScan, func(ctx context.Context, s Store) error {
		got, err := s.ScanClaimable(ctx, topic, sub, now, nil, 1, exclude)
		found = len(got) > 0
		return err
	})
	return found, err
}

// Nack fails durable leases: retried with policy's backoff, or dead.
func (c *Cluster) Nack(ctx context.Context, items []store.NackItem, policy func(topic, sub string) store.RetryPolicy, rnd func() float64, now time.Time) (res []store.NackResult, err error) {
	err = c.conn.Do(ctx, OpNack, func(ctx context.Context, s Store) (err error) {
		res, err = s.Nack(ctx, items, policy, rnd, now)
		return err
	})
	return res, err
}

// Extend moves durable leases' expiry to now + lease.
func (c *Cluster) Extend(ctx context.Context, leases []store.Lease, lease time.Duration, now time.Time) (st []store.LeaseStatus, expires time.Time, err error) {
	err = c.conn.Do(ctx, OpExtend, func(ctx context.Context, s Store) (err error) {
		st, expires, err = s.Extend(ctx, leases, lease, now)
		return err
	})
	return st, expires, err
}

// Release gives back leases a claim took but could not hand over.
func (c *Cluster) Release(ctx context.Context, leases []store.Lease, countAttempt bool, now time.Time) (n int64, err error) {
	err = c.conn.Do(ctx, OpRelease, func(ctx context.Context, s Store) (err error) {
		n, err = s.Release(ctx, leases, countAttempt, now)
		return err
	})
	return n, err
}

// leaseCounter is the store operation LeaseHolders runs: the durable
// leases (retries, and leases written out on expiry or a hand-over). The
// first attempts in flight are in the owners' memory.
type leaseCounter interface {
	LeaseHolders(ctx context.Context, topic, sub string, now time.Time, limit int) ([]store.LeaseHolder, error)
}

var _ leaseCounter = (*store.Store)(nil)

// LeaseHolders lists who holds a subscription's durable leases.
func (c *Cluster) LeaseHolders(ctx context.Context, topic, sub string, now time.Time, limit int) (hs []store.LeaseHolder, err error) {
	err = c.conn.Do(ctx, OpLeaseHolders, func(ctx context.Context, s Store) (err error) {
		lc, ok := s.(leaseCounter)
		if !ok {
			return fmt.Errorf("cluster %s cannot count lease holders", c.name)
		}
		hs, err = lc.LeaseHolders(ctx, topic, sub, now, limit)
		return err
	})
	return hs, err
}

// ListDead lists a subscription's dead letters, newest first.
func (c *Cluster) ListDead(ctx context.Context, topic, sub, errorCode string, before uint64, limit, maxBytes int, now time.Time) (dl []store.DeadLetter, msgs map[uint64]*store.Message, more bool, err error) {
	err = c.conn.Do(ctx, OpListDead, func(ctx context.Context, s Store) (err error) {
		dl, msgs, more, err = s.ListDead(ctx, topic, sub, errorCode, before, limit, maxBytes, now)
		return err
	})
	return dl, msgs, more, err
}

// Redrive makes dead letters ready again.
func (c *Cluster) Redrive(ctx context.Context, req store.RedriveRequest) (n int64, err error) {
	err = c.conn.Do(ctx, OpRedrive, func(ctx context.Context, s Store) (err error) {
		n, err = s.Redrive(ctx, req)
		return err
	})
	return n, err
}

// PurgeDead deletes dead letters (of one error code, or all).
func (c *Cluster) PurgeDead(ctx context.Context, topic, sub, errorCode string) (n int64, err error) {
	err = c.conn.Do(ctx, OpPurgeDead, func(ctx context.Context, s Store) (err error) {
		n, err = s.PurgeDead(ctx, topic, sub, errorCode)
		return err
	})
	return n, err
}

// DeleteDead deletes the dead letters with the given message ids.
func (c *Cluster) DeleteDead(ctx context.Context, topic, sub string, ids []uint64) (n int64, err error) {
	err = c.conn.Do(ctx, OpDeleteDead, func(ctx context.Context, s Store) (err error) {
		n, err = s.DeleteDead(ctx, topic, sub, ids)
		return err
	})
	return n, err
}

// CountDead counts a subscription's dead letters.
func (c *Cluster) CountDead(ctx context.Context, topic, sub string) (n int64, err error) {
	err = c.conn.Do(ctx, OpCountDead, func(ctx context.Context, s Store) (err error) {
		n, err = s.CountDead(ctx, topic, sub)
		return err
	})
	return n, err
}

// DeadByCode counts the dead letters a redrive request names, by error
// code.
func (c *Cluster) DeadByCode(ctx context.Context, req store.RedriveRequest) (m map[string]int64, err error) {
	err = c.conn.Do(ctx, OpDeadByCode, func(ctx context.Context, s Store) (err error) {
		m, err = s.DeadByCode(ctx, req)
		return err
	})
	return m, err
}

// ArchiveDead moves dead letters that died before cutoff into the archive
// table.
func (c *Cluster) ArchiveDead(ctx context.Context, topic, sub string, cutoff, now time.Time) (n int64, err error) {
	err = c.conn.Do(ctx, OpArchiveDead, func(ctx context.Context, s Store) (err error) {
		n, err = s.ArchiveDead(ctx, topic, sub, cutoff, now)
		return err
	})
	return n, err
}

// DropSubscription deletes a subscription's deliveries.
func (c *Cluster) DropSubscription(ctx context.Context, topic, sub string, now time.Time) (n int64, err error) {
	err = c.conn.Do(ctx, OpDropSubscription, func(ctx context.Context, s Store) (err error) {
		n, err = s.DropSubscription(ctx, topic, sub, now)
		return err
	})
	return n, err
}

// Unpark releases every parked delivery of a subscription that is no
// longer ordered.
func (c *Cluster) Unpark(ctx context.Context, topic, sub string, now time.Time) (n int64, err error) {
	err = c.conn.Do(ctx, OpUnpark, func(ctx context.Context, s Store) (err error) {
		n, err = s.Unpark(ctx, topic, sub, now)
		return err
	})
	return n, err
}

// Stats counts the deliveries of every subscription by state.
func (c *Cluster) Stats(ctx context.Context, now time.Time) (st []store.QueueStats, err error) {
	err = c.conn.Do(ctx, OpStats, func(ctx context.Context, s Store) (err error) {
		st, err = s.Stats(ctx, now)
		return err
	})
	return st, err
}

// AppendEvents writes trace events on their own, exactly once per event
// id.
func (c *Cluster) AppendEvents(ctx context.Context, evs []store.Event) error {
	return c.conn.Do(ctx, OpAppendEvents, func(ctx context.Context, s Store) error { return s.AppendEvents(ctx, evs) })
}
