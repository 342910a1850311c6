package circuit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/store"
)

// Shard is one primary endpoint's broker.Shard behind its breaker. When a
// failover names another primary, Retire hands the endpoint over to its
// successor: calls in flight on the old endpoint are cancelled and, unless
// their caller gave up, run once more on the successor; later calls (from a
// request routed just before the switch, or a group committer draining its
// queue) go to the successor directly. A write whose first run failed is
// thus either committed by the successor or answered with the error —
// never reported created without a commit.
//
// Every operation of broker.Shard goes through the breaker; the embedded
// Shard is the endpoint itself.
type Shard struct {
	broker.Shard
	b *Breaker

	retireOnce sync.Once
	retired    context.Context // done once retired
	retire     context.CancelFunc
	next       atomic.Pointer[Shard]
}

var _ broker.Shard = (*Shard)(nil)

// NewShard guards s with b.
func NewShard(s broker.Shard, b *Breaker) *Shard {
	sh := &Shard{Shard: s, b: b}
	sh.retired, sh.retire = context.WithCancel(context.Background())
	return sh
}

// Breaker is the endpoint's breaker.
func (s *Shard) Breaker() *Breaker { return s.b }

// Retire hands the endpoint over to next (nil when its cluster left the
// topology: calls then fail unavailable) and cancels the calls in flight on
// it. Safe to call more than once; the first successor stays.
func (s *Shard) Retire(next *Shard) {
	s.retireOnce.Do(func() {
		if next != nil {
			s.next.Store(next)
		}
		s.retire()
	})
}

// Retired reports whether Retire was called.
func (s *Shard) Retired() bool { return s.retired.Err() != nil }

var errRetired = fmt.Errorf("%w: endpoint retired by a topology change", store.ErrUnavailable)

// call runs op on the endpoint through its breaker, following retirement as
// the type's comment says. retried marks the second run.
func (s *Shard) call(ctx context.Context, retried bool, op func(ctx context.Context, sh broker.Shard) error) error {
	if s.Retired() {
		next := s.next.Load()
		if next == nil {
			return errRetired
		}
		return next.call(ctx, retried, op)
	}
	err := s.b.Do(ctx, func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(s.retired, cancel)
		defer stop()
		return op(ctx, s.Shard)
	})
	if err == nil || retried || ctx.Err() != nil || !s.Retired() {
		return err
	}
	if !errors.Is(err, store.ErrUnavailable) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	next := s.next.Load()
	if next == nil {
		return err
	}
	return next.call(ctx, true, op)
}

// Produce implements broker.Shard.
func (s *Shard) Produce(ctx context.Context, items []store.ProduceItem) (out []store.ProduceResult, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Shard) (err error) {
		out, err = sh.Produce(ctx, items)
		return err
	})
	return out, err
}

// Claim implements broker.Shard.
func (s *Shard) Claim(ctx context.Context, req store.ClaimRequest) (out []store.Claimed, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Shard) (err error) {
		out, err = sh.Claim(ctx, req)
		return err
	})
	return out, err
}

// Ack implements broker.Shard.
func (s *Shard) Ack(ctx context.Context, leases []store.Lease, now time.Time) (out []store.LeaseStatus, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Shard) (err error) {
		out, err = sh.Ack(ctx, leases, now)
		return err
	})
	return out, err
}

// Nack implements broker.Shard.
func (s *Shard) Nack(ctx context.Context, items []store.NackItem, policy func(topic, sub string) store.RetryPolicy, rnd func() float64, now time.Time) (out []store.NackResult, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Shard) (err error) {
		out, err = sh.Nack(ctx, items, policy, rnd, now)
		return err
	})
	return out, err
}

// Extend implements broker.Shard.
func (s *Shard) Extend(ctx context.Context, leases []store.Lease, lease time.Duration, now time.Time) (out []store.LeaseStatus, exp time.Time, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Shard) (err error) {
		out, exp, err = sh.Extend(ctx, leases, lease, now)
		return err
	})
	return out, exp, err
}

// ClaimMany implements broker.Shard.
func (s *Shard) ClaimMany(ctx context.Context, reqs []store.ClaimRequest) (out [][]store.Claimed, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Shard) (err error) {
		out, err = sh.ClaimMany(ctx, reqs)
		return err
	})
	return out, err
}

// Release implements broker.Shard.
func (s *Shard) Release(ctx context.Context, leases []store.Lease, countAttempt bool, now time.Time) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Shard) (int64, error) {
		return sh.Release(ctx, leases, countAttempt, now)
	})
}

// ListDead implements broker.Shard.
func (s *Shard) ListDead(ctx context.Context, topic, sub, errorCode string, before uint64, limit int, now time.Time) (out []store.DeadLetter, msgs map[uint64]*store.Message, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Shard) (err error) {
		out, msgs, err = sh.ListDead(ctx, topic, sub, errorCode, before, limit, now)
		return err
	})
	return out, msgs, err
}

// count runs one of the dead-letter and subscription upkeep operations,
// which all answer a count, through the breaker.
func (s *Shard) count(ctx context.Context, op func(ctx context.Context, sh broker.Shard) (int64, error)) (n int64, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Shard) (err error) {
		n, err = op(ctx, sh)
		return err
	})
	return n, err
}

// Redrive implements broker.Shard.
func (s *Shard) Redrive(ctx context.Context, req store.RedriveRequest) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Shard) (int64, error) { return sh.Redrive(ctx, req) })
}

// PurgeDead implements broker.Shard.
func (s *Shard) PurgeDead(ctx context.Context, topic, sub, errorCode string) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Shard) (int64, error) {
		return sh.PurgeDead(ctx, topic, sub, errorCode)
	})
}

// CountDead implements broker.Shard.
func (s *Shard) CountDead(ctx context.Context, topic, sub string) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Shard) (int64, error) { return sh.CountDead(ctx, topic, sub) })
}

// DeadByCode implements broker.Shard.
func (s *Shard) DeadByCode(ctx context.Context, req store.RedriveRequest) (out map[string]int64, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Shard) (err error) {
		out, err = sh.DeadByCode(ctx, req)
		return err
	})
	return out, err
}

// ArchiveDead implements broker.Shard.
func (s *Shard) ArchiveDead(ctx context.Context, topic, sub string, cutoff, now time.Time) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Shard) (int64, error) {
		return sh.ArchiveDead(ctx, topic, sub, cutoff, now)
	})
}

// DropSubscription implements broker.Shard.
func (s *Shard) DropSubscription(ctx context.Context, topic, sub string, now time.Time) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Shard) (int64, error) {
		return sh.DropSubscription(ctx, topic, sub, now)
	})
}

// Unpark implements broker.Shard.
func (s *Shard) Unpark(ctx context.Context, topic, sub string, now time.Time) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Shard) (int64, error) { return sh.Unpark(ctx, topic, sub, now) })
}

// Stats implements broker.Shard.
func (s *Shard) Stats(ctx context.Context, now time.Time) (out []store.QueueStats, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Shard) (err error) {
		out, err = sh.Stats(ctx, now)
		return err
	})
	return out, err
}

// AppendEvents implements broker.Shard.
func (s *Shard) AppendEvents(ctx context.Context, evs []store.Event) error {
	return s.call(ctx, false, func(ctx context.Context, sh broker.Shard) error { return sh.AppendEvents(ctx, evs) })
}
