package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/store"
)

// Primary is the one call point to a cluster's primary: every store
// operation the router runs on the cluster goes through Do,
// which carries what all of them share — the endpoint's breaker and the
// failover hand-over — so that no operation needs a wrapper of its own.
// The per-cluster latency observation decorates it (Observe).
//
// When a failover names another primary, Retire hands the endpoint over to
// its successor: calls in flight on the old endpoint are cancelled and,
// unless their caller gave up, run once more on the successor; later calls
// (from a request routed just before the switch, or a group committer
// draining its queue) go to the successor directly. A write whose first
// run failed is thus either committed by the successor or answered with
// the error — never reported created without a commit.
type Primary struct {
	s Store
	b *circuit.Breaker

	retireOnce sync.Once
	retired    context.Context // done once retired
	retire     context.CancelFunc
	next       atomic.Pointer[Primary]
}

// NewPrimary guards the primary s with its endpoint's breaker b.
func NewPrimary(s Store, b *circuit.Breaker) *Primary {
	c := &Primary{s: s, b: b}
	c.retired, c.retire = context.WithCancel(context.Background())
	return c
}

// Breaker is the endpoint's breaker.
func (c *Primary) Breaker() *circuit.Breaker { return c.b }

// Do runs fn on the primary through its breaker (bounded by the
// breaker's CallTimeout), following retirement as the type's comment
// says. fn must use the context it is given.
func (c *Primary) Do(ctx context.Context, _ string, fn func(ctx context.Context, s Store) error) error {
	return c.call(ctx, false, fn)
}

// Retire hands the endpoint over to next (nil when its cluster left the
// topology: calls then fail unavailable) and cancels the calls in flight on
// it. Safe to call more than once; the first successor stays.
func (c *Primary) Retire(next *Primary) {
	c.retireOnce.Do(func() {
		if next != nil {
			c.next.Store(next)
		}
		c.retire()
	})
}

// Retired reports whether Retire was called.
func (c *Primary) Retired() bool { return c.retired.Err() != nil }

var errRetired = fmt.Errorf("%w: endpoint retired by a topology change", store.ErrUnavailable)

// call runs fn on the endpoint through its breaker, following retirement.
// retried marks the second run.
func (c *Primary) call(ctx context.Context, retried bool, fn func(ctx context.Context, s Store) error) error {
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
