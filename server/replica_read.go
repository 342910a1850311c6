package server

import (
	"context"
	"time"

	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/lookup"
	"github.com/shardmq/shardmq/store"
)

// replicaRead is a trace or lookup read on a replica through its breaker,
// bounded by HAConfig.ReplicaReadTimeout: the lookup falls back to the
// primary when it fails, so a hung replica must cost little, and its
// timeouts count towards opening its breaker (after which the read goes to
// the primary at once).
type replicaRead struct {
	st      *store.Store
	b       *circuit.Breaker
	timeout time.Duration
}

var _ lookup.Reader = replicaRead{}

func (r replicaRead) Trace(ctx context.Context, topic, key string, now time.Time) (t *store.MessageTrace, err error) {
	err = r.b.DoWithin(ctx, r.timeout, func(ctx context.Context) (err error) { t, err = r.st.Trace(ctx, topic, key, now); return err })
	return t, err
}

func (r replicaRead) MessagesByTransaction(ctx context.Context, txID string, limit int) (m []*store.Message, err error) {
	err = r.b.DoWithin(ctx, r.timeout, func(ctx context.Context) (err error) {
		m, err = r.st.MessagesByTransaction(ctx, txID, limit)
		return err
	})
	return m, err
}

func (r replicaRead) FindTransactions(ctx context.Context, ids []string) (f map[string]int, err error) {
	err = r.b.DoWithin(ctx, r.timeout, func(ctx context.Context) (err error) { f, err = r.st.FindTransactions(ctx, ids); return err })
	return f, err
}

func (r replicaRead) Events(ctx context.Context, ids []uint64) (e []store.Event, err error) {
	err = r.b.DoWithin(ctx, r.timeout, func(ctx context.Context) (err error) { e, err = r.st.Events(ctx, ids); return err })
	return e, err
}
