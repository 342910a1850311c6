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

// Cluster is the one call point to a cluster's primary (broker.Cluster):
// every store operation the broker runs on the cluster goes through Do,
// which carries what all of them share — the endpoint's breaker, the
// failover hand-over and the per-cluster latency observation — so that
// no operation needs a wrapper of its own.
//
// When a failover names another primary, Retire hands the endpoint over to
// its successor: calls in flight on the old endpoint are cancelled and,
// unless their caller gave up, run once more on the successor; later calls
// (from a request routed just before the switch, or a group committer
// draining its queue) go to the successor directly. A write whose first
// run failed is thus either committed by the successor or answered with
// the error — never reported created without a commit.
type Cluster struct {
	s       broker.Store
	b       *Breaker
	observe Observer

	retireOnce sync.Once
	retired    context.Context // done once retired
	retire     context.CancelFunc
	next       atomic.Pointer[Cluster]
}

// Observer is told every call's operation, time and outcome (metrics). The
// time covers the whole call: the breaker, the store's transaction with
// its retries and its wait for a pooled connection, and a run on the
// successor after a hand-over.
type Observer func(op string, took time.Duration, err error)

var _ broker.Cluster = (*Cluster)(nil)

// NewCluster guards the primary s with its endpoint's breaker b; observe
// may be nil.
func NewCluster(s broker.Store, b *Breaker, observe Observer) *Cluster {
	c := &Cluster{s: s, b: b, observe: observe}
	c.retired, c.retire = context.WithCancel(context.Background())
	return c
}

// Breaker is the endpoint's breaker.
func (c *Cluster) Breaker() *Breaker { return c.b }

// Do implements broker.Cluster: it runs fn on the primary through its
// breaker (bounded by the breaker's CallTimeout), following retirement as
// the type's comment says, and reports the call to the observer. fn must
// use the context it is given.
func (c *Cluster) Do(ctx context.Context, op string, fn func(ctx context.Context, s broker.Store) error) error {
	start := time.Now()
	err := c.call(ctx, false, fn)
	if c.observe != nil {
		c.observe(op, time.Since(start), err)
	}
	return err
}

// Retire hands the endpoint over to next (nil when its cluster left the
// topology: calls then fail unavailable) and cancels the calls in flight on
// it. Safe to call more than once; the first successor stays.
func (c *Cluster) Retire(next *Cluster) {
	c.retireOnce.Do(func() {
		if next != nil {
			c.next.Store(next)
		}
		c.retire()
	})
}

// Retired reports whether Retire was called.
func (c *Cluster) Retired() bool { return c.retired.Err() != nil }

var errRetired = fmt.Errorf("%w: endpoint retired by a topology change", store.ErrUnavailable)

// call runs fn on the endpoint through its breaker, following retirement.
// retried marks the second run.
func (c *Cluster) call(ctx context.Context, retried bool, fn func(ctx context.Context, s broker.Store) error) error {
	if c.Retired() {
		next := c.next.Load()
		if next == nil {
			return errRetired
		}
		return next.call(ctx, retried, fn)
	}
	err := c.b.Do(ctx, func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(c.retired, cancel)
		defer stop()
		return fn(ctx, c.s)
	})
	if err == nil || retried || ctx.Err() != nil || !c.Retired() {
		return err
	}
	if !errors.Is(err, store.ErrUnavailable) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	next := c.next.Load()
	if next == nil {
		return err
	}
	return next.call(ctx, true, fn)
}

// Endpoint is the call point of one endpoint that has no failover of its
// own — a replica, or a primary's reads for trace lookups and
// reconciliation: fn runs on S through the endpoint's breaker, bounded by
// Timeout (zero: the breaker's CallTimeout).
type Endpoint[S any] struct {
	S       S
	Breaker *Breaker
	Timeout time.Duration
}

// Do runs fn on e.S through the breaker. fn must use the context it is
// given.
func (e Endpoint[S]) Do(ctx context.Context, fn func(ctx context.Context, s S) error) error {
	return e.Breaker.DoWithin(ctx, e.Timeout, func(ctx context.Context) error { return fn(ctx, e.S) })
}
