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

// Cluster is one primary endpoint's broker.Store behind its breaker. When a
// failover names another primary, Retire hands the endpoint over to its
// successor: calls in flight on the old endpoint are cancelled and, unless
// their caller gave up, run once more on the successor; later calls (from a
// request routed just before the switch, or a group committer draining its
// queue) go to the successor directly. A write whose first run failed is
// thus either committed by the successor or answered with the error —
// never reported created without a commit.
//
// Every operation of broker.Store goes through the breaker; the embedded
// Store is the endpoint itself.
type Cluster struct {
	broker.Store
	b *Breaker

	retireOnce sync.Once
	retired    context.Context // done once retired
	retire     context.CancelFunc
	next       atomic.Pointer[Cluster]
}

var _ broker.Store = (*Cluster)(nil)

// NewCluster guards s with b.
func NewCluster(s broker.Store, b *Breaker) *Cluster {
	sh := &Cluster{Store: s, b: b}
	sh.retired, sh.retire = context.WithCancel(context.Background())
	return sh
}

// Breaker is the endpoint's breaker.
func (s *Cluster) Breaker() *Breaker { return s.b }

// Retire hands the endpoint over to next (nil when its cluster left the
// topology: calls then fail unavailable) and cancels the calls in flight on
// it. Safe to call more than once; the first successor stays.
func (s *Cluster) Retire(next *Cluster) {
	s.retireOnce.Do(func() {
		if next != nil {
			s.next.Store(next)
		}
		s.retire()
	})
}

// Retired reports whether Retire was called.
func (s *Cluster) Retired() bool { return s.retired.Err() != nil }

var errRetired = fmt.Errorf("%w: endpoint retired by a topology change", store.ErrUnavailable)

// call runs op on the endpoint through its breaker, following retirement as
// the type's comment says. retried marks the second run.
func (s *Cluster) call(ctx context.Context, retried bool, op func(ctx context.Context, sh broker.Store) error) error {
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
		return op(ctx, s.Store)
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

// Produce implements broker.Store.
func (s *Cluster) Produce(ctx context.Context, items []store.ProduceItem) (out []store.ProduceResult, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Store) (err error) {
		out, err = sh.Produce(ctx, items)
		return err
	})
	return out, err
}

// Claim implements broker.Store.
func (s *Cluster) Claim(ctx context.Context, req store.ClaimRequest) (out []store.Claimed, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Store) (err error) {
		out, err = sh.Claim(ctx, req)
		return err
	})
	return out, err
}

// Ack implements broker.Store.
func (s *Cluster) Ack(ctx context.Context, leases []store.Lease, now time.Time) (out []store.LeaseStatus, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Store) (err error) {
		out, err = sh.Ack(ctx, leases, now)
		return err
	})
	return out, err
}

// Nack implements broker.Store.
func (s *Cluster) Nack(ctx context.Context, items []store.NackItem, policy func(topic, sub string) store.RetryPolicy, rnd func() float64, now time.Time) (out []store.NackResult, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Store) (err error) {
		out, err = sh.Nack(ctx, items, policy, rnd, now)
		return err
	})
	return out, err
}

// Extend implements broker.Store.
func (s *Cluster) Extend(ctx context.Context, leases []store.Lease, lease time.Duration, now time.Time) (out []store.LeaseStatus, exp time.Time, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Store) (err error) {
		out, exp, err = sh.Extend(ctx, leases, lease, now)
		return err
	})
	return out, exp, err
}

// ClaimMany implements broker.Store.
func (s *Cluster) ClaimMany(ctx context.Context, reqs []store.ClaimRequest) (out [][]store.Claimed, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Store) (err error) {
		out, err = sh.ClaimMany(ctx, reqs)
		return err
	})
	return out, err
}

// Release implements broker.Store.
func (s *Cluster) Release(ctx context.Context, leases []store.Lease, countAttempt bool, now time.Time) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Store) (int64, error) {
		return sh.Release(ctx, leases, countAttempt, now)
	})
}

// ListDead implements broker.Store.
func (s *Cluster) ListDead(ctx context.Context, topic, sub, errorCode string, before uint64, limit int, now time.Time) (out []store.DeadLetter, msgs map[uint64]*store.Message, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Store) (err error) {
		out, msgs, err = sh.ListDead(ctx, topic, sub, errorCode, before, limit, now)
		return err
	})
	return out, msgs, err
}

// count runs one of the dead-letter and subscription upkeep operations,
// which all answer a count, through the breaker.
func (s *Cluster) count(ctx context.Context, op func(ctx context.Context, sh broker.Store) (int64, error)) (n int64, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Store) (err error) {
		n, err = op(ctx, sh)
		return err
	})
	return n, err
}

// Redrive implements broker.Store.
func (s *Cluster) Redrive(ctx context.Context, req store.RedriveRequest) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Store) (int64, error) { return sh.Redrive(ctx, req) })
}

// PurgeDead implements broker.Store.
func (s *Cluster) PurgeDead(ctx context.Context, topic, sub, errorCode string) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Store) (int64, error) {
		return sh.PurgeDead(ctx, topic, sub, errorCode)
	})
}

// CountDead implements broker.Store.
func (s *Cluster) CountDead(ctx context.Context, topic, sub string) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Store) (int64, error) { return sh.CountDead(ctx, topic, sub) })
}

// ArchiveDead implements broker.Store.
func (s *Cluster) ArchiveDead(ctx context.Context, topic, sub string, cutoff, now time.Time) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Store) (int64, error) {
		return sh.ArchiveDead(ctx, topic, sub, cutoff, now)
	})
}

// DropSubscription implements broker.Store.
func (s *Cluster) DropSubscription(ctx context.Context, topic, sub string, now time.Time) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Store) (int64, error) {
		return sh.DropSubscription(ctx, topic, sub, now)
	})
}

// Unpark implements broker.Store.
func (s *Cluster) Unpark(ctx context.Context, topic, sub string, now time.Time) (int64, error) {
	return s.count(ctx, func(ctx context.Context, sh broker.Store) (int64, error) { return sh.Unpark(ctx, topic, sub, now) })
}

// Stats implements broker.Store.
func (s *Cluster) Stats(ctx context.Context, now time.Time) (out []store.QueueStats, err error) {
	err = s.call(ctx, false, func(ctx context.Context, sh broker.Store) (err error) {
		out, err = sh.Stats(ctx, now)
		return err
	})
	return out, err
}

// AppendEvents implements broker.Store.
func (s *Cluster) AppendEvents(ctx context.Context, evs []store.Event) error {
	return s.call(ctx, false, func(ctx context.Context, sh broker.Store) error { return sh.AppendEvents(ctx, evs) })
}
