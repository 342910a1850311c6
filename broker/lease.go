package broker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/shardmq/shardmq/delivery"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/reqid"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

// LeaseResult is one ack's or extend's outcome.
type LeaseResult struct {
	Status  domain.LeaseStatus
	Expires time.Time
	Err     error
}

// orderedNow marks leases whose subscription is ordered now, whatever it
// was when they were taken: finishing them must release the next delivery
// of their key even across a switch to ordered.
func (b *Broker) orderedNow(ctx context.Context, receipts []Receipt) {
	for i := range receipts {
		r := &receipts[i]
		if s, ok, err := b.subs.Get(ctx, r.Topic, r.Subscription); err == nil && ok && s.Ordered {
			r.Ordered = true
		}
	}
}

// Ack completes deliveries: each receipt goes to the owner of its unit —
// this router's, or another router's (forwarded) — which acks a lease it
// holds in memory in its cluster's next flush; a durable lease (a retry,
// or one written to the table on expiry or hand-over) is acked in the
// table, in one transaction per cluster shared with the other acks that
// reach it meanwhile (cluster/ack.go).
func (b *Broker) Ack(ctx context.Context, receipts []Receipt) []LeaseResult {
	return b.ack(ctx, receipts, true)
}

// AckHere acks receipts another router forwarded: on the owners here and,
// for what they do not hold in memory, in the table; never forwarded
// again (a unit owned elsewhere answers unavailable: the sender reads the
// owner records again and the client retries).
func (b *Broker) AckHere(ctx context.Context, receipts []Receipt) []LeaseResult {
	return b.ack(ctx, receipts, false)
}

func (b *Broker) ack(ctx context.Context, receipts []Receipt, forward bool) []LeaseResult {
	b.orderedNow(ctx, receipts)
	out := make([]LeaseResult, len(receipts))
	rid := reqid.From(ctx)
	errs := b.dispatch(ctx, receiptVShards(receipts), nil, func(ctx context.Context, name string, cs *clusterConn, idx []int, _ func() func()) {
		durable := b.ownedOps(ctx, name, receipts, idx, forward,
			func(o *delivery.Owner, ids []int) []delivery.Outcome { return o.Ack(ctx, ops(receipts, ids, rid, nil)) },
			func(addr string, ids []int) error {
				res, err := b.peer.Ack(ctx, addr, pick(receipts, ids))
				for j, i := range ids {
					if err == nil {
						out[i] = res[j]
					}
				}
				return err
			},
			func(i int, oc delivery.Outcome) { out[i] = LeaseResult{Status: oc.Status, Err: oc.Err} })
		if len(durable) == 0 {
			return
		}
		leases := make([]store.Lease, len(durable))
		for j, i := range durable {
			leases[j] = receipts[i].Lease
		}
		// Shared with the other acks that reach the cluster meanwhile
		// (cluster/ack.go).
		st, err := cs.conn.Ack(ctx, leases, b.now().UTC())
		for j, i := range durable {
			if err != nil {
				out[i] = LeaseResult{Status: domain.LeaseUnavailable, Err: fmt.Errorf("cluster %s: %w", name, err)}
				continue
			}
			out[i] = LeaseResult{Status: st[j]}
		}
	})
	for i, err := range errs {
		if err != nil {
			out[i] = LeaseResult{Status: domain.LeaseUnavailable, Err: err}
		}
	}
	return out
}

// Extend moves the leases' expiry to now + lease: in the owner's memory
// for a lease held there (nothing is written), in the table for a durable
// one.
func (b *Broker) Extend(ctx context.Context, receipts []Receipt, lease time.Duration) []LeaseResult {
	return b.extend(ctx, receipts, lease, true)
}

// ExtendHere is Extend for receipts another router forwarded (see AckHere).
func (b *Broker) ExtendHere(ctx context.Context, receipts []Receipt, lease time.Duration) []LeaseResult {
	return b.extend(ctx, receipts, lease, false)
}

