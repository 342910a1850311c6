package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/shardmq/shardmq/cluster/clustertest"
	"github.com/shardmq/shardmq/store"
)

var _ Store = (*clustertest.Store)(nil)

// direct is a Caller that runs every call on s as it is.
type direct struct{ s Store }

func (d direct) Do(ctx context.Context, _ string, fn func(context.Context, Store) error) error {
	return fn(ctx, d.s)
}

// fakeCaller is a call point over a clustertest.Store. While down, every
// call fails unavailable without reaching the store, as an open breaker
// answers. It counts calls by operation.
type fakeCaller struct {
	st   *clustertest.Store
	down atomic.Bool
	mu   sync.Mutex
	ops  map[string]int
}

func newFakeCaller() *fakeCaller {
	return &fakeCaller{st: clustertest.NewStore(), ops: map[string]int{}}
}

func (c *fakeCaller) Do(ctx context.Context, op string, fn func(context.Context, Store) error) error {
	c.mu.Lock()
	c.ops[op]++
	c.mu.Unlock()
	if c.down.Load() {
		return fmt.Errorf("%w: cluster down (test)", store.ErrUnavailable)
	}
	return fn(ctx, c.st)
}

func (c *fakeCaller) calls(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops[op]
}