func (b *Broker) extend(ctx context.Context, receipts []Receipt, lease time.Duration, forward bool) []LeaseResult {
	out := make([]LeaseResult, len(receipts))
	errs := b.dispatch(ctx, receiptVShards(receipts), nil, func(ctx context.Context, name string, cs *clusterConn, idx []int, _ func() func()) {
		durable := b.ownedOps(ctx, name, receipts, idx, forward,
			func(o *delivery.Owner, ids []int) []delivery.Outcome {
				return o.Extend(ctx, ops(receipts, ids, "", nil), lease)
			},
			func(addr string, ids []int) error {
				res, err := b.peer.Extend(ctx, addr, pick(receipts, ids), lease)
				for j, i := range ids {
					if err == nil {
						out[i] = res[j]
					}
				}
				return err
			},
			func(i int, oc delivery.Outcome) {
				out[i] = LeaseResult{Status: oc.Status, Expires: oc.Expires, Err: oc.Err}
			})
		if len(durable) == 0 {
			return
		}
		leases := make([]store.Lease, len(durable))
		for j, i := range durable {
			leases[j] = receipts[i].Lease
		}
		st, exp, err := cs.conn.Extend(ctx, leases, lease, b.now().UTC())
		for j, i := range durable {
			if err != nil {
				out[i] = LeaseResult{Status: domain.LeaseUnavailable, Err: fmt.Errorf("cluster %s: %w", name, err)}
				continue
			}
			out[i] = LeaseResult{Status: st[j]}
			if st[j] == store.LeaseOK {
				out[i].Expires = exp
			}
		}
	})
	for i, err := range errs {
		if err != nil {
			out[i] = LeaseResult{Status: domain.LeaseUnavailable, Err: err}
		}
	}
	return out
}

// NackItem is one failed delivery.
type NackItem struct {
	Receipt    Receipt
	ErrorCode  string
	Error      string
	RetryAfter time.Duration // 0: the subscription's backoff, unless RetryNow
	RetryNow   bool          // ready again at once (retry_after_ms 0)
}

// NackResult is one nack's outcome.
type NackResult struct {
	Status        domain.NackStatus
	NextAttemptAt time.Time
	Err           error
}

// Nack fails deliveries: retried with the subscription's backoff, or dead
// at its max attempts. A lease held in an owner's memory is failed in its
// cluster's next flush, a durable one in the table.
func (b *Broker) Nack(ctx context.Context, items []NackItem) []NackResult {
	return b.nack(ctx, items, true)
}

// NackHere is Nack for items another router forwarded (see AckHere).
func (b *Broker) NackHere(ctx context.Context, items []NackItem) []NackResult {
	return b.nack(ctx, items, false)
}

func (b *Broker) nack(ctx context.Context, items []NackItem, forward bool) []NackResult {
	receipts := make([]Receipt, len(items))
	for i, it := range items {
		receipts[i] = it.Receipt
	}
	b.orderedNow(ctx, receipts)
	for i := range items {
		items[i].Receipt = receipts[i]
	}
	out := make([]NackResult, len(items))
	policy := func(topic, sub string) store.RetryPolicy { return b.nackPolicy(ctx, topic, sub) }
	rid := reqid.From(ctx)
	errs := b.dispatch(ctx, receiptVShards(receipts), nil, func(ctx context.Context, name string, cs *clusterConn, idx []int, _ func() func()) {
		durable := b.ownedOps(ctx, name, receipts, idx, forward,
			func(o *delivery.Owner, ids []int) []delivery.Outcome {
				u := o.Unit()
				return o.Nack(ctx, ops(receipts, ids, rid, items), func() store.RetryPolicy { return policy(u.Topic, u.Subscription) }, rand.Float64)
			},
			func(addr string, ids []int) error {
				fwd := make([]NackItem, len(ids))
				for j, i := range ids {
					fwd[j] = items[i]
				}
				res, err := b.peer.Nack(ctx, addr, fwd)
				for j, i := range ids {
					if err == nil {
						out[i] = res[j]
					}
				}
				return err
			},
			func(i int, oc delivery.Outcome) {
				out[i] = NackResult{Status: oc.NackStatus, NextAttemptAt: oc.NextAttemptAt, Err: oc.Err}
			})
		if len(durable) == 0 {
			return
		}
		batch := make([]store.NackItem, len(durable))
		for j, i := range durable {
			it := items[i]
			batch[j] = store.NackItem{Lease: it.Receipt.Lease, ErrorCode: it.ErrorCode, Error: it.Error, RetryAfter: it.RetryAfter,
				RetryNow: it.RetryNow}
		}
		res, err := cs.conn.Nack(ctx, batch, policy, rand.Float64, b.now().UTC())
		for j, i := range durable {
			if err != nil {
				out[i] = NackResult{Status: domain.NackUnavailable, Err: fmt.Errorf("cluster %s: %w", name, err)}
				continue
			}
			out[i] = NackResult{Status: res[j].Status, NextAttemptAt: res[j].NextAttemptAt}
		}
	})
	for i, err := range errs {
		if err != nil {
			out[i] = NackResult{Status: domain.NackUnavailable, Err: err}
		}
	}
	return out
}

func receiptVShards(receipts []Receipt) []shard.ID {
	vs := make([]shard.ID, len(receipts))
	for i, r := range receipts {
		vs[i] = r.VShard
	}
	return vs
}
